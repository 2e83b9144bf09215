"""The static copy of MemoryInspectorView: what a saved notebook shows without a kernel.

Drawn from the same view (inspector_data.py) and the picks of the live widget (its tick, variant,
what-if answer, fit answer and selected tensor), so the saved page shows what the user last saw.
SVG shapes carry <title>s: hovering names a tensor without JavaScript.
"""
from __future__ import annotations

from typing import Any

from ..text import human_bytes, plural
from .inspector_data import live_ids
from .theme import W, esc


def _chips(ids: list[int], by_id: dict[int, dict[str, Any]], cls: str, most: int = 24) -> str:
    names = "".join(f"<span class='rnb-tensor {cls}' data-tensor='{esc(by_id[i]['name'])}' "
                    f"style='border-color:{by_id[i]['color']}'>{esc(by_id[i]['name'])}</span>" for i in ids[:most])
    more = f" <span class='rnb-muted'>… {len(ids) - most} more</span>" if len(ids) > most else ""
    return (names + more) or "<span class='rnb-muted'>nothing</span>"


def strip_svg(view: dict[str, Any], tick: dict[str, Any], variant_i: int, lo: int, hi: int, cls: str) -> str:
    """The arena from ``lo`` to ``hi`` (bytes): live tensors at their offsets, coloured by family; the
    tensors the node reads outlined white-dashed, those it writes black."""
    span, h = max(hi - lo, 1), 30
    live = set(live_ids(view, tick["t"]))
    reads, writes = set(tick["reads"]), set(tick["writes"])
    parts = [f"<svg class='rnb-insp-strip {cls}' viewBox='0 0 {W} {h + 14}' xmlns='http://www.w3.org/2000/svg'>",
             f"<rect x='0' y='0' width='{W}' height='{h}' rx='5' fill='#f2f4f7'/>"]
    for t in view["tensors"]:
        if t["offset"] + t["slot_bytes"] <= lo or t["offset"] >= hi or not t["slot_bytes"]:
            continue
        x = (max(t["offset"], lo) - lo) / span * W
        w = max((min(t["offset"] + t["slot_bytes"], hi) - max(t["offset"], lo)) / span * W, 1.0)
        on = t["id"] in live
        stroke = ("#1f2328" if t["id"] in writes else "#ffffff" if t["id"] in reads else "none")
        dash = " stroke-dasharray='3 2'" if t["id"] in reads and t["id"] not in writes else ""
        parts.append(f"<rect data-tensor='{esc(t['name'])}' x='{x:.2f}' y='2' width='{w:.2f}' height='{h - 4}' "
                     f"fill='{t['color']}' fill-opacity='{1 if on else 0.12}' stroke='{stroke}' stroke-width='1.4'"
                     f"{dash}><title>{esc(t['name'])} · {esc(t['region'])} · offset {t['offset']:,} · "
                     f"{human_bytes(t['storage'][variant_i])}{' · live' if on else ''}</title></rect>")
    parts.append(f"<text x='0' y='{h + 12}' font-size='10' fill='#667085'>{lo:,}</text><text x='{W}' y='{h + 12}' "
                 f"font-size='10' fill='#667085' text-anchor='end'>{hi:,} bytes</text></svg>")
    return "".join(parts)


def curve_svg(curve: list[int], at: int, peak: int, cls: str = "rnb-insp-curve") -> str:
    """Live bytes over the step, the scrubber's tick marked (blue) and the peak (red)."""
    h, n, top = 90, max(len(curve) - 1, 1), max(max(curve, default=1), 1)
    pts = " ".join(f"{i / n * W:.1f},{h - v / top * (h - 6):.1f}" for i, v in enumerate(curve))

    def mark(t: int, colour: str, what: str) -> str:
        x = t / n * W
        v = curve[t] if 0 <= t < len(curve) else 0
        return (f"<line x1='{x:.1f}' x2='{x:.1f}' y1='0' y2='{h}' stroke='{colour}' stroke-width='1.5'>"
                f"<title>{what}: tick {t}, {human_bytes(v)} live</title></line>")
    return (f"<svg class='{cls}' viewBox='0 0 {W} {h + 14}' xmlns='http://www.w3.org/2000/svg'>"
            f"<polyline points='{pts}' fill='none' stroke='#3b6fb6' stroke-width='1.4'/>{mark(peak, '#c2334d', 'peak')}"
            f"{mark(at, '#1f2328', 'scrubber')}<text x='0' y='{h + 12}' font-size='10' fill='#667085'>tick 0</text>"
            f"<text x='{W}' y='{h + 12}' font-size='10' fill='#667085' text-anchor='end'>live bytes, peak "
            f"{human_bytes(top)}</text></svg>")


