"""Side-by-side CPU benchmark of the small character GPT (issue 35): renaissance_nb (materialised and
flash attention) against the same model in PyTorch eager (F.scaled_dot_product_attention) and
torch.compile, AdamW, batch 32 windows of the embedded corpus; then memory: our planned arena against
PyTorch's peak resident growth, and the flash arena against the materialised one at T = 128, 256, 512.

    python benchmarks/gpt_cpu.py [--layers 4] [--d 128] [--heads 4] [--context 128] [--batch 32]
                                 [--steps 20] [--rounds 3] [--no-compile] [--no-memory]

Same harness as mlp_cpu.py: each contender in its own process, an "epoch" of ``--steps`` steps each
in turn (interleaved), medians over the rounds; compile times apart. The model is minGPT's: token and
position embeddings, pre-norm blocks (layernorm, causal attention, GELU MLP), a bias-free head.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from machine import machine_line  # noqa: E402
from mlp_cpu import TorchContender, peak_rss_child, print_memory, run_isolated  # noqa: E402

SHAPE = {"layers": 4, "d": 128, "heads": 4, "context": 128}
"""The model (overridden by the command line through the environment, so worker processes see it)."""


def _shape() -> dict[str, int]:
    return {k: int(os.environ.get(f"RNB_GPT_{k.upper()}", v)) for k, v in SHAPE.items()}


def load(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first n training windows of the embedded corpus at the benchmark's context."""
    import renaissance_nb as rnb
    data = rnb.datasets.default_text(context=_shape()["context"])
    return data.train.x[:n], data.train.y[:n]


class Ours:
    def __init__(self, x: np.ndarray, y: np.ndarray, batch: int, form: str, recompute: bool = False) -> None:
        import renaissance_nb as rnb
        from renaissance_nb.data.arrays import DataSplits, Dataset
        s = _shape()
        self.name = f"renaissance_nb ({form}{', recompute' if recompute else ''})"
        t = time.perf_counter()
        splits = DataSplits(Dataset(x, y, 65, "corpus"), None, "corpus")
        self.task = (rnb.DeepLearningTask("gpt").model(rnb.gpt(65, s["d"], s["layers"], s["heads"], s["context"],
                                                                 attention_form=form))
                     .data(splits, batch_size=batch).optimizer(rnb.AdamW(lr=1e-3)).total_epochs(1000).seed(0)
                     .options(recompute=recompute))
        self.task.compile()
        self.compile_s = time.perf_counter() - t
        self.epoch()

    def epoch(self) -> float:
        t = time.perf_counter()
        self.task.run(epochs=1, progress=False)
        return time.perf_counter() - t


class TorchGPT(TorchContender):
    """The same GPT in PyTorch (tests/gpt_helpers.py, float32): AdamW, the mean cross entropy over every
    position; eager, or torch.compile with its compile time apart (mlp_cpu.py's harness)."""

    NAMES = {"eager": "PyTorch eager", "compile": "torch.compile"}

    def __init__(self, x: np.ndarray, y: np.ndarray, batch: int, mode: str) -> None:
        import torch
        from tests.gpt_helpers import torch_gpt
        s = _shape()
        torch.manual_seed(0)
        model = torch_gpt(65, s["d"], s["layers"], s["heads"], s["context"]).float()
        super().__init__(model, x.astype(np.int64), y, batch, "eager" if mode == "eager" else mode)

    def _step(self, xb, yb) -> None:  # type: ignore[no-untyped-def]
        self.opt.zero_grad(set_to_none=True)
        logits = self.forward(xb)
        self.torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), yb.reshape(-1)).backward()
        self.opt.step()


def make_contender(kind: str, batch: int, samples: int, data=None):  # type: ignore[no-untyped-def]
    x, y = data if data is not None else load(samples)
    if kind == "ours":
        return Ours(x, y, batch, "materialized")
    if kind == "ours_flash":
        return Ours(x, y, batch, "flash")
    if kind == "ours_recompute":
        return Ours(x, y, batch, "flash", recompute=True)
    return TorchGPT(x, y, batch, kind)


