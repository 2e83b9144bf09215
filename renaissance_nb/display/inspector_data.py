"""The memory inspector's views: JSON-ready dictionaries read from ``task.memory_inspector``.

The widget (inspector_view.py) and its static copy (inspector_static.py) draw these. The answers
come from the engine (inspector/planview.py: ticks, producers, live bytes, peak, what_if, diff, fit;
compiler/touches.py: what each node reads and writes; inspector/tensorstats.py: values); this module
only reshapes them for drawing. The front end decides which tensors are live at a tick from the
intervals given here, by the engine's rule (a reusable tensor over its intervals, any other all step
long); a test checks that rule against ``MemoryInspector.live_at`` at every tick.
"""
from __future__ import annotations

from typing import Any

from ..compiler.touches import region_spans
from ..errors import RenaissanceError
from ..inspector.planview import CATEGORIES, MemoryInspector, category_of
from ..inspector.tensorstats import is_parameter, tensor_stats
from ..memory.plan import MemoryPlan
from ..optim import menu, menu_value
from ..text import human_bytes
from .sharing import focus_range, share_partners
from .theme import family_color, shape_text
from .views import accesses, finite_or_none

CATEGORY_FAMILY = {"weights": "W", "gradients": "G", "optimizer state": "M", "activations": "F",
                   "temporaries": "T", "inputs": "I", "results": "R", "scalars": "S"}
"""Each category drawn in the colour of its main region family (display/theme.py's palette)."""
MOVED_ROWS = 200
"""The most moved tensors a what-if answer lists (a ResNet's liveness switch moves hundreds)."""


def category_colors() -> list[dict[str, str]]:
    return [{"category": c, "color": family_color(CATEGORY_FAMILY[c])} for c in CATEGORIES]


def inspector_of(task: Any) -> tuple[MemoryInspector | None, str]:
    """The task's inspector, or None and why (a task without a model or data, a hand-built TaskBase)."""
    if not hasattr(type(task), "memory_inspector"):
        return None, "The memory inspector reads a DeepLearningTask's plan (a TaskBase has no step to scrub)."
    try:
        return task.memory_inspector, ""
    except RenaissanceError as exc:
        return None, f"No plan to inspect yet: {exc}"


class TensorIndex:
    """Per tensor, what the inspector looks up: the ticks that read it and those that write it
    (views.accesses: the region-wide ops' whole ranges included), and, asked the first time, the
    tensors sharing its bytes (sharing.share_partners: every overlapping pair of the plan, 0.4 s on a
    2,760-tensor ResNet). Made once per view; the ticks' read and write lists come from it too."""

    def __init__(self, insp: MemoryInspector) -> None:
        self.plan: MemoryPlan = insp.plan()
        self.reads, self.writes = accesses(insp.locked, self.plan)
        self._partners: dict[int, list[str]] | None = None

    def at_ticks(self) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
        """tick -> the tensor ids it reads, and those it writes (ascending ids)."""
        out: tuple[dict[int, list[int]], dict[int, list[int]]] = ({}, {})
        for by_tensor, by_tick in zip((self.reads, self.writes), out):
            for tid in sorted(by_tensor):
                for t in by_tensor[tid]:
                    by_tick.setdefault(t, []).append(tid)
        return out

    def partners(self, tid: int) -> list[str]:
        if self._partners is None:
            self._partners = share_partners(self.plan.shared_bytes())
        return self._partners.get(tid, [])


def _ticks(insp: MemoryInspector, index: TensorIndex) -> list[dict[str, Any]]:
    """Every node of the step: program, op, layer, GraphId, and the tensors it reads and writes (the
    region-wide ops' whole ranges included, compiler/touches.py), with those ranges named."""
    reads, writes = index.at_ticks()
    out = []
    for tk in insp.ticks():
        span_r, span_w = region_spans(tk.node)
        out.append({"t": tk.time, "program": tk.program, "gid": tk.gid.name, "op": tk.node.op, "layer": tk.node.layer,
                    "index": tk.index, "reads": reads.get(tk.time, []), "writes": writes.get(tk.time, []),
                    "declared": sorted(set(tk.node.inputs) | set(tk.node.outputs)),
                    "ranges_read": [f"{a}…{b}" for a, b in span_r], "ranges_written": [f"{a}…{b}" for a, b in span_w]})
    return out


def _tensors(insp: MemoryInspector) -> list[dict[str, Any]]:
    """Every tensor of the plan: place, category, colour, sizes per variant, live intervals (None: state,
    live all step), producer op and layer."""
    plan, variants = insp.plan(), insp.variants
    lives = insp.locked.lifetimes
    prod = insp.producers()
    out = []
    for t in plan:
        intervals = None if lives is None or not t.region.reusable else lives.get(t.id, ())
        tick = prod.get(t.id)
        out.append({"id": t.id, "name": t.name, "region": t.region.name, "family": t.region.family,
                    "category": category_of(t.region), "color": family_color(t.region.family),
                    "offset": int(t.offset or 0), "slot_bytes": int(t.slot_bytes), "dtype": str(t.dtype),
                    "shape": shape_text(t.shape), "storage": [int(insp.plan(v)[t.id].storage_bytes) for v in variants],
                    "intervals": None if intervals is None else [[int(a), int(b)] for a, b in intervals],
                    "producer": tick.node.op if tick else "-", "layer": tick.node.layer if tick else ""})
    return out


