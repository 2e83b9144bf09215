#!/usr/bin/env bash
# The one GPU check, for the device machine (an H200 lent to some sessions; nothing is installed
# there but what its image holds: CuPy, PyTorch, numba, pytest). Run from the repository root:
#   device tool:  run(command="bash scripts/device_check.sh", timeout_s=560)
# It writes the report to $OUT/gpu_h200.txt and the device-memory test to $OUT/memory_check.log
# (copy them to benchmarks/results/ and commit them).
set -o pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
nvidia-smi || true
# planned vs measured device memory (#25): CuPy's pool and cudaMemGetInfo against the plan's arena
python3 -m pytest -q -rs -s -p no:cacheprovider tests/test_memory_inspector.py -k "device_memory" 2>&1 \
  | tee "$out/memory_check.log"
python3 benchmarks/gpu_device_check.py --out "$out/gpu_h200.txt" 2>&1 | tee "$out/gpu_device_check.log"