def stacked_svg(parts_: list[tuple[str, int, str]], total: int, cls: str = "rnb-insp-stack-svg", width: int = W) -> str:
    """One bar: (label, bytes, colour) side by side, to the scale of ``total`` bytes."""
    h, x = 22, 0.0
    out = [f"<svg class='{cls}' viewBox='0 0 {width} {h}' xmlns='http://www.w3.org/2000/svg'>"]
    for label, n, colour in parts_:
        if n <= 0:
            continue
        w = n / max(total, 1) * width
        out.append(f"<rect data-category='{esc(label)}' x='{x:.2f}' y='0' width='{max(w, 1):.2f}' height='{h}' "
                   f"fill='{colour}' stroke='#fff' stroke-width='0.8'><title>{esc(label)}: {human_bytes(n)}</title></rect>")
        x += w
    return "".join(out) + "</svg>"


def scrubber_html(view: dict[str, Any], state: dict[str, Any]) -> str:
    ticks = view["ticks"]
    tick = next((k for k in ticks if k["t"] == state["tick"]), ticks[0])
    by_id = {t["id"]: t for t in view["tensors"]}
    vi = view["variants"].index(state["variant"])
    curve = view["curves"][state["variant"]]
    bits = ([f"reads {', '.join(tick['ranges_read'])}"] if tick["ranges_read"] else []) + \
        ([f"writes {', '.join(tick['ranges_written'])}"] if tick["ranges_written"] else [])
    ranges = esc(" and ".join(bits))
    lo, hi = view["focus_range"]
    return (f"<div class='rnb-h'>Step scrubber · tick {tick['t']} ({ticks.index(tick) + 1} of {len(ticks)})</div>"
            f"<div class='rnb-insp-op'><b class='rnb-mono'>{esc(tick['op'])}</b> <span class='rnb-muted'>layer</span> "
            f"{esc(tick['layer'] or '-')} <span class='rnb-muted'>GraphId</span> <span class='rnb-mono'>"
            f"{esc(tick['gid'])}</span> <span class='rnb-muted'>in {esc(tick['program'])} · "
            f"{human_bytes(curve[tick['t']])} live</span>"
            + (f"<div class='rnb-muted'>region-wide: {ranges}</div>" if ranges else "")
            + f"</div><div class='rnb-insp-rw'><span class='rnb-k'>reads</span>{_chips(tick['reads'], by_id, 'rnb-read')}"
            f"</div><div class='rnb-insp-rw'><span class='rnb-k'>writes</span>{_chips(tick['writes'], by_id, 'rnb-write')}"
            f"</div><div class='rnb-sub'>The whole arena (live tensors coloured; read: white dashed, written: black)"
            f"</div>{strip_svg(view, tick, vi, 0, view['arena_bytes'], 'rnb-insp-arena')}"
            f"<div class='rnb-sub'>Feature maps and temporaries, bytes {lo:,}–{hi:,}</div>"
            f"{strip_svg(view, tick, vi, lo, hi, 'rnb-insp-focus')}"
            f"{curve_svg(curve, tick['t'], view['peaks'][state['variant']]['time'])}")


def peak_html(view: dict[str, Any], variant: str, rows: int = 15) -> str:
    p = view["peaks"][variant]
    colours = {c["category"]: c["color"] for c in view["categories"]}
    by_id = {t["id"]: t for t in view["tensors"]}
    legend = "".join(f"<span><span class='rnb-swatch' style='background:{colours[c['category']]}'></span>"
                     f"<b>{esc(c['category'])}</b> {esc(c['human'])}</span>" for c in p["by_category"] if c["bytes"])
    body = "".join(f"<tr data-tensor='{esc(by_id[i]['name'])}'><td class='rnb-mono'>{esc(by_id[i]['name'])}</td>"
                   f"<td>{esc(by_id[i]['category'])}</td><td class='rnb-num'>{human_bytes(n)}</td><td class='rnb-mono'>"
                   f"{esc(by_id[i]['producer'])}</td><td>{esc(by_id[i]['layer'] or '-')}</td></tr>"
                   for i, n in p["tensors"][:rows])
    more = (f"<div class='rnb-muted'>… and {plural(len(p['tensors']) - rows, 'smaller tensor')}</div>"
            if len(p["tensors"]) > rows else "")
    return (f"<div class='rnb-h'>Live at the peak · {esc(variant)}</div><div class='rnb-sub'>{esc(p['summary'])}</div>"
            f"{stacked_svg([(c['category'], c['bytes'], colours[c['category']]) for c in p['by_category']], p['bytes'])}"
            f"<div class='rnb-legend'>{legend}</div><table class='rnb-table rnb-insp-peak-table'><tr><th>tensor</th>"
            f"<th>category</th><th class='rnb-num'>bytes</th><th>written by</th><th>layer</th></tr>{body}</table>{more}")


