"""Static HTML/SVG of every view: what nbconvert HTML, GitHub and a kernel-less viewer show.

Everything is drawn from the views in views.py. SVG elements carry <title>s, so
hovering shows a tensor's name, shape, dtype, offset and bytes even without
JavaScript; the live widgets add clicking and switching on top.
"""
from __future__ import annotations

import itertools
import textwrap
from typing import Any, Callable

from ..text import human_bytes, plural
from . import views
from ._assets import css
from .sections import INSPECTOR_WAITS, sections_of
from .theme import IDLE_COLOR, PHASE_COLORS, RUN_STATUS_COLORS, W, esc, ink_on


def wrap(body: str, cls: str = "") -> str:
    """A self-contained fragment: the shared style sheet plus the body."""
    return f"<div class='rnb rnb-static {cls}'><style>{css()}</style>{body}</div>"


def static_copy(html: str, view: str) -> str:
    """The static copy of a live view (``html`` as ``wrap`` made it), an output of its own (see
    display._base.show_with_copy)."""
    return f"<div class='rnb-static-copy' data-view='{esc(view)}'>{html}</div>"


# ---- phases ----------------------------------------------------------------------------------------
_SVG_IDS = itertools.count(1)
"""A fresh number per drawing: an id shared by two SVGs in one page resolves to the first, and a marker in
a hidden tab (display: none) draws nothing, so every other diagram would lose its arrowheads."""


def phase_svg(view: dict[str, Any]) -> str:
    bw, bh, gap, top = 170, 54, 100, 28
    lines = [[line for allow in ph["allows"][:4] for line in textwrap.wrap(allow, 25)] for ph in view["phases"]]
    height = top + bh + 14 + 15 * max(map(len, lines), default=0)
    arrow = f"rnb-arrow-{next(_SVG_IDS)}"
    parts = [f"<svg class='rnb-phase-diagram' viewBox='0 0 {W} {height}' xmlns='http://www.w3.org/2000/svg' "
             "role='img' aria-label='phase diagram'>",
             f"<defs><marker id='{arrow}' viewBox='0 0 10 10' refX='9' refY='5' markerWidth='7' markerHeight='7' "
             "orient='auto'><path d='M0,0 L10,5 L0,10 z' fill='#98a2b3'/></marker></defs>"]
    x0 = (W - (3 * bw + 2 * gap)) / 2
    for i, ph in enumerate(view["phases"]):
        x = x0 + i * (bw + gap)
        state = ph["state"]
        colour = PHASE_COLORS[state]
        fill = colour if state == "current" else ("#eef6ed" if state == "done" else "#ffffff")
        ink = "#ffffff" if state == "current" else ("#2f6b2b" if state == "done" else "#667085")
        mark = "✓ " if state == "done" else ("● " if state == "current" else "")
        # the classes let the style sheet give a done phase the theme's colours (dark: a dark green)
        done = " class='rnb-svg-done'" if state == "done" else ""
        parts.append(f"<g data-phase='{esc(ph['name'])}' data-state='{state}'>"
                     f"<title>{esc(ph['name'])}: allows {esc(', '.join(ph['allows']))}</title>"
                     f"<rect x='{x:.0f}' y='{top}' width='{bw}' height='{bh}' rx='12' fill='{fill}'{done} "
                     f"stroke='{colour}' stroke-width='{2.2 if state == 'current' else 1.4}'/>"
                     f"<text x='{x + bw / 2:.0f}' y='{top + 33}' text-anchor='middle' font-size='14' "
                     f"font-weight='700' fill='{ink}'{done.replace('done', 'good')}>{mark}{esc(ph['name'])}</text></g>")
        for k, allow in enumerate(lines[i]):
            parts.append(f"<text x='{x + bw / 2:.0f}' y='{top + bh + 20 + 15 * k}' text-anchor='middle' "
                         f"font-size='12' fill='{'#475467' if state != 'todo' else '#667085'}'>{esc(allow)}</text>")
        if i < 2:
            ax = x + bw + 6
            parts.append(f"<line x1='{ax:.0f}' y1='{top + bh / 2}' x2='{ax + gap - 12:.0f}' y2='{top + bh / 2}' "
                         f"stroke='#98a2b3' stroke-width='1.6' marker-end='url(#{arrow})'/>"
                         f"<text x='{ax + (gap - 6) / 2:.0f}' y='{top + bh / 2 - 8}' text-anchor='middle' "
                         f"font-size='12' fill='#475467' font-family='monospace'>{esc(view['arrows'][i])}</text>")
    parts.append(f"<text x='{x0:.0f}' y='14' font-size='12' fill='#667085'>"
                 f"{esc(view['kind'])} {esc(view['task'])!s} · phase {esc(view['current'])}</text></svg>")
    return "".join(parts)