def _peak(insp: MemoryInspector, variant: str, ids: dict[str, int]) -> dict[str, Any]:
    rep = insp.peak(variant)
    cats = rep.by_category
    return {"bytes": rep.peak_bytes, "human": human_bytes(rep.peak_bytes), "arena": rep.arena_bytes, "time": rep.time,
            "program": rep.program, "op": rep.op, "layer": rep.layer, "summary": rep.summary(),
            "by_category": [{"category": c, "bytes": cats[c], "human": human_bytes(cats[c])} for c in CATEGORIES],
            "tensors": [[ids[t.name], t.nbytes] for t in rep.top(len(rep.tensors))]}


def current_settings(insp: MemoryInspector) -> dict[str, Any]:
    """The settings a what-if starts from, as the controls show them."""
    c = insp.config
    assert c.data is not None
    shape = c.data.train.sample_shape
    return {"batch_size": c.batch_size, "image": len(shape) == 3,
            "resolution": [int(shape[1]), int(shape[2])] if len(shape) == 3 else None,
            "liveness": c.liveness, "pad_rows": c.pad_rows, "fuse": c.fuse, "optimizer": menu_value(c.optimizer),
            "ema": c.ema is not None, "train_size": len(c.data.train)}


def inspector_view(task: Any) -> dict[str, Any]:
    """The whole inspector's data: the step's ticks, the tensors, live bytes per tick and the peak of
    every variant, and the settings a what-if starts from."""
    insp, why = inspector_of(task)
    if insp is None:
        return {"ready": False, "reason": why}
    return inspector_view_of(insp, str(getattr(task, "phase", "")))


def inspector_view_of(insp: MemoryInspector, phase: str = "", index: TensorIndex | None = None) -> dict[str, Any]:
    """The view of ``insp`` (see ``inspector_view``); ``index`` the TensorIndex its tensor views will use."""
    variants = insp.variants
    tensors = _tensors(insp)
    ids = {t["name"]: t["id"] for t in tensors}
    focus = focus_range((t for t in tensors if t["intervals"] is not None), insp.arena_bytes)
    return {"ready": True, "phase": phase, "compiled": phase == "COMPILED", "variants": variants,
            "arena_bytes": insp.arena_bytes, "arena_human": human_bytes(insp.arena_bytes),
            "ticks": _ticks(insp, index or TensorIndex(insp)), "tensors": tensors, "focus_range": focus,
            "curves": {v: [int(x) for x in insp.live_bytes(v)] for v in variants},
            "peaks": {v: _peak(insp, v, ids) for v in variants}, "categories": category_colors(),
            "settings": current_settings(insp), "optimizers": [{"value": e.value, "label": e.label} for e in menu()]}


# ---- what-if ------------------------------------------------------------------------------------------
def changes_from(insp: MemoryInspector, asked: dict[str, Any]) -> dict[str, Any]:
    """The what_if changes for the settings the controls ask for: only those that differ from now
    (a batch size with ``batch_changes``, so the validation batch follows it where it does now). An optimizer
    is passed by its menu name (optim.menu()), which what_if takes and labels the plan with."""
    now = current_settings(insp)
    out: dict[str, Any] = {}
    for key, value in asked.items():
        if key in now and value == now[key]:
            continue
        if key == "batch_size":
            out.update(insp.batch_changes(value) if isinstance(value, int) and not isinstance(value, bool)
                       else {"batch_size": value})
        elif key == "resolution":
            out["resolution"] = tuple(value) if isinstance(value, list) else value
        elif key == "ema":
            out["ema"] = (insp.config.ema or 0.999) if value is True else (None if value is False else value)
        else:
            out[key] = value
    return out


def _pairs(d: dict[str, tuple[int, int]], key: str) -> list[dict[str, Any]]:
    return [{key: k, "a": a, "b": b, "change": b - a} for k, (a, b) in d.items()]


def planned(insp: MemoryInspector, changes: dict[str, Any], cache: dict[str, Any] | None = None) -> MemoryInspector:
    """``insp.what_if(**changes)``, kept in ``cache`` (by the changes' repr) for the next variant or fit."""
    key = repr(sorted(changes.items()))
    if cache is not None and key in cache:
        return cache[key]
    other = insp.what_if(**changes)
    if cache is not None:
        cache[key] = other
    return other