def whatif_html(r: dict[str, Any], fit: dict[str, Any]) -> str:
    out = ["<div class='rnb-h'>What-if</div>"]
    if r.get("error"):
        out.append(f"<div class='rnb-error'>{esc(r['error'])}</div>")
    elif r and not r.get("empty"):
        a, b = r["labels"]
        cats = "".join(f"<tr><td>{esc(c['category'])}</td><td class='rnb-num'>{human_bytes(c['a'])}</td>"
                       f"<td class='rnb-num'>{human_bytes(c['b'])}</td><td class='rnb-num'>{_signed(c['change'])}</td></tr>"
                       for c in r["categories"] if c["a"] or c["b"])
        regions = "".join(f"<tr><td class='rnb-mono'>{esc(g['region'])}</td><td class='rnb-num'>{human_bytes(g['a'])}"
                          f"</td><td class='rnb-num'>{human_bytes(g['b'])}</td><td class='rnb-num'>{_signed(g['change'])}"
                          "</td></tr>" for g in r["grew"] + r["shrank"])
        moved = ", ".join(f"{esc(m['name'])} {m['a']:,}→{m['b']:,}" for m in r["moved"][:12])
        out.append(f"<div class='rnb-sub rnb-whatif-summary'>{esc(r['summary'])}</div><table class='rnb-table'><tr>"
                   f"<th></th><th class='rnb-num'>{esc(a)}</th><th class='rnb-num'>{esc(b)}</th><th class='rnb-num'>"
                   f"change</th></tr><tr><td><b>arena</b></td><td class='rnb-num'>{esc(r['arena_human'][0])}</td>"
                   f"<td class='rnb-num'>{esc(r['arena_human'][1])}</td><td class='rnb-num'>"
                   f"{_signed(r['arena'][1] - r['arena'][0])}</td></tr><tr><td><b>peak ({esc(r.get('variant', 'train_base'))})"
                   f"</b></td><td class='rnb-num'>"
                   f"{esc(r['peak_human'][0])}</td><td class='rnb-num'>{esc(r['peak_human'][1])}</td><td class='rnb-num'>"
                   f"{_signed(r['peak'][1] - r['peak'][0])}</td></tr>{cats}</table>"
                   + (f"<table class='rnb-table'><tr><th>region</th><th class='rnb-num'>{esc(a)}</th><th class='rnb-num'>"
                      f"{esc(b)}</th><th class='rnb-num'>change</th></tr>{regions}</table>" if regions else "")
                   + (f"<div class='rnb-muted'>moved: {moved}{' …' if r['n_moved'] > 12 else ''}</div>" if moved else ""))
    else:
        out.append("<div class='rnb-muted'>No other settings asked for: the live widget plans them.</div>")
    if fit.get("error"):
        out.append(f"<div class='rnb-error'>{esc(fit['error'])}</div>")
    elif fit:
        out.append(f"<div class='rnb-insp-fit'>{fit_text(fit)}</div>")
    return "".join(out)


def fit_text(fit: dict[str, Any]) -> str:
    nxt = (f"; batch {fit['batch'] + 1} would need {esc(fit['next_human'])}" if fit["next_human"]
           else f" (every sample of the training set: {fit['limit']})")
    return (f"Largest batch that fits in {esc(fit['budget_human'])} ({esc(fit['settings'])}): <b>{fit['batch']}</b>, "
            f"arena {esc(fit['arena_human'])}{nxt}")


def grad_text(u: dict[str, Any]) -> str:
    """The gradient norm as the update used it: after clipping, when clip_grad_norm is set, with the
    norm before (this tensor's G / the factor; clip.norm's whole-gradient norm)."""
    if u.get("clip_factor") is None:
        return f"gradient norm {num(u['grad_norm'])}"
    f, g = u["clip_factor"], u["grad_norm"]
    before = num(None if g is None or not f else g / f)
    return (f"gradient norm {num(g)} after clipping (×{num(f)}; {before} before, all gradients "
            f"{num(u['clip_norm'])} before)")


def num(x: float | None, spec: str = ".4g") -> str:
    """A number as the page prints it; a dash for None (a NaN or Inf the view could not send as JSON)."""
    return "—" if x is None else format(x, spec)


def _signed(n: int) -> str:
    return "0" if n == 0 else ("+" if n > 0 else "−") + human_bytes(abs(n))