def _transition(h: dict[str, Any]) -> str:
    if h["source"] == h["target"]:
        return f"<span class='rnb-muted'>within {esc(h['target'])}</span>"
    return f"{esc(h['source'])} → <b>{esc(h['target'])}</b>"


def history_table(view: dict[str, Any]) -> str:
    if not view["history"]:
        return "<div class='rnb-muted'>No transitions yet: the task was just created.</div>"
    rows = "".join(f"<tr><td class='rnb-mono'>{esc(h['at'])}</td><td class='rnb-mono'>{esc(h['operation'])}()</td>"
                   f"<td>{_transition(h)}</td>"
                   f"<td class='rnb-num'>{h['seconds'] * 1e3:.1f} ms</td></tr>" for h in view["history"])
    return ("<table class='rnb-table rnb-history'><tr><th>time</th><th>call</th><th>transition</th>"
            f"<th class='rnb-num'>took</th></tr>{rows}</table>")


def phase_html(view: dict[str, Any], error: dict[str, Any] | None = None) -> str:
    """The phase machine's saved copy, with the error its buttons last met (phase.js draws it live)."""
    err = ""
    if error and error.get("message"):
        who = f"{error['type']} from {error['action']}()" if error.get("action") else error.get("type", "")
        err = (f"<div class='rnb-error' data-error='{esc(error.get('type', ''))}'><b>{esc(who)}</b> "
               f"{esc(error['message'])}</div>")
    return (f"<div class='rnb-phase'>{phase_svg(view)}{err}<div class='rnb-h'>History</div>{history_table(view)}</div>")


# ---- memory ----------------------------------------------------------------------------------------
def _tensor_title(t: dict[str, Any], variant: str) -> str:
    shape = t["shapes"].get(variant, next(iter(t["shapes"].values())))
    used = t["nbytes"].get(variant, t["slot_bytes"])
    pad = t.get("storage", {}).get(variant, used) - used
    rows = f" · rows padded to {t['pitch']} ({human_bytes(pad)} of padding)" if t.get("pitch") else ""
    return (f"{t['name']} (#{t['id']}) shape {tuple(shape)} {t['dtype']} · offset {t['offset']:,} · "
            f"{human_bytes(used)} of a {human_bytes(t['slot_bytes'])} slot{rows} · {t['region']}")


def arena_svg(view: dict[str, Any]) -> str:
    """The whole arena to scale: one rectangle per region, coloured by family."""
    total = max(view["arena_bytes"], 1)
    h = 30
    parts = [f"<svg class='rnb-arena-bar' viewBox='0 0 {W} {h + 18}' xmlns='http://www.w3.org/2000/svg'>",
             f"<rect x='0' y='0' width='{W}' height='{h}' rx='6' fill='#f2f4f7'/>"]
    for r in view["regions"]:
        x = r["base"] / total * W
        w = max(r["size"] / total * W, 1.5)
        parts.append(f"<rect data-region='{esc(r['region'])}' x='{x:.2f}' y='0' width='{w:.2f}' height='{h}' "
                     f"fill='{r['color']}' stroke='#fff' stroke-width='0.8'><title>{esc(r['region'])}: "
                     f"{esc(r['human'])} at offset {r['base']:,}</title></rect>")
        if w > 34:
            parts.append(f"<text x='{x + w / 2:.1f}' y='{h / 2 + 4}' text-anchor='middle' font-size='11' "
                         f"font-weight='600' fill='#fff' pointer-events='none'>{esc(r['family'])}</text>")
    parts.append(f"<text x='0' y='{h + 14}' font-size='10' fill='#667085'>0</text>"
                 f"<text x='{W}' y='{h + 14}' font-size='10' fill='#667085' text-anchor='end'>"
                 f"{esc(view['arena_human'])}</text></svg>")
    return "".join(parts)


def family_legend(view: dict[str, Any]) -> str:
    items = "".join(f"<span title='{esc(', '.join(f.get('regions', ())))}'><span class='rnb-swatch' "
                    f"style='background:{f['color']}'></span><b>{esc(f['family'])}</b> "
                    f"{esc(f['name'])} · {esc(f['human'])}</span>" for f in view["families"])
    return f"<div class='rnb-legend'>{items}</div>"


