"""Copy the browser test's screenshots that README.md and docs/guide.md show into docs/images/.

    python -m pytest tests/test_browser.py tests/test_browser_graph.py tests/test_browser_inspector.py \
        tests/test_browser_readme.py tests/test_browser_theme.py
    python scripts/readme_images.py

The pictures are what the real-browser tests drew (JupyterLab + headless Chromium), never edited by
hand; a missing screenshot is an error, so a picture cannot silently stay stale.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHOTS = Path(os.environ.get("RNB_SCREENSHOTS", ROOT / "artifacts" / "screenshots"))
SHOWN = ("00_readme_dashboard.png", "01_dashboard_phases.png", "05_region_map.png", "06_lifetimes.png", "08_atlas.png",
         "09_monitor.png", "20_graph_mlp_whole_step.png", "21_graph_resnet_whole_step.png", "30_inspector_scrubber.png",
         "31_inspector_whatif.png", "32_inspector_tensor.png", "23_graph_details.png", "50_dark_regions.png")


def main() -> int:
    missing = [name for name in SHOWN if not (SHOTS / name).exists()]
    if missing:
        print(f"missing in {SHOTS}: {', '.join(missing)}; run the browser tests first", file=sys.stderr)
        return 1
    out = ROOT / "docs" / "images"
    out.mkdir(parents=True, exist_ok=True)
    for name in SHOWN:
        shutil.copyfile(SHOTS / name, out / name)
        print(f"docs/images/{name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