def arena_table(batch: int, contexts: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(T, materialised arena, flash arena) planned by the memory inspector (nothing allocated)."""
    import renaissance_nb as rnb
    from renaissance_nb.inspector.planview import MemoryInspector
    s = _shape()
    x, y = load(batch * 2)
    from renaissance_nb.data.arrays import DataSplits, Dataset
    task = (rnb.DeepLearningTask().model(rnb.gpt(65, s["d"], s["layers"], s["heads"], s["context"]))
            .data(DataSplits(Dataset(x, y, 65, "corpus"), None, "corpus"), batch_size=batch)
            .optimizer(rnb.AdamW()))
    task.lock_memory()
    m = MemoryInspector.of(task)
    return [(t, m.what_if(context=t).arena_bytes, m.what_if(context=t, attention="flash").arena_bytes)
            for t in contexts]


def print_step_times(r: dict) -> None:
    """Each contender's median step, then ours against each PyTorch contender (below 1: ours is faster)."""
    med = r["median_epoch_s"]
    for name, t in med.items():
        print(f"  {name:<32} {1e3 * t / r['steps']:8.1f} ms/step   compile {r['compile_s'][name]:.1f} s")
    for ours in (n for n in med if n.startswith("renaissance_nb")):
        for theirs in (n for n in med if not n.startswith("renaissance_nb")):
            print(f"  {ours} / {theirs}: {med[ours] / med[theirs]:.2f}x")


def main() -> int:
    ap = argparse.ArgumentParser()
    for k, v in SHAPE.items():
        ap.add_argument(f"--{k}", type=int, default=v)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-memory", action="store_true")
    args = ap.parse_args()
    for k in SHAPE:
        os.environ[f"RNB_GPT_{k.upper()}"] = str(getattr(args, k))
    try:
        import torch
        torch.set_num_threads(os.cpu_count() or 1)
        have_torch, tver = True, torch.__version__
    except ImportError:
        have_torch, tver = False, "not installed"
    from threadpoolctl import threadpool_info
    blas = ", ".join(f"{i['internal_api']} {i.get('version')} x{i['num_threads']}" for i in threadpool_info())
    samples = args.batch * args.steps
    s = _shape()
    print(f"machine: {machine_line()}; numpy {np.__version__} ({blas}); torch {tver}")
    print(f"model: gpt(vocab 65, d {s['d']}, {s['layers']} layers, {s['heads']} heads, context {s['context']}), "
          f"AdamW, batch {args.batch}; {args.steps} steps per round, {args.rounds} interleaved rounds, "
          "each contender in its own process")
    kinds = ["ours", "ours_flash", "ours_recompute"] + ((["eager"] + ([] if args.no_compile else ["compile"])) if have_torch else [])
    r = run_isolated(args.batch, samples, args.rounds, have_torch, not args.no_compile, 0, module="gpt_cpu",
                     kinds=kinds)
    print_step_times(r)
    for line in r["skipped"]:
        print(f"  skipped: {line}")
    if not args.no_memory:
        mem = {"ours (materialized)": peak_rss_child("ours", args.batch, samples, module="gpt_cpu"),
               "ours (flash)": peak_rss_child("ours_flash", args.batch, samples, module="gpt_cpu"),
               "ours (flash, recompute)": peak_rss_child("ours_recompute", args.batch, samples, module="gpt_cpu")}
        if have_torch:
            mem["PyTorch eager"] = peak_rss_child("eager", args.batch, samples, module="gpt_cpu")
        print_memory(mem, args.batch)
        print(f"\nplanned arena, materialised against flash attention (batch {args.batch}; memory inspector, "
              "nothing allocated):")
        for t, mat, fl in arena_table(args.batch, (128, 256, 512)):
            print(f"  T = {t:4d}: materialized {mat / 2**20:8.1f} MiB   flash {fl / 2**20:8.1f} MiB   "
                  f"flash/materialized = {fl / mat:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