def hist_svg(stats: dict[str, Any], cls: str = "rnb-insp-hist") -> str:
    counts, edges = stats["counts"], stats["edges"]
    if not counts:
        return "<div class='rnb-muted'>no finite value to draw</div>"
    w, h, top = 360, 80, max(max(counts), 1)
    bw = w / len(counts)
    bars = "".join(f"<rect x='{i * bw:.2f}' y='{h - c / top * h:.2f}' width='{max(bw - 1, 0.5):.2f}' "
                   f"height='{c / top * h:.2f}' fill='#3b6fb6'><title>[{num(edges[i])}, {num(edges[i + 1])}): {c}</title>"
                   "</rect>" for i, c in enumerate(counts))
    return (f"<svg class='{cls}' viewBox='0 0 {w} {h + 14}' xmlns='http://www.w3.org/2000/svg'>{bars}"
            f"<text x='0' y='{h + 12}' font-size='10' fill='#667085'>{num(edges[0])}</text><text x='{w}' y='{h + 12}' "
            f"font-size='10' fill='#667085' text-anchor='end'>{num(edges[-1])}</text></svg>")


def tensor_html(t: dict[str, Any], variants: list[str]) -> str:
    if not t:
        return ""
    if t.get("error"):
        return f"<div class='rnb-h'>Tensor</div><div class='rnb-error'>{esc(t['error'])}</div>"
    live = ("the whole step (state)" if t["intervals"] is None
            else ", ".join(f"ticks {a}–{b}" for a, b in t["intervals"]) or "never")
    groups: dict[int, list[str]] = {}
    for v, n in zip(variants, t["storage"]):
        groups.setdefault(n, []).append(v)
    sizes = (f"{human_bytes(t['storage'][0])} used in every variant" if len(groups) == 1
             else "; ".join(f"{human_bytes(n)} in {', '.join(vs)}" for n, vs in groups.items()))
    rows = [("shape", t["shape"] + " " + t["dtype"]), ("region", f"{t['region']} ({t['category']})"),
            ("offset", f"{t['offset']:,}"), ("bytes", f"{t['slot_bytes']:,}-byte slot; {sizes}"), ("live", live),
            ("written by", f"{t['producer']} ({t['layer'] or '-'})")]
    out = [f"<div class='rnb-h'>Tensor · {esc(t['name'])}</div><table class='rnb-table rnb-insp-tensor-table'>"
           + "".join(f"<tr><th>{k}</th><td class='rnb-mono'>{esc(v)}</td></tr>" for k, v in rows) + "</table>"]
    s = t.get("stats")
    if s:
        nums = " · ".join(f"{k} {num(s[k], '.6g')}" for k in ("min", "max", "mean", "std") if s[k] is not None)
        out.append(f"{hist_svg(s)}<div class='rnb-insp-stats'>{nums} · NaN {s['nan']} · Inf {s['inf']} · "
                   f"{s['size']:,} values</div>")
        u = s.get("update")
        if u:
            out.append(f"<div class='rnb-insp-update'>step {u['step']} (lr {num(u['lr'])}): {grad_text(u)}, "
                       f"|W| {num(u['weight_norm'])}, |dW| {num(u['update_norm'])}, update ratio |dW|/|W| "
                       f"{num(u['ratio'])} · <span class='rnb-muted'>{esc(u['how'])}</span></div>")
    if t.get("note"):
        out.append(f"<div class='rnb-muted'>{esc(t['note'])}</div>")
    return "".join(out)


def inspector_html(view: dict[str, Any], state: dict[str, Any]) -> str:
    """The whole static copy: scrubber at the widget's tick, the peak of its variant, the last what-if
    and fit answers, the selected tensor."""
    if not view.get("ready"):
        return f"<div class='rnb-note'>{esc(view.get('reason', 'No plan yet.'))}</div>"
    if not view["ticks"]:
        return "<div class='rnb-note'>The plan has no nodes to scrub.</div>"
    p = view["peaks"][state["variant"]]
    head = (f"<div class='rnb-row'><span class='rnb-title rnb-grow'>Memory inspector</span>"
            f"<span class='rnb-stat'><b>{esc(view['arena_human'])}</b><span>arena</span></span>"
            f"<span class='rnb-stat'><b>{esc(p['human'])}</b><span>peak ({esc(state['variant'])})</span></span>"
            f"<span class='rnb-stat'><b>{len(view['ticks'])}</b><span>nodes in the step</span></span></div>")
    return (f"<div class='rnb-card rnb-inspector-static'>{head}{scrubber_html(view, state)}"
            f"{peak_html(view, state['variant'])}{whatif_html(state['whatif'], state['fit'])}"
            f"{tensor_html(state['tensor'], view['variants'])}</div>")
