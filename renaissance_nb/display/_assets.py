"""The front-end files in top-level widgets/ (installed as the package renaissance_nb._widgets)."""
from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path


def _source_dir() -> Path:
    """widgets/ next to the package in a source checkout."""
    return Path(__file__).resolve().parents[2] / "widgets"


@functools.lru_cache(maxsize=None)
def asset(name: str) -> str:
    """Text of widgets/<name>: from the installed wheel, else from the source tree."""
    try:
        return resources.files("renaissance_nb._widgets").joinpath(name).read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError, NotADirectoryError, TypeError):
        return (_source_dir() / name).read_text(encoding="utf-8")


def esm(name: str) -> str:
    """A widget's ES module: the shared DOM helpers (dom.js), the export buttons (export.js), then
    widgets/<name>."""
    return asset("dom.js") + "\n" + asset("export.js") + "\n" + asset(name)


def css() -> str:
    """The one style sheet of every widget and every static fallback."""
    return asset("renaissance.css")