def whatif_view(insp: MemoryInspector, asked: dict[str, Any], variant: str = "train_base",
                cache: dict[str, Any] | None = None) -> dict[str, Any]:
    """The current plan and a what-if one side by side in ``variant`` (``MemoryInspector.diff``): arena
    and peak, bytes by category, regions that grew or shrank, tensors that moved, resized, added or
    removed. ``cache``: the what-if plans made so far (``planned``)."""
    changes = changes_from(insp, asked)
    if not changes:
        return {"empty": True, "asked": asked}
    try:
        other = planned(insp, changes, cache)
        d = insp.diff(other, variant)
        peaks = (insp.peak(variant).peak_bytes, other.peak(variant).peak_bytes)
    except RenaissanceError as exc:
        return {"error": str(exc), "asked": asked}
    moved = list(d.moved.items())
    return {"asked": asked, "variant": variant, "label": other.label, "labels": list(d.labels), "summary": d.summary(),
            "arena": list(d.arena), "arena_human": [human_bytes(x) for x in d.arena], "peak": list(peaks),
            "peak_human": [human_bytes(x) for x in peaks],
            "categories": [{"category": r["category"], "a": r[d.labels[0]], "b": r[d.labels[1]], "change": r["change"]}
                           for r in d.rows()],
            "grew": [dict(row, color=family_color(_family(row["region"]))) for row in _pairs(d.grew, "region")],
            "shrank": [dict(row, color=family_color(_family(row["region"]))) for row in _pairs(d.shrank, "region")],
            "n_regions": len(d.regions), "moved": _pairs(dict(moved[:MOVED_ROWS]), "name"), "n_moved": len(moved),
            "resized": _pairs(d.resized, "name"), "added": list(d.added), "removed": list(d.removed)}


def _family(region: str) -> str:
    from ..memory.region import Region

    return Region[region].family


def fit_view(insp: MemoryInspector, budget: Any, label: str = "with the current settings") -> dict[str, Any]:
    """``fit(budget)``: the largest batch whose arena fits, with the arenas of that batch and the next."""
    try:
        best = insp.fit(budget)
        fits = insp.what_if(**insp.batch_changes(best)).arena_bytes
        assert insp.config.data is not None
        limit = len(insp.config.data.train)
        over = insp.what_if(**insp.batch_changes(best + 1)).arena_bytes if best < limit else None
    except RenaissanceError as exc:
        return {"budget": budget, "error": str(exc), "settings": label}
    return {"budget": int(budget), "budget_human": human_bytes(int(budget)), "batch": best, "arena": fits,
            "arena_human": human_bytes(fits), "next_arena": over,
            "next_human": None if over is None else human_bytes(over), "limit": limit, "settings": label}


# ---- one tensor ------------------------------------------------------------------------------------------
def _stats_dict(stats: Any) -> dict[str, Any]:
    v = stats.values
    out = {k: (finite_or_none(x) if isinstance(x, float) else x) for k, x in v.as_dict().items()}
    out["edges"] = [finite_or_none(e) for e in v.edges]
    u = stats.update
    out["update"] = None if u is None else {k: (finite_or_none(x) if isinstance(x, float) else x)
                                            for k, x in u.as_dict().items()}
    return out


def tensor_view(task: Any, insp: MemoryInspector, view: dict[str, Any], name: str,
                index: TensorIndex | None = None) -> dict[str, Any]:
    """One tensor: where and when it lives, who reads and writes it, and (compiled) what it holds.
    ``index``: the view's TensorIndex (made here when not given)."""
    row = next((t for t in view.get("tensors", ()) if t["name"] == name), None)
    if row is None:
        return {"name": name, "error": f"no tensor named {name!r} in this plan"}
    index = index or TensorIndex(insp)
    shares = sorted(set(index.partners(row["id"])))
    out = {**row, "reads_at": index.reads.get(row["id"], []), "writes_at": index.writes.get(row["id"], []),
           "shares": shares, "parameter": is_parameter(index.plan, name), "stats": None, "note": ""}
    if not view.get("compiled"):
        out["note"] = "Values are read from the arena once it exists: compile() the task."
        return out
    notes = []
    try:
        out["stats"] = _stats_dict(tensor_stats(task, name))
    except RenaissanceError as exc:
        notes.append(str(exc))
    if row["intervals"] is not None:
        notes.append("A reusable slot: the bytes hold what was written there last"
                     + (f" (shared with {', '.join(shares[:4])}{' …' if len(shares) > 4 else ''})" if shares else "")
                     + ", read now, between steps.")
    out["note"] = " ".join(notes)
    return out


def live_ids(view: dict[str, Any], time: int) -> list[int]:
    """The tensors live at ``time`` by the view's intervals: what the widget draws (widgets/inspector.js
    applies the same rule) and the static copy too."""
    return [t["id"] for t in view.get("tensors", ())
            if t["intervals"] is None or any(a <= time <= b for a, b in t["intervals"])]
