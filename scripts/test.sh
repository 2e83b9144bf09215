#!/usr/bin/env bash
# Installs everything the test suite needs and runs all of it:
# the package with its [test] and [mkl] extras (so both sgemm paths, OpenBLAS and oneMKL, are
# tested), PyTorch (the reference for the parity tests), then (as root, with apt-get) gcc for the C
# kernels if there is no C compiler, Debian's chromium, graphviz and fonts for the browser test and
# the graph drawings, then pytest, which ends by listing the 15 slowest tests.
# Safe to run again: anything already present is kept.
set -euo pipefail
cd "$(dirname "$0")/.."

# A Debian-managed python3 refuses pip installs outside a venv (PEP 668); CI runs as root on a
# throwaway machine, where installing beside the system packages is what we want.
export PIP_BREAK_SYSTEM_PACKAGES=1
python3 -m pip install -q -e ".[test,mkl]"
# PyTorch is the reference the parity tests (losses, schedulers, conv kernels, transfer) compare
# against; without it those ~190 tests skip. 2.13.0 is pinned because this workplace's machines
# carry its CPU wheel on disk; elsewhere pip takes PyPI's build of the same release.
python3 -m pip install -q "torch==2.13.0"
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  # a C compiler builds the fused CPU passes (renaissance_nb/kernels/native.c); without one the numba
  # kernels serve and tests/test_native.py skips
  if ! command -v cc >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null
  fi
  bash scripts/install_browser.sh
else
  echo "warning: not root or no apt-get: chromium/graphviz not installed; the tests that need them skip"
fi
# --durations=15: the 15 slowest tests close the output, so a slow one is seen when it comes.
# -n 2 --dist loadfile: two pytest workers (pytest-xdist), each taking whole test files (their module
# fixtures and notebook runs stay in one process). One process used 98% of one CPU for 14.5 min on the
# 2-core machine (peak 2.4 GiB); two took 9 min (160% CPU, peak 1.5 GiB). RNB_TEST_WORKERS=1 runs serially.
exec python3 -m pytest -q -p no:cacheprovider --durations=15 -n "${RNB_TEST_WORKERS:-2}" --dist loadfile "$@"
