"""What one compiler switch is worth: the MLP benchmark's task built twice, the switch on and
off, trained in alternating epochs in one process (A B B A A B ...), medians and ratios.

    python benchmarks/mlp_cpu_options.py pad_rows [--batches 128 32] [--rounds 8] [--out FILE]

Any boolean of ``DeepLearningTask.options`` can be compared (pad_rows, fuse, liveness,
nan_check, zero_grad, prefetch). Both tasks share the process, the data and the BLAS, so
the VM's changing speed hits both alike; the pairs' ratios show how much of the difference
is noise. Not a timed test: a measurement to justify (or refute) a default with.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from mlp_cpu import Ours, load_data  # noqa: E402

SWITCHES = ("pad_rows", "fuse", "liveness", "nan_check", "zero_grad", "prefetch")


def compare(switch: str, batch: int, rounds: int, samples: int) -> list[str]:
    x, y, what = load_data(samples)
    on = Ours(x, y, batch, f"{switch}=True", {switch: True})
    off = Ours(x, y, batch, f"{switch}=False", {switch: False})
    times: dict[str, list[float]] = {on.name: [], off.name: []}
    for r in range(rounds):
        for c in ((on, off) if r % 2 == 0 else (off, on)):
            times[c.name].append(c.epoch())
    steps = on.task.steps_per_epoch
    med = {k: statistics.median(v) for k, v in times.items()}
    pairs = [a / b for a, b in zip(times[on.name], times[off.name])]
    lines = [f"batch {batch}: {steps} steps/epoch of {what}, {rounds} rounds, epochs alternating"]
    for k, v in med.items():
        lines.append(f"  {k:<18} {v:7.3f} s/epoch  {1e3 * v / steps:6.2f} ms/step")
    lines.append(f"  {switch}=True / {switch}=False: {med[on.name] / med[off.name]:.3f}x (medians); "
                 f"per round {min(pairs):.3f}-{max(pairs):.3f}x, {sum(p < 1 for p in pairs)} of {len(pairs)} below 1")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("switch", choices=SWITCHES)
    ap.add_argument("--batches", type=int, nargs="+", default=[128, 32])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--samples", type=int, default=60000)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    lines: list[str] = []
    for b in args.batches:
        block = compare(args.switch, b, args.rounds, args.samples)
        print("\n".join(block), flush=True)
        lines += block
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
