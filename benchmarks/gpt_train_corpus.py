"""Train the issue's character GPT (4 layers, d=128, 4 heads, context 128) on the embedded corpus for a
fixed wall time, and print the validation loss and perplexity it reaches, its speed, and a sample.

    python benchmarks/gpt_train_corpus.py [--minutes 10] [--form flash|materialized] [--batch 32]

The validation loss is measured on the whole held-out tenth of the corpus (task.evaluate) at each
epoch's end and when the time is up; every line states the machine.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import renaissance_nb as rnb  # noqa: E402
from machine import machine_line  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--form", default="flash")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    args = ap.parse_args()
    from renaissance_nb.kernels import blas
    data = rnb.datasets.default_text(context=128)
    task = (rnb.DeepLearningTask("char-gpt").model(rnb.gpt(data.num_classes, 128, 4, 4, 128, attention_form=args.form))
            .data(data, batch_size=args.batch).optimizer(rnb.AdamW(lr=args.lr, weight_decay=0.1).decay("matrices"))
            .total_epochs(100).seed(0))
    print(f"machine: {machine_line()}; products: {blas.SGEMM.name if blas.THREADED else 'np.matmul'}")
    print(f"model: gpt(65, 128, 4 layers, 4 heads, context 128), attention {args.form}, AdamW(lr={args.lr}, wd 0.1, "
          f"decay='matrices'), batch {args.batch}; data {data}")
    t0 = time.perf_counter()
    task.compile()
    print(f"compile: {time.perf_counter() - t0:.1f} s; arena {task.arena_bytes / 2**20:.1f} MiB")
    deadline = time.perf_counter() + 60 * args.minutes

    def time_limit(kind: str, info: object) -> None:
        if kind == "step" and time.perf_counter() > deadline:
            raise rnb.StopTraining(f"time is up ({args.minutes:g} min)")

    started = time.perf_counter()
    task.run(callbacks=[time_limit], progress=True)
    spent = time.perf_counter() - started
    steps = int(task.read("step")[0])
    val = task.evaluate(data.val.x, data.val.y)
    for r in task.result.history:
        print("  " + r.line())
    print(f"{steps} steps in {spent:.0f} s ({1e3 * spent / max(steps, 1):.0f} ms/step, first step included); "
          f"validation loss {val['loss']:.3f} per character, perplexity {val['perplexity']:.2f} "
          f"(uniform: {math.log(data.num_classes):.3f}), next-character accuracy {val['top1']:.1%}")
    print("sample (temperature 0.8, top_k 10, seed 0):")
    print(task.generate("ROMEO:\n", 300, temperature=0.8, top_k=10, seed=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
