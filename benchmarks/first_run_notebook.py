"""A notebook's first run after an install: compile(), a pause while the user reads the dashboard, run().

    python benchmarks/first_run_notebook.py [--rounds 3] [--pause 20]

Fresh processes with an empty numba cache each, the seed MLP of ``python -m renaissance_nb train``
(embedded 5,000 digits, one epoch): with the warm-up helper (runtime/warmup.py: kernels compiled on
a second core after compile()) and with ``RNB_WARMUP=0``, in alternating order. Printed: the machine,
each run's first training step (where the kernels are compiled or loaded) and its whole run(), then
medians. The pause stands for reading the plan and the widgets between two cells.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import machine_line  # benchmarks/machine.py

ROOT = Path(__file__).resolve().parents[1]
JOB = """
import argparse, json, sys, time
from renaissance_nb.__main__ import build_task
args = argparse.Namespace(mnist=None, download=False, batch_size=128, lr=1e-3, epochs=1, seed=0, device="cpu")
task = build_task(args)
task.compile()
time.sleep(float(sys.argv[1]))
t = time.perf_counter()
result = task.run(progress=False)
print(json.dumps({"first_step": result.history[0].first_step_seconds, "run": time.perf_counter() - t}))
"""


def one(pause: float, cache: str, helper: bool) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NUMBA_CACHE_DIR": cache, "RNB_WARMUP": "1" if helper else "0"}
    out = subprocess.run([sys.executable, "-c", JOB, str(pause)], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pause", type=float, default=20.0)
    args = ap.parse_args()
    print(machine_line())
    got: dict[str, list[dict[str, float]]] = {"helper": [], "no helper": []}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.rounds):
            order = ["helper", "no helper"] if k % 2 == 0 else ["no helper", "helper"]
            for name in order:
                r = one(args.pause, os.path.join(tmp, f"{name.replace(' ', '')}{k}"), name == "helper")
                got[name].append(r)
                print(f"round {k + 1}: {name:9}  first step {r['first_step']:6.2f} s   run() {r['run']:6.2f} s",
                      flush=True)
    for name, rs in got.items():
        first, run = [r["first_step"] for r in rs], [r["run"] for r in rs]
        print(f"{name:9}  first step median {statistics.median(first):6.2f} s ({min(first):.2f}-{max(first):.2f})"
              f"   run() median {statistics.median(run):6.2f} s ({min(run):.2f}-{max(run):.2f})")
    print(f"pause between compile() and run(): {args.pause:g} s; an empty numba cache in every run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
