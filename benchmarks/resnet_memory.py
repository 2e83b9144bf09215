"""Memory of the README's ResNet example: our arena and process against PyTorch's peak resident growth.

    python benchmarks/resnet_memory.py [--samples 1280] [--rounds 3] [--src CHECKOUT] [--out FILE [--append]]

The net of the README (cbr(32, 3, 1, 1), block(32, RESNET_3_3), block(64, RESNET_3_3_DS), gap(),
fc(10)) trained by each side on the same random 3x32x32 images: batch 128, AdamW, crop_pad=4 and
flips, one epoch at 24x24 then one at 32x32 (train_resolution(24, 32), bilinear), an EMA of the
weights (0.999) and a validation pass of the model and of its EMA after each epoch; then one more
epoch at 32x32. Each run is a fresh process, the two sides' runs interleaved, after a first run
of ours that is not counted (it fills the numba cache: every counted run loads its kernels). A
process imports its library and makes the data first, then resets its peak (VmHWM, through
/proc/self/clear_refs) and takes its resident size as the baseline: the growth counts building,
compiling (loading our kernels) and training, not the data or the import. Printed: our arena
(the plan's bytes, the T region of the im2col scratch apart), each side's peak growth through the
two epochs and the extra during the third, and the ratios, medians over the rounds with their
spread.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from machine import machine_line  # benchmarks/machine.py

ROOT = Path(__file__).resolve().parents[1]

COMMON = r"""
import gc, json, sys, time
import numpy as np
n = int(sys.argv[1])
rng = np.random.default_rng(0)
x = rng.standard_normal((n, 3, 32, 32), dtype=np.float32)
y = rng.integers(0, 10, n).astype(np.int64)
xv, yv = x[: n // 5].copy(), y[: n // 5].copy()

def status(key):
    for line in open('/proc/self/status'):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

def reset_peak():
    gc.collect()
    open('/proc/self/clear_refs', 'w').write('5')  # VmHWM := VmRSS
    return status('VmRSS')
"""

OURS = COMMON + r"""
import renaissance_nb as rnb
from renaissance_nb.kernels import blas
from renaissance_nb import DeepLearningTask, seq, fc, cbr, block, gap, RESNET_3_3, RESNET_3_3_DS
from renaissance_nb.memory.region import Region
net = seq(cbr(32, 3, 1, 1), block(32, RESNET_3_3), block(64, RESNET_3_3_DS), gap(), fc(10))
base = reset_peak()
t0 = time.perf_counter()
task = (DeepLearningTask('resnet').model(net).data(train=(x, y.astype(np.int32)), val=(xv, yv.astype(np.int32)),
                                                 batch_size=128)
        .augment(crop_pad=4, flip=True).train_resolution(24, 32, boundary_epoch=1).ema(0.999).total_epochs(3).seed(0))
task.compile()
task.run(epochs=2, progress=False)
seconds = time.perf_counter() - t0
grown = status('VmHWM') - base
base3 = reset_peak()
task.run(epochs=1, progress=False)
plan, at32 = task.locked.memory, task.locked.plans['train_lowres']  # the 32x32 variant fills the slots
t_tensors = sorted(at32.tensors_in(Region.T_TEMP_FP32), key=lambda t: -t.slot_bytes)[:4]
print(json.dumps({'growth': grown, 'later': status('VmHWM') - base3, 'seconds': seconds,
                  'arena': plan.total_bytes, 'regions': {r.name: s.size for r, s in plan.regions.items()},
                  'by_category': task.memory_inspector.by_category(), 'locked': task.locked.summary(),
                  'largest_t': [[t.name, list(t.shape), t.slot_bytes] for t in t_tensors],
                  'steps': len(task.result.step_losses), 'library': rnb.__file__, 'blas': blas.describe()}))
"""

TORCH = COMMON + r"""
import torch
from torch import nn
import torch.nn.functional as F
torch.set_num_threads(int(sys.argv[2]))
torch.manual_seed(0)

def cbr(cin, cout, s):
    return [nn.Conv2d(cin, cout, 3, s, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

class Block(nn.Module):
    def __init__(self, cin, cout, down):
        super().__init__()
        self.main = nn.Sequential(*cbr(cin, cout, 2 if down else 1), nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                                  nn.BatchNorm2d(cout))
        self.short = (nn.Sequential(nn.Conv2d(cin, cout, 1, 2, 0, bias=False), nn.BatchNorm2d(cout)) if down
                      else nn.Identity())

    def forward(self, t):
        return torch.relu_(self.short(t) + self.main(t))

def augment(xb, size):
    xb = F.pad(xb, (4, 4, 4, 4))
    i, j = torch.randint(0, 9, (2, len(xb)))
    flips = torch.rand(len(xb)) < 0.5
    out = torch.stack([xb[k, :, i[k]:i[k] + 32, j[k]:j[k] + 32] for k in range(len(xb))])
    out[flips] = out[flips].flip(-1)
    return out if size == 32 else F.interpolate(out, size=(size, size), mode='bilinear', align_corners=False)

def evaluate(m):
    m.eval()
    with torch.no_grad():
        hits = sum(int((m(X[a:a + 128]).argmax(1) == Y[a:a + 128]).sum()) for a in range(0, len(X), 128))
    m.train()
    return hits

def epoch(size):
    perm = torch.randperm(len(xt))
    for a in range(0, len(xt), 128):
        idx = perm[a:a + 128]
        opt.zero_grad(set_to_none=True)
        lossf(model(augment(xt[idx], size)), yt[idx]).backward()
        opt.step()
        ema.update_parameters(model)
    evaluate(model), evaluate(ema)

xt, yt, X, Y = torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(xv), torch.from_numpy(yv)
base = reset_peak()
t0 = time.perf_counter()
model = nn.Sequential(*cbr(3, 32, 1), Block(32, 32, False), Block(32, 64, True), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(64, 10))
ema = torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.999),
                                          use_buffers=True)
opt, lossf = torch.optim.AdamW(model.parameters(), lr=1e-3), nn.CrossEntropyLoss()
epoch(24)
epoch(32)
seconds = time.perf_counter() - t0
grown = status('VmHWM') - base
base3 = reset_peak()
epoch(32)
print(json.dumps({'growth': grown, 'later': status('VmHWM') - base3, 'seconds': seconds,
                  'torch': torch.__version__, 'threads': torch.get_num_threads()}))
"""


def run_child(code: str, args: list[str], src: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=src, env=env, capture_output=True, text=True,
                         timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def revision(src: Path) -> str:
    """The checkout's commit (with '+ changes' when its tree differs from it)."""
    git = ["git", "-C", str(src)]
    rev = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--", "renaissance_nb"], capture_output=True, text=True).stdout
    return (rev or "?") + (" + changes" if dirty.strip() else "")


def mib(b: float) -> str:
    return f"{b / 2**20:.1f} MiB"


def spread(values: list[float]) -> str:
    return f"{mib(statistics.median(values))} (rounds {', '.join(mib(v) for v in values)})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=1280, help="training images (a fifth as many for validation)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--src", default=str(ROOT), help="the checkout whose renaissance_nb is measured")
    ap.add_argument("--out", default=None, help="also write the report to this file")
    ap.add_argument("--append", action="store_true", help="add to --out rather than replace it")
    args = ap.parse_args()
    src = Path(args.src)
    threads = str(os.cpu_count() or 1)
    ours: list[dict] = []
    theirs: list[dict] = []
    lines = [machine_line(), ""]
    print(lines[0], flush=True)
    first = run_child(OURS, [str(args.samples)], src)  # fills the checkout's numba cache: rounds then load kernels
    for r in range(args.rounds):
        order = ("ours", "torch") if r % 2 == 0 else ("torch", "ours")
        for side in order:
            if side == "ours":
                ours.append(run_child(OURS, [str(args.samples)], src))
            else:
                theirs.append(run_child(TORCH, [str(args.samples), threads], src))
        print(f"round {r + 1}: ours {mib(ours[-1]['growth'])}, torch {mib(theirs[-1]['growth'])}", flush=True)
    o, t = ours[-1], theirs[-1]
    steps = args.samples // 128 + (args.samples % 128 > 0)
    lines += [f"The README's ResNet, batch 128, {args.samples} random 3x32x32 training images ({steps} steps an epoch), "
              f"{args.samples // 5} for validation; epochs at 24x24 then 32x32, EMA, AdamW; {args.rounds} rounds of "
              f"fresh processes, interleaved, after a first run of ours that filled the numba cache (not counted: it "
              f"grew {mib(first['growth'])}).",
              f"renaissance_nb at {revision(src)} ({o['library']}): {o['blas']}",
              f"PyTorch {t['torch']} on {t['threads']} threads.", "",
              f"our plan: {o['locked']}",
              "  regions: " + ", ".join(f"{k} {mib(v)}" for k, v in o["regions"].items() if v >= 1 << 16),
              "  memory_inspector.by_category(): " + ", ".join(f"{k} {mib(v)}" for k, v in o["by_category"].items()
                                                                if v >= 1 << 16),
              "  largest tensors of T (the im2col scratch) at 32x32: "
              + "; ".join(f"{n} {tuple(s)} {mib(b)}" for n, s, b in o["largest_t"]), ""]
    arena = o["arena"]
    g_ours, g_torch = [r["growth"] for r in ours], [r["growth"] for r in theirs]
    lines += [f"our arena:                                       {mib(arena)}",
              f"our peak resident growth, set-up + two epochs:   {spread(g_ours)}",
              f"torch peak resident growth, set-up + two epochs: {spread(g_torch)}",
              f"during a third epoch: ours {spread([r['later'] for r in ours])}, "
              f"torch {spread([r['later'] for r in theirs])}",
              f"set-up + two epochs took ours {statistics.median(r['seconds'] for r in ours):.1f} s, "
              f"torch {statistics.median(r['seconds'] for r in theirs):.1f} s (medians)", "",
              f"arena / torch peak growth:      {arena / statistics.median(g_torch):.2f}x "
              f"(rounds {min(arena / g for g in g_torch):.2f}-{max(arena / g for g in g_torch):.2f}x)",
              f"our growth / torch peak growth: {statistics.median(g_ours) / statistics.median(g_torch):.2f}x"]
    print("\n".join(lines[1:]))
    if args.out:
        with open(args.out, "a" if args.append else "w") as f:
            f.write(("\n" if args.append else "") + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
