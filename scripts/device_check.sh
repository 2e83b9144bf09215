#!/usr/bin/env bash
# The one GPU check, for the device machine (an H200 lent to some sessions; nothing is installed
# there but what its image holds: CuPy, PyTorch, numba, pytest). Run from the repository root:
#   device tool:  run(command="bash scripts/device_check.sh", timeout_s=560)
# It writes the report to $OUT/gpu_h200.txt (copy it to benchmarks/results/ and commit it).
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
nvidia-smi || true
python3 benchmarks/gpu_device_check.py --out "$out/gpu_h200.txt" 2>&1 | tee "$out/gpu_device_check.log"
