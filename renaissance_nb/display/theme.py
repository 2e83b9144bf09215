"""Colours and small formatting helpers shared by the widgets and the static HTML.

One palette per concept, chosen once here: the widgets receive their colours from
Python with the data, so a region family or a stream has the same colour in the
live widget, the static SVG and the graphviz drawing.
"""
from __future__ import annotations

import html
import time

from ..text import human_bytes

W = 760
"""The width of every static drawing, in px (static.py and inspector_static.py: here, so neither imports the other)."""

# Region families (CONCEPTS.md section 3), in the arena's address order of first use.
FAMILY_COLORS: dict[str, str] = {
    "B": "#b8a33e",  # batch-norm statistics: olive
    "W": "#3b6fb6",  # weights: blue
    "E": "#2f9c95",  # EMA weights: teal
    "A": "#7fa7e0",  # fp16 working weights: light blue
    "G": "#e07b39",  # gradients: orange
    "M": "#4f9d4a",  # first moments: green
    "V": "#93c47d",  # second moments: light green
    "N": "#a58fd6",  # LARS norms: lilac
    "I": "#d06ba6",  # inputs A/B: pink
    "F": "#7b5cc4",  # feature maps and grad slots: purple
    "S": "#8a8f98",  # scalars and masks: grey
    "T": "#a0785a",  # temporaries: brown
    "R": "#cc4455",  # results and metrics: red
}

STREAM_COLORS: dict[str, str] = {
    "TRANS": "#d06ba6",   # copies of the next batch: pink like the input buffers
    "COMP_1": "#3b6fb6",  # main compute: blue
    "COMP_2": "#2f9c95",  # metrics, zero grad: teal
    "COMP_3": "#a58fd6",  # communication: lilac
    "UPDATE": "#e07b39",  # NaN check and optimizer: orange like the gradients
}

PHASE_COLORS = {"done": "#4f9d4a", "current": "#3b6fb6", "todo": "#b9bec7"}

INK = "#1f2328"
MUTED = "#667085"
LINE = "#d0d5dd"
PAPER = "#ffffff"
PANEL = "#f6f8fa"


RUN_STATUS_COLORS = {"running": "#3b6fb6", "paused": "#7a6fb0", "done": "#4f9d4a", "interrupted": "#e07b39",
                     "error": "#c2334d"}
"""The training monitor's status pill (widgets/monitor.js, STATUS, is the same); any other status: IDLE_COLOR."""
IDLE_COLOR = "#98a2b3"


def ink_on(fill: str) -> str:
    """Near-black or white, whichever reads better on ``fill`` ("#rrggbb"; WCAG relative luminance): the
    text of a box coloured by stream or family stays at 4.5:1 or more (widgets/dom.js, inkOn, is the same)."""
    h = fill.lstrip("#")
    if len(h) != 6:
        return "#ffffff"
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in (int(h[i:i + 2], 16) / 255 for i in (0, 2, 4))]
    lum = 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    return "#111111" if (lum + 0.05) / 0.0625 >= 1.05 / (lum + 0.05) else "#ffffff"


def family_color(family: str) -> str:
    return FAMILY_COLORS.get(family, "#8a8f98")


def stream_color(stream: str) -> str:
    return STREAM_COLORS.get(stream, "#8a8f98")


# The atlas: a colour per set of variants sharing one bound graph (ten that stay apart, then again from
# the first); a graph used by one cell only is paper-grey.
SHARED_COLORS: tuple[tuple[str, str], ...] = (  # (fill, ink)
    ("#cfe0f5", "#1f4f8f"), ("#fbd9bf", "#8a3f0c"), ("#cdebc9", "#24612a"), ("#e6dcf7", "#4f3590"),
    ("#f7d0dc", "#8c2148"), ("#c9ecea", "#155e59"), ("#f3e7b5", "#6b5a10"), ("#e3d5c8", "#5e4128"),
    ("#d5dae3", "#343b47"), ("#f9cfcb", "#8f241a"))
UNSHARED = ("#f6f8fa", "#667085")


def share_colors(group: int | None) -> tuple[str, str]:
    """(fill, ink) of an atlas cell: the ``group``-th sharing pattern, or None for a graph used once."""
    return UNSHARED if group is None else SHARED_COLORS[group % len(SHARED_COLORS)]


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def clock(t: float) -> str:
    """Wall-clock time of day for the phase history."""
    return time.strftime("%H:%M:%S", time.localtime(t))


def duration(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def shape_text(shape: object) -> str:
    if shape is None:
        return "any"
    dims = tuple(shape)  # type: ignore[arg-type]
    return "(" + ", ".join(str(d) for d in dims) + ("," if len(dims) == 1 else "") + ")"


__all__ = ["FAMILY_COLORS", "STREAM_COLORS", "PHASE_COLORS", "family_color", "ink_on", "stream_color",
           "share_colors", "SHARED_COLORS", "esc", "clock", "duration", "shape_text", "human_bytes"]
