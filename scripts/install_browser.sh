#!/usr/bin/env bash
# Install what tests/test_browser.py needs on a fresh machine: Debian's Chromium (browser downloads
# by Playwright do not work here), Graphviz's `dot` for the graph drawings, and the Python side
# (JupyterLab, Playwright, the notebook extra). Idempotent: anything already present is kept.
set -euo pipefail

need_apt=()
[ -x /usr/bin/chromium ] || need_apt+=(chromium)
command -v dot >/dev/null 2>&1 || need_apt+=(graphviz)
fc-list 2>/dev/null | grep -qi dejavu || need_apt+=(fonts-dejavu-core)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

py=${PYTHON:-python3}
missing=()
for mod in playwright jupyterlab notebook anywidget ipywidgets nbclient; do
  "$py" -c "import $mod" 2>/dev/null || missing+=("$mod")
done
if [ ${#missing[@]} -gt 0 ]; then
  "$py" -m pip install -q "${missing[@]}"
fi

/usr/bin/chromium --version 2>/dev/null
echo "dot: $(command -v dot || echo missing)"
"$py" -c "import playwright, jupyterlab; print('playwright + jupyterlab', jupyterlab.__version__)"
