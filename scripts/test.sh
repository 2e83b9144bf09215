#!/usr/bin/env bash
# Installs everything the test suite needs and runs all of it:
# the package with its [test] extra, then (as root, with apt-get) Debian's chromium,
# graphviz and fonts for the browser test and the graph drawings, then pytest.
# Safe to run again: anything already present is kept.
set -euo pipefail
cd "$(dirname "$0")/.."

# A Debian-managed python3 refuses pip installs outside a venv (PEP 668); CI runs as root on a
# throwaway machine, where installing beside the system packages is what we want.
export PIP_BREAK_SYSTEM_PACKAGES=1
python3 -m pip install -q -e ".[test]"
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  bash scripts/install_browser.sh
else
  echo "warning: not root or no apt-get: chromium/graphviz not installed; the tests that need them skip"
fi
exec python3 -m pytest -q -p no:cacheprovider "$@"
