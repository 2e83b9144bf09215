#!/usr/bin/env bash
# Installs everything the test suite needs and runs all of it.
# System packages (graphviz for graph drawings, chromium for the browser test)
# are installed here with apt-get when missing (as root), then the package with
# its [test] extra, then pytest. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v dot >/dev/null 2>&1 || need_apt+=(graphviz)
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing system packages: ${need_apt[*]}"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  else
    echo "warning: cannot install ${need_apt[*]} (not root or no apt-get); the tests that need them will skip"
  fi
fi

python3 -m pip install -q -e ".[test]"
exec python3 -m pytest -q -p no:cacheprovider "$@"