def region_rows_svg(view: dict[str, Any], variant: str | None = None) -> str:
    """One row per region, its length the region's size against the largest; inside it, its tensors at
    their offsets."""
    variant = variant or view["variants"][0]
    tensors = {t["id"]: t for t in view["tensors"]}
    row_h, name_w, size_w = 22, 170, 86
    track_w = W - name_w - size_w
    parts = [f"<svg class='rnb-region-rows-svg' viewBox='0 0 {W} {row_h * len(view['regions']) + 4}' "
             "xmlns='http://www.w3.org/2000/svg'>"]
    largest = max((r["size"] for r in view["regions"]), default=1) or 1
    for i, r in enumerate(view["regions"]):
        y = i * row_h + 2
        row_w = max(track_w * r["size"] / largest, 6)
        parts.append(f"<g data-region='{esc(r['region'])}'><text x='0' y='{y + 14}' font-size='11' "
                     f"font-family='monospace' fill='#1f2328'>{esc(r['region'])}{' ⇄' if r.get('reduced') else ''}</text>"
                     f"<rect x='{name_w}' y='{y}' width='{row_w:.1f}' height='{row_h - 5}' rx='4' fill='#f2f4f7'/>")
        for tid in r["tensor_ids"]:
            t = tensors[tid]
            x = name_w + (t["offset"] - r["base"]) / max(r["size"], 1) * row_w
            w = max(t["slot_bytes"] / max(r["size"], 1) * row_w - 1, 2)
            used = t["nbytes"].get(variant, t["slot_bytes"]) / max(t["slot_bytes"], 1)
            parts.append(f"<g data-tensor='{tid}'><title>{esc(_tensor_title(t, variant))}</title>"
                         f"<rect x='{x:.1f}' y='{y + 1}' width='{w:.1f}' height='{row_h - 7}' rx='3' "
                         f"fill='{t['color']}' fill-opacity='0.35' stroke='#fff' stroke-width='0.8'/>"
                         f"<rect x='{x:.1f}' y='{y + 1}' width='{max(w * used, 1):.1f}' height='{row_h - 7}' rx='3' "
                         f"fill='{t['color']}'/></g>")
        parts.append(f"<text x='{W}' y='{y + 14}' font-size='11' fill='#667085' text-anchor='end'>"
                     f"{esc(r['human'])}</text></g>")
    parts.append("</svg>")
    return "".join(parts)


def regions_html(view: dict[str, Any], variant: str | None = None) -> str:
    if not view.get("ready"):
        return "<div class='rnb-note'>No memory plan yet: it is fixed by lock_memory() (or finalize_memory()).</div>"
    same = ("" if not view["offsets_text"] else f"<br><span class='rnb-ok'>✓ {esc(view['offsets_text'])}</span>"
            if view["offsets_identical"] else "<br><span class='rnb-error'>offsets differ between variants</span>")
    return (f"<div class='rnb-region-map-static'><div class='rnb-row'>"
            f"<span class='rnb-stat'><b>{esc(view['arena_human'])}</b><span>arena</span></span>"
            f"<span class='rnb-stat'><b>{view['n_tensors']}</b><span>tensors</span></span>"
            f"<span class='rnb-stat'><b>{len(view['regions'])}</b><span>regions in use</span></span>"
            f"<span class='rnb-grow rnb-muted'>{esc(view['reuse_text'])}{same}</span></div>"
            f"{arena_svg(view)}{family_legend(view)}<div class='rnb-h'>Regions · tensors at their offsets "
            f"({esc(variant or view['variants'][0])}; a row's length is its region's size; light part = slot bytes "
            "this variant leaves unused)</div>"
            f"{region_rows_svg(view, variant)}"
            + (f"<div class='rnb-note rnb-reduced'>{esc(view['reduced_text'])}</div>" if view.get("reduced_text") else "")
            + f"<div class='rnb-note rnb-empty-regions'>{esc(view.get('empty_text', ''))}</div></div>")


