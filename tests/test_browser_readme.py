"""The README's picture is drawn from the README's own code: its "In a notebook" cells run in JupyterLab
(headless Chromium), and the dashboard they show is saved as 00_readme_dashboard.png, which
scripts/readme_images.py copies to docs/images/. The header must show the arena those cells plan."""
from __future__ import annotations

import re

import pytest
from browser_lab import open_notebook, run_cell, shot, skip_without_browser
from test_docs_examples import BLOCKS

from renaissance_nb.text import human_bytes

pytestmark = skip_without_browser()


def readme_cells() -> list[str]:
    """The python blocks of README.md (its "In a notebook" section has them all), in order: one cell each."""
    blocks = [b for b in BLOCKS if b.doc == "README.md" and b.lang == "python"]
    section = blocks[:1] + [b for b in blocks[1:2] if b.after == blocks[0].code]  # the cell and the one it leads to
    assert len(section) == 2 and section[0].code.rstrip().splitlines()[-1].startswith("task "), section
    return [b.code for b in section]


def test_the_readme_picture_is_the_readme_code_s_dashboard(lab, browser_context) -> None:  # type: ignore[no-untyped-def]
    cells = readme_cells()
    namespace: dict = {}
    exec(compile(cells[0], "README.md", "exec"), namespace)  # noqa: S102 - the arena the cells plan, here
    arena = human_bytes(namespace["task"].memory.total_bytes)
    pg = open_notebook(browser_context, lab, "readme.ipynb", cells)
    try:
        run_cell(pg, 0)
        dash = pg.locator(".rnb-dashboard").last
        dash.wait_for(state="visible", timeout=60_000)
        run_cell(pg, 1)
        pg.wait_for_timeout(2500)  # the header's poll shows the finished run
        header = dash.inner_text().split("\n", 8)
        head = " ".join(header[:8])
        assert f"arena {arena}" in head, (arena, head)
        assert re.search(r"3 epochs · best top-1 \d+\.\d+%", head), head
        shot(dash, "00_readme_dashboard.png")
    finally:
        pg.close()