def _fit(text: str, width: float, char: float = 5.6) -> str:
    """Shorten a label to what fits in ``width`` px."""
    n = int(width // char)
    return text if len(text) <= n else (text[: max(n - 1, 1)] + "…")


def lifetimes_svg(view: dict[str, Any]) -> str:
    """Step order x offset: one box per tensor interval (reusable regions F and T)."""
    if not view.get("ready"):
        return "<div class='rnb-note'>No lifetimes yet: they come with the memory plan.</div>"
    tensors = [t for t in view["tensors"] if t["reusable"]]
    lo, hi = view["focus_range"]
    span = max(hi - lo, 1)
    n = max(len(view["steps"]), 1)
    left, top, h = 64, 24, 260
    pw = W - left - 8
    parts = [f"<svg class='rnb-lifetime-svg' viewBox='0 0 {W} {top + h + 26}' xmlns='http://www.w3.org/2000/svg'>"]
    for p in view["programs"]:
        x = left + p["start"] / n * pw
        w = (p["end"] - p["start"] + 1) / n * pw
        parts.append(f"<rect x='{x:.1f}' y='{top}' width='{w:.1f}' height='{h}' fill='#f6f8fa'/>"
                     f"<text x='{x + 3:.1f}' y='{top - 6}' font-size='10' fill='#667085'>{esc(_fit(p['name'], w))}</text>")
    for t in tensors:
        for a, b in t["intervals"]:
            x = left + a / n * pw
            w = max((b - a + 1) / n * pw, 2)
            y = top + (t["offset"] - lo) / span * h
            bh = max(t["slot_bytes"] / span * h, 2.5)
            shares = ("shares bytes with " + ", ".join(t["shares"])) if t["shares"] else "own bytes, not shared"
            parts.append(f"<rect class='rnb-life-box' data-tensor='{esc(t['name'])}' "
                         f"data-shared='{int(bool(t['shares']))}' x='{x:.1f}' y='{y:.1f}' width='{w:.1f}' "
                         f"height='{bh:.1f}' fill='{t['color']}' rx='1.5'><title>{esc(t['name'])} #{t['id']} · "
                         f"{esc(t['region'])} · offset {t['offset']:,} · {human_bytes(t['slot_bytes'])} · "
                         f"live at steps {a}–{b} · {esc(shares)}</title></rect>")
    parts.append(f"<text x='{left - 6}' y='{top + 9}' font-size='10' fill='#667085' text-anchor='end'>{lo:,}</text>"
                 f"<text x='{left - 6}' y='{top + h}' font-size='10' fill='#667085' text-anchor='end'>{hi:,}</text>"
                 f"<text x='{left + pw / 2:.0f}' y='{top + h + 18}' font-size='10.5' fill='#667085' "
                 "text-anchor='middle'>step order (node index on the liveness timeline) →</text>"
                 f"<text x='12' y='{top + h / 2:.0f}' font-size='10.5' fill='#667085' text-anchor='middle' "
                 f"transform='rotate(-90 12 {top + h / 2:.0f})'>byte offset ↓</text></svg>")
    return "".join(parts)


def lifetimes_html(view: dict[str, Any]) -> str:
    if not view.get("ready"):
        return lifetimes_svg(view)
    shared = view["shared"]
    pairs = ("<br>Sharing bytes: " + ", ".join(f"{esc(p['a'])} ⇄ {esc(p['b'])}" for p in shared[:8])
             + (" …" if len(shared) > 8 else "")) if shared else ""
    return (f"<div class='rnb-lifetimes-static'><div class='rnb-sub'>{esc(view['summary'])}{pairs}</div>"
            f"{lifetimes_svg(view)}{family_legend(view)}</div>")


# ---- atlas -----------------------------------------------------------------------------------------------
def atlas_html(view: dict[str, Any]) -> str:
    if not view.get("ready"):
        return "<div class='rnb-note'>No atlas yet: compile() fills it.</div>"
    head = "<tr><th>GraphId</th><th>stream</th>" + "".join(
        f"<th class='rnb-variant'>{esc(v)}{'<br><span class=rnb-muted>unused</span>' if v in view['unused'] else ''}"
        f"</th>" for v in view["variants"]) + "</tr>"
    rows = []
    for g in view["graph_ids"]:
        stream = view["streams"][g]
        cells = []
        for v in view["variants"]:
            c = view["cells"].get(v, {}).get(g)
            if c is None:
                cells.append("<td class='rnb-empty'>—</td>")
                continue
            shared = f"<span class='rnb-shared'>×{c['shared_by']}</span>" if c["shared_by"] > 1 else ""
            cells.append(f"<td class='rnb-cell' data-captured='{c['captured']}' data-variant='{esc(v)}' "
                         f"data-gid='{esc(g)}' style='background:{c['color']};color:{c['ink']}' "
                         f"title='{esc(v)} · {esc(g)} → bound graph #{c['captured']} ({esc(c['graph'])}, "
                         f"ShapeId s{c['shape_id']}, stream {esc(c['stream'])}); shared by "
                         f"{plural(c['shared_by'], 'entry', 'entries')}'>"
                         f"<span class='rnb-cap'>#{c['captured']}</span><span class='rnb-sid'>s{c['shape_id']}</span>"
                         f"{shared}</td>")
        rows.append(f"<tr><th class='rnb-mono'>{esc(g)}</th><td><span class='rnb-pill' "
                    f"style='background:{view['stream_colors'][stream]}'>{esc(stream)}</span></td>{''.join(cells)}</tr>")
    sids = " · ".join(f"s{k} = {esc(v)}" for k, v in view["shape_ids"].items())
    coll = ("<div class='rnb-sub'>Collapsed (same input shape, same captures): "
            + ", ".join(f"{esc(a)} → {esc(b)}" for a, b in view["collapsed"].items()) + "</div>") if view["collapsed"] else ""
    return (f"<div class='rnb-atlas-static'><div class='rnb-sub'>{plural(view['entries'], 'entry', 'entries')} "
            f"over {plural(len(view['variants']), 'variant')} → <b>{plural(view['captures'], 'distinct bound graph')}"
            "</b>. Cells of one colour "
            f"share one bound graph (grey: used by that cell only). ShapeIds: {sids}</div>{coll}<table class='rnb-atlas-table'>{head}{''.join(rows)}"
            f"</table>{_share_legend(view)}</div>")


def _share_legend(view: dict[str, Any]) -> str:
    """Which variants each atlas colour stands for."""
    items = "".join(f"<span><span class='rnb-swatch' style='background:{p['color']};outline:1px solid {p['ink']}'></span>"
                    f"{esc(' = '.join(p['variants']))}</span>" for p in view.get("patterns", ()))
    return f"<div class='rnb-legend rnb-share-legend'><span class='rnb-muted'>shared by:</span>{items}</div>"


# ---- blueprint and variants ------------------------------------------------------------------------------
def blueprint_html(view: dict[str, Any]) -> str:
    tree = f"<div class='rnb-pre'>{esc(view['tree'])}</div>" if view["tree"] else \
        "<div class='rnb-muted'>No model declared (TaskBase tasks allocate tensors by hand).</div>"
    if view["layers"]:
        rows = "".join(f"<tr><td class='rnb-mono'><b>{esc(l['name'])}</b></td><td>{esc(l['describe'])}"
                       f"</td><td class='rnb-mono rnb-muted'>{esc(', '.join(l['reads']))}</td>"
                       f"<td class='rnb-mono'>{esc(l['in'])}</td><td class='rnb-mono'>{esc(l['out'])}</td>"
                       f"<td class='rnb-num'>{l['params']:,}</td></tr>" for l in view["layers"])
        layers = ("<div class='rnb-h'>Executable layers after fusion</div><table class='rnb-table'><tr><th>layer</th>"
                  "<th>what</th><th>reads</th><th>in (per sample)</th><th>out</th><th class='rnb-num'>params</th></tr>"
                  f"{rows}<tr><td></td><td></td><td></td><td></td><td><b>total</b></td>"
                  f"<td class='rnb-num'><b>{view['total_params']:,}</b></td></tr></table>")
    else:
        layers = "<div class='rnb-note'>plan() turns the BluePrint into executable layers.</div>"
    settings = "".join(f"<tr><th>{esc(k)}</th><td class='rnb-mono'>{esc(v)}</td></tr>" for k, v in view["settings"])
    return (f"<div class='rnb-blueprint'><div class='rnb-h'>Declared model</div>{tree}{layers}"
            f"<div class='rnb-h'>Settings</div><table class='rnb-table'>{settings}</table></div>")


def variants_html(view: dict[str, Any]) -> str:
    if not view.get("ready"):
        return "<div class='rnb-note'>The six variants are derived by plan().</div>"
    rows = []
    for r in view["rows"]:
        status = "" if r["used"] else "<span class='rnb-pill rnb-outline'>unused</span>"
        coll = f"= {esc(r['collapsed_to'])}" if r["collapsed_to"] else ""
        sid = "" if r["shape_id"] is None else f"s{r['shape_id']}"
        rows.append(f"<tr data-variant='{esc(r['variant'])}'><td class='rnb-mono'><b>{esc(r['variant'])}</b> {status}</td>"
                    f"<td>{esc(r['kind'])}</td><td class='rnb-num'>{r['batch']}</td><td class='rnb-mono'>"
                    f"{esc(r['input_shape'])}</td><td class='rnb-mono'>{sid}</td><td class='rnb-mono'>{coll}</td>"
                    f"<td class='rnb-num'>{len(r['differs_from_base'])}</td><td class='rnb-num'>{esc(r['arena'])}</td></tr>")
    table = ("<table class='rnb-table'><tr><th>variant</th><th>runs</th><th class='rnb-num'>batch</th><th>input</th>"
             "<th>ShapeId</th><th>captures shared with</th><th class='rnb-num'>shapes ≠ train_base</th>"
             f"<th class='rnb-num'>arena</th></tr>{''.join(rows)}</table>")
    diff = ""
    if view["differing"]:
        head = "".join(f"<th>{esc(v)}</th>" for v in view["variants"])
        body = "".join(f"<tr><td class='rnb-mono'>{esc(d['name'])}</td>" + "".join(
            f"<td class='rnb-mono'>{esc(d['shapes'][v])}</td>" for v in view["variants"]) + "</tr>"
            for d in view["differing"][:24])
        diff = (f"<div class='rnb-h'>Tensors whose shape depends on the variant</div>"
                f"<table class='rnb-table'><tr><th>tensor</th>{head}</tr>{body}</table>")
    same = ""
    if view["offsets_identical"] is not None:
        same = ("<div class='rnb-ok'>✓ same tensors, same order, same offsets in every variant: only shapes differ"
                "</div>" if view["offsets_identical"] else "<div class='rnb-error'>offsets differ</div>")
    return f"<div class='rnb-variants'>{same}{table}{diff}</div>"


# ---- training ------------------------------------------------------------------------------------------
def metric_text(v: float | None, spec: str) -> str:
    """A metric as text; a diverged run's losses arrive as None (views.finite_or_none)."""
    return "not finite" if v is None else format(v, spec)


def _nan(values: list[float | None]) -> list[float]:
    """None -> NaN, which matplotlib leaves as a gap."""
    return [float("nan") if v is None else v for v in values]


def curve_x(view: dict[str, Any], kind: str) -> list[float]:
    """Epochs at the points of a per-step curve ("loss" or "lr"): one point per ``every`` steps, at
    its block's last step (views.step_curve; widgets/monitor.js places them the same way)."""
    values = view["step_losses"] if kind == "loss" else view["lr"]
    every = view.get(f"{kind}_every", 1)
    steps = view.get(f"{kind}_steps", len(values) * every)
    spe = max(view["steps_per_epoch"], 1)
    return [min((i + 1) * every, steps) / spe for i in range(len(values))]


def training_svg(view: dict[str, Any]) -> str:
    """The four monitor curves as one matplotlib SVG (a table if matplotlib is missing)."""
    recs = view["records"]
    if not recs and not view["step_losses"]:
        return "<div class='rnb-muted'>Not trained yet: task.run() fills these curves.</div>"
    try:
        import io

        import matplotlib
        from matplotlib.figure import Figure
    except ImportError:
        rows = "".join(
            f"<tr><td>{r['epoch']}</td><td>{metric_text(r['train_loss'], '.4f')}</td><td>{100 * r['train_top1']:.2f}%</td>"
            f"<td>{'' if r['val_top1'] is None else format(100 * r['val_top1'], '.2f') + '%'}</td></tr>"
            for r in recs)
        return f"<table class='rnb-table'><tr><th>epoch</th><th>loss</th><th>top-1</th><th>val top-1</th></tr>{rows}</table>"
    del matplotlib
    fig = Figure(figsize=(9.2, 4.6), dpi=96)
    axes = fig.subplots(2, 2)
    style = dict(color="#3b6fb6", linewidth=1.4)
    ax = axes[0][0]
    if view["step_losses"]:
        every = view.get("loss_every", 1)
        ax.plot(curve_x(view, "loss"), _nan(view["step_losses"]), color="#9db7df", linewidth=0.9,
                label="per step" if every == 1 else f"per {every} steps")
    ax.plot([r["epoch"] for r in recs], _nan([r["train_loss"] for r in recs]), "o-", label="train", **style)
    if recs and recs[-1]["val_loss"] is not None:
        ax.plot([r["epoch"] for r in recs], _nan([r["val_loss"] for r in recs]), "s--", color="#e07b39", label="val")
    ax.set_title("loss")
    ax = axes[0][1]
    ax.plot([r["epoch"] for r in recs], [100 * r["train_top1"] for r in recs], "o-", label="train", **style)
    if recs and recs[-1]["val_top1"] is not None:
        ax.plot([r["epoch"] for r in recs], [100 * r["val_top1"] for r in recs], "s--", color="#e07b39", label="val")
    ax.set_title("top-1 (%)")
    ax = axes[1][0]
    if view["lr"]:
        ax.plot(curve_x(view, "lr"), _nan(view["lr"]), color="#4f9d4a", linewidth=1.4)
        ax.set_ylim(0, max((v for v in view["lr"] if v is not None), default=0) * 1.15 or 1)
    ax.set_title("learning rate")
    ax = axes[1][1]
    ax.bar([r["epoch"] for r in recs], step_times(recs), color="#a58fd6", width=0.6)
    ax.set_title("step time (ms, incl. validation)")
    for row in axes:
        for a in row:
            a.spines[["top", "right"]].set_visible(False)
            a.tick_params(labelsize=8)
            a.title.set_fontsize(10)
            a.set_xlabel("epoch", fontsize=8)
            if a.get_legend_handles_labels()[0]:
                a.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    svg = buf.getvalue()
    return svg[svg.find("<svg"):]


def step_times(recs: list[dict[str, Any]]) -> list[float]:
    """Each epoch's ms per step as monitor.js draws its bars: a run's first step (kernels compiled or loaded,
    ``first_step_seconds``) is left out of its epoch's time and steps."""
    prev, out = 0, []
    for r in recs:
        first = r.get("first_step_seconds") or 0
        out.append(1e3 * (r["seconds"] - first) / max(r["steps"] - prev - (1 if first > 0 else 0), 1))
        prev = r["steps"]
    return out


def first_steps_note(recs: list[dict[str, Any]]) -> str:
    """monitor.js's note under the bars: the first steps they leave out ("" where none)."""
    firsts = [r for r in recs if (r.get("first_step_seconds") or 0) > 0]
    if not firsts:
        return ""
    says = ", ".join(f"epoch {r['epoch']} " + (f"{r['first_step_seconds']:.2f} s" if r["first_step_seconds"] >= 1
                                               else f"{1e3 * r['first_step_seconds']:.0f} ms") for r in firsts)
    return f"first step of a run (kernels compiled or loaded), not in the bars: {says}"


def training_html(view: dict[str, Any], status: str | None = None) -> str:
    """The monitor's saved copy: its status pill (``status``, else views.run_status: an interrupted run says so),
    the last epoch's figures, the curves and the bars' note."""
    recs = view["records"]
    last = recs[-1] if recs else None
    status = status or views.run_status(view)
    fill = RUN_STATUS_COLORS.get(status, IDLE_COLOR)
    pill = (f"<span class='rnb-pill' data-status='{esc(status)}' style='background:{fill};color:{ink_on(fill)}'>"
            f"{esc(status)}</span>")
    stats = f"<div class='rnb-row'>{pill}</div>"
    if last is not None:
        val = "" if last["val_top1"] is None else (f"<span class='rnb-stat'><b>{100 * last['val_top1']:.2f}%</b>"
                                                   "<span>val top-1</span></span>")
        stats = (f"<div class='rnb-row'>{pill}<span class='rnb-stat'><b>{last['epoch']}/{view['total_epochs']}</b>"
                 f"<span>epochs</span></span><span class='rnb-stat'><b>{metric_text(last['train_loss'], '.4f')}</b>"
                 f"<span>train loss</span></span>{val}</div>")
    note = first_steps_note(recs)
    note = f"<div class='rnb-note'>{esc(note)}</div>" if note else ""
    return f"<div class='rnb-training-static'>{stats}{training_svg(view)}{note}</div>"


# ---- graph -------------------------------------------------------------------------------------------------
def graph_html(task: Any, graph: str | None = None, gid: Any = None) -> str:
    from ..compiler.ids import GraphId
    from .graphdraw import default_collapsed, render_graph, run_order, static_svg

    graphs = views.graphs_of(task)
    if not graphs:
        return "<div class='rnb-note'>No graphs yet: lock_memory() (or add_graph()) builds them.</div>"
    name = graph if graph in graphs else next(iter(graphs))
    g = graphs[name]
    if gid is None and views.is_deep(task) and name == "train":
        gid = GraphId.DEEP_FWD_BWD
    plans = views.plans_of(task)
    plan = plans.get("train_base") or next(iter(plans.values()), None)
    hand = not views.is_deep(task) and not hasattr(task, "buckets")
    if hand and g.ids():  # a hand-built graph has one bucket: its stream, no GraphId
        gid = g.ids()[0]
    out = render_graph(g, gid, plan, default_collapsed(g, gid), gid_column=not hand, order=run_order(task, g))
    title = (f"graph {name!r}" if hand else
             f"{name} graph" + (f" · {GraphId(gid).name}" if gid is not None else " · all GraphIds"))
    body = static_svg(out["svg"]) if out["svg"] is not None else out["table"]
    note = f"<div class='rnb-note'>{esc(out['note'])}</div>" if out["note"] else ""
    return f"<div class='rnb-graph-static'><div class='rnb-sub'>{esc(title)}</div>{note}{body}</div>"


# ---- the whole dashboard -------------------------------------------------------------------------------------
def header_html(task: Any) -> str:
    phase = views.phase_of(task)
    colour = {"PLANNING": "#b9bec7", "MEMORY_LOCKED": "#e07b39", "COMPILED": "#3b6fb6"}.get(phase, "#3b6fb6")
    bits = [f"<span class='rnb-title'>{esc(getattr(task, 'name', 'task'))}</span>",
            f"<span class='rnb-pill' data-phase='{esc(phase)}' style='background:{colour}'>{esc(phase)}</span>"]
    plans = views.plans_of(task)
    if plans:
        p = next(iter(plans.values()))
        bits.append(f"<span class='rnb-muted'>arena <b>{esc(human_bytes(p.total_bytes))}</b> · "
                    f"{plural(len(p), 'tensor')}</span>")
    atlas = views.atlas_of(task)
    if atlas is not None:
        bits.append(f"<span class='rnb-muted'>{plural(len(atlas.captures), 'bound graph')}</span>")
    res = getattr(task, "result", None)
    if res is not None and res.history:
        bits.append(f"<span class='rnb-muted'>{plural(len(res.history), 'epoch')} · best top-1 "
                    f"<b>{100 * res.best_top1:.2f}%</b></span>")
    return f"<div class='rnb-header'>{''.join(bits)}</div>"


def inspector_section_html(task: Any) -> str:
    """The memory inspector as its live tab first shows it: at the peak of the first variant, nothing
    asked (inspector_view.MemoryInspectorView's starting picks), drawn by inspector_static.py."""
    from . import inspector_data, inspector_static  # the inspector's planning imports only when drawn

    if not views.plans_of(task):
        return f"<div class='rnb-note'>{esc(INSPECTOR_WAITS)}</div>"
    view = inspector_data.inspector_view(task)
    variants = view.get("variants") or ["train_base"]
    state = {"tick": int(view["peaks"][variants[0]]["time"]) if view.get("ready") else -1,
             "variant": "train_base" if "train_base" in variants else variants[0],
             "whatif": {}, "fit": {}, "tensor": {}, "selected": ""}
    return inspector_static.inspector_html(view, state)


SECTION_HTML: dict[str, Callable[[Any], str]] = {
    "Phases": lambda task: phase_html(views.phase_view(task)),
    "BluePrint": lambda task: blueprint_html(views.blueprint_view(task)),
    "Variants": lambda task: variants_html(views.variants_view(task)),
    "Memory": lambda task: (regions_html(views.region_view(task)) + "<div class='rnb-h'>Lifetimes</div>"
                            + lifetimes_html(views.lifetime_view(task))),
    "Inspector": inspector_section_html,
    "Graph": graph_html,
    "Atlas": lambda task: atlas_html(views.atlas_view(task)),
    "Training": lambda task: training_html(views.training_view(task)),
}
"""Each section's static HTML by title (sections.py lists them; the live dashboard keeps the same titles)."""


def dashboard_html(task: Any) -> str:
    """Every view of a task, one foldable section each (what a notebook shows without a kernel)."""
    parts = []
    for section in sections_of(task):
        title = section.title
        try:
            body = SECTION_HTML[title](task)
        except Exception as exc:  # a view must never break the whole page
            body = f"<div class='rnb-error'><b>{esc(title)} view failed</b>{esc(type(exc).__name__)}: {esc(exc)}</div>"
        parts.append(f"<details{' open' if section.opened else ''}><summary>{esc(title)}</summary><div>{body}</div>"
                     "</details>")
    return wrap(f"<div class='rnb-card rnb-dashboard-static'>{header_html(task)}{''.join(parts)}</div>")
