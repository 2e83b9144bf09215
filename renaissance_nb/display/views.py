"""Views: JSON-ready dictionaries read from a task's artifacts.

Every widget and every static fallback draws one of these. They only *read*
what the compiler produced (phases, MemoryPlans, graphs, the GraphAtlas, the
TrainingResult); nothing here plans, packs or binds anything.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Mapping

from ..compiler.ids import GraphId
from ..compiler.touches import reduced_ids
from ..memory.liveness import Lifetimes, lifetimes_from_programs
from ..memory.plan import MemoryPlan
from ..text import bytes_versus, human_bytes, plural
from ..memory.region import FAMILIES, Region
from .sharing import focus_range, share_partners, shared_pairs
from .theme import clock, family_color, shape_text, share_colors, stream_color
from .training_view import (CURVE_POINTS, curve_every, finite_or_none, learning_rates, record_dict,  # noqa: F401
                            run_status, step_curve, training_view)  # the training views, kept in their own module

PHASES = ("PLANNING", "MEMORY_LOCKED", "COMPILED")


# ---- what a task has produced so far ------------------------------------------------------
def is_deep(task: Any) -> bool:
    return hasattr(task, "lock_memory") and hasattr(task, "plans")


def plans_of(obj: Any) -> dict[str, MemoryPlan]:
    """Finalized plans by variant from a task, a MemoryPlan or a dict of plans (empty if none yet)."""
    if isinstance(obj, MemoryPlan):
        return {obj.name: obj} if obj.finalized else {}
    if isinstance(obj, Mapping):
        return {k: p for k, p in obj.items() if isinstance(p, MemoryPlan) and p.finalized}
    plans = getattr(obj, "plans", None)
    if plans:
        return dict(plans)
    memory = getattr(obj, "memory", None)
    if isinstance(memory, MemoryPlan) and memory.finalized:
        return {memory.name: memory}
    return {}


def atlas_of(obj: Any):  # type: ignore[no-untyped-def]
    compiled = getattr(obj, "compiled", None)
    if compiled is not None:
        return compiled.atlas
    return obj if hasattr(obj, "captures") and hasattr(obj, "entries") else None


def graphs_of(obj: Any) -> dict[str, Any]:
    """ComputationGraphs by name ('train', 'inference'), or a hand-built task's graphs."""
    from ..compiler.graph import ComputationGraph

    if isinstance(obj, ComputationGraph):
        return {obj.name: obj}
    g = getattr(obj, "graphs", None)
    if g is not None and hasattr(g, "train"):
        return {"train": g.train, "inference": g.inference}
    if hasattr(g, "buckets"):
        return {g.name: g}
    hand = getattr(obj, "registered_graphs", None)
    if hand and not is_deep(obj):
        # TaskBase: named lists of nodes on a stream; show each as its own graph
        out = {}
        for name, (nodes, stream) in hand.items():
            cg = ComputationGraph(name)
            gid = next((gg for gg in GraphId if gg.stream is stream), GraphId.DEEP_FWD_BWD)
            for n in nodes:
                cg.append(gid, n)
            out[name] = cg
        return out
    return {}


def phase_of(task: Any) -> str:
    return str(getattr(task, "phase", "PLANNING"))


# ---- phases -----------------------------------------------------------------------------------
def phase_view(task: Any) -> dict[str, Any]:
    """The phase machine: which phase, what each allows, the transitions so far, the next actions."""
    from ..phases import PHASE_ALLOWS

    current = phase_of(task)
    ci = PHASES.index(current)
    deep = is_deep(task)
    allows = {p.value: [f"{op}()" for op in ops] for p, ops in PHASE_ALLOWS.items()}
    planned = getattr(task, "arch", None) is not None
    if deep:  # what the fluent builder offers on top of TaskBase's calls; plan() fixes the settings
        allows = {"PLANNING": (["settings fixed by plan(): reset() to change them", "lock_memory()", "compile()"]
                               if planned else ["change any setting", "plan()", "lock_memory()", "compile()"]),
                  "MEMORY_LOCKED": ["inspect plans and graphs", "compile()"],
                  "COMPILED": ["run()", "evaluate()", "predict()", "state_dict()"]}
    phases = [{"name": p, "state": "done" if i < ci else ("current" if i == ci else "todo"),
               "allows": allows.get(p, [])} for i, p in enumerate(PHASES)]
    history = [{"source": str(t.source), "target": str(t.target), "operation": t.operation,
                "at": clock(t.at), "seconds": float(t.seconds)} for t in getattr(task, "transitions", [])]
    if deep:
        actions = [
            {"name": "plan", "label": "plan()", "next": current == "PLANNING" and not planned,
             "enabled": current == "PLANNING" and not planned,
             "doc": "stages 1-2: layers and the tensors of all six variants"},
            {"name": "lock_memory", "label": "lock_memory()", "next": current == "PLANNING" and planned,
             "enabled": current == "PLANNING", "doc": "stages 3-4: graphs built, six MemoryPlans finalized"},
            {"name": "compile", "label": "compile()", "next": current == "MEMORY_LOCKED",
             "enabled": current != "COMPILED", "doc": "stage 5 (and any stage before it not done yet): atlas "
                                                       "filled, graphs bound, arena created"},
            {"name": "reset", "label": "reset()", "next": False, "enabled": current != "PLANNING" or planned,
             "doc": "discard the plan and go back to PLANNING (settings stay)", "confirm": reset_discards(task)},
        ]
        arrows = ["lock_memory()", "compile()"]
    else:
        actions = [
            {"name": "finalize_memory", "label": "finalize_memory()", "next": current == "PLANNING",
             "enabled": current == "PLANNING", "doc": "fix every offset and lock the layout"},
            {"name": "compile", "label": "compile()", "next": current == "MEMORY_LOCKED",
             "enabled": current == "MEMORY_LOCKED", "doc": "create the arena and bind every graph"},
        ]
        arrows = ["finalize_memory()", "compile()"]
    return {"task": getattr(task, "name", "task"), "kind": type(task).__name__, "current": current,
            "phases": phases, "arrows": arrows, "history": history, "actions": actions, "planned": planned,
            "colors": {"done": "#4f9d4a", "current": "#3b6fb6", "todo": "#b9bec7"}}


def reset_discards(task: Any) -> str:
    """What reset() throws away, for the question the phase view asks before it calls it."""
    lost = []
    if getattr(task, "arch", None) is not None:
        lost.append("the plan")
    if getattr(task, "compiled", None) is not None:
        lost.append("the arena and its trained weights")
    history = getattr(getattr(task, "result", None), "history", None) or ()
    if history:
        lost.append(f"the training history ({plural(len(history), 'epoch')})")
    what = ", ".join(lost) if lost else "nothing yet"
    return f"reset() discards {what} and goes back to PLANNING; the settings stay. Save a checkpoint first to keep them."


# ---- memory: regions and tensors ----------------------------------------------------------------
def reuse_text(plan: MemoryPlan) -> str:
    """What liveness reuse did to a plan's arena, the difference spelled out (see ``bytes_versus``)."""
    if not plan.reuse:
        return "liveness reuse off: every tensor has its own bytes"
    return "liveness reuse: arena " + bytes_versus(plan.total_bytes, plan.bytes_without_reuse, "without reuse")


def region_view(obj: Any) -> dict[str, Any]:
    """Regions by offset and size, tensors with their shape in every variant, families with colours."""
    plans = plans_of(obj)
    if not plans:
        return {"ready": False, "variants": [], "regions": [], "tensors": [], "families": []}
    variants = list(plans)
    ref = plans[variants[0]]
    specs = getattr(getattr(obj, "shapes", None), "specs", {}) or {}
    atlas = atlas_of(obj)
    collapsed = dict(getattr(atlas, "collapsed", {}) or {})
    vinfo = {}
    for v in variants:
        s = specs.get(v)
        vinfo[v] = {"input_shape": shape_text(s.input_shape) if s else "",
                    "batch": s.batch if s else None, "used": bool(s.used) if s else True,
                    "collapsed_to": collapsed.get(v)}
    tensors = []
    same = True
    reduced, reduced_text = _reduced(obj, ref)
    for t in ref:
        shapes = {v: list(plans[v][t.id].shape) for v in variants}
        nbytes = {v: plans[v][t.id].nbytes for v in variants}
        storage = {v: plans[v][t.id].storage_bytes for v in variants}  # with the padding of its rows
        if any(plans[v][t.id].offset != t.offset for v in variants):
            same = False
        tensors.append({"id": t.id, "name": t.name, "region": t.region.name, "family": t.region.family,
                        "dtype": t.dtype, "offset": t.offset, "slot_bytes": t.slot_bytes,
                        "end": t.offset + t.slot_bytes, "shapes": shapes, "nbytes": nbytes, "storage": storage,
                        "pitch": t.pitch, "reduced": t.id in reduced,
                        "color": family_color(t.region.family)})
    regions = []
    for r, span in ref.regions.items():
        if not span.size:
            continue
        regions.append({"region": r.name, "family": r.family, "family_name": FAMILIES.get(r.family, ""),
                        "base": span.base, "size": span.size, "end": span.end, "human": human_bytes(span.size),
                        "tensor_ids": list(span.tensor_ids), "reusable": r.reusable,
                        "size_without_reuse": span.size_without_reuse,
                        "saved": span.size_without_reuse - span.size, "color": family_color(r.family),
                        "reduced": bool(reduced & set(span.tensor_ids))})
    families = [{"family": f, "name": FAMILIES.get(f, ""), "bytes": n, "human": human_bytes(n),
                 "color": family_color(f), "share": n / ref.total_bytes if ref.total_bytes else 0.0}
                for f, n in ref.family_bytes().items()]
    return {"ready": True, "variants": variants, "variant_info": vinfo, "arena_bytes": ref.total_bytes,
            "arena_human": human_bytes(ref.total_bytes), "reuse": ref.reuse,
            "without_reuse": ref.bytes_without_reuse, "without_reuse_human": human_bytes(ref.bytes_without_reuse),
            "saved_human": human_bytes(max(0, ref.bytes_without_reuse - ref.total_bytes)),
            "reuse_text": reuse_text(ref),
            "offsets_text": f"same offsets in all {plural(len(variants), 'variant')}" if len(variants) > 1 else "",
            "offsets_identical": same, "regions": regions, "tensors": tensors, "families": families,
            "n_tensors": len(ref), "empty_text": empty_regions_text(ref), "reduced_text": reduced_text}


def _reduced(obj: Any, plan: MemoryPlan) -> tuple[set[int], str]:
    """The tensors a data-parallel step all-reduces over the ranks (its COMM nodes), and a sentence
    saying so; none and '' on one process."""
    graph = graphs_of(obj).get("train")
    ids = reduced_ids(graph, plan) if graph is not None else set()
    if graph is None or not ids:
        return ids, ""
    ranks = next(n.p["ranks"] for _, n in graph if "ranks" in n.p)
    regions = sorted({plan[i].region for i in ids})
    return ids, (f"⇄ all-reduced over {ranks} ranks every step: {plural(len(ids), 'gradient tensor')}, "
                 f"{human_bytes(sum(plan[i].storage_bytes for i in ids))} in {', '.join(r.name for r in regions)}")


def empty_regions_text(plan: MemoryPlan) -> str:
    """The named regions this plan leaves empty: the reserved ones by the feature they await, the rest
    as unused by this model (68 regions plus the END sentinel in all, as in the original)."""
    empty = [r for r in Region if r is not Region.END and not plan.regions.get(r, None)]
    reserved: dict[str, list[str]] = {}
    for r in empty:
        if r.reserved_for:
            reserved.setdefault(r.reserved_for.split(":")[0], []).append(r.name)
    unused = [r.name for r in empty if not r.reserved_for]
    bits = [f"{plural(len(names), 'reserved region')} for {what} ({', '.join(names)})"
            for what, names in reserved.items()]
    if unused:
        bits.append(f"{plural(len(unused), 'region')} this model does not use ({', '.join(unused)})")
    return f"{plural(len(empty), 'of 68 regions is', 'of 68 regions are')} empty: " + "; ".join(bits) if empty else ""


# ---- memory: lifetimes -------------------------------------------------------------------------------
def _programs(graphs: Any) -> list[tuple[str, list[tuple[Any, Any]] | None, int]]:
    """The engine's liveness programs: (title, [(GraphId, node)], length), as the compiler runs them."""
    from ..compiler.stages import labelled_programs

    return [(title, nodes, len(nodes)) for title, nodes in labelled_programs(graphs)]


def _hand_programs(obj: Any) -> list[tuple[str, list[tuple[Any, Any]] | None, int]]:
    """A hand-built task's graphs as liveness programs, one per graph in registration order."""
    if is_deep(obj):
        return []
    out = []
    for name, (nodes, stream) in (getattr(obj, "registered_graphs", None) or {}).items():
        tag = SimpleNamespace(name=name, stream=stream)  # labels a step like a GraphId: the graph's name
        out.append((f"graph {name!r}", [(tag, n) for n in nodes], len(nodes)))
    return out


def graph_lifetimes(obj: Any) -> Lifetimes:
    """Lifetimes from a task's graphs, whether or not its plan packed by them (liveness off, TaskBase).

    The same timeline the engine packs by (``compiler.graph_lifetimes``) for a DeepLearningTask;
    a hand-built task's graphs laid end to end. Empty before there are graphs.
    """
    graphs = getattr(obj, "graphs", None)
    if graphs is not None and hasattr(graphs, "train"):
        from ..compiler import stages as compiler

        return compiler.graph_lifetimes(graphs)
    return lifetimes_from_programs([[(n.inputs, n.outputs) for _, n in nodes or ()]
                                    for _, nodes, _ in _hand_programs(obj)])


def _programs_of(obj: Any) -> list[tuple[str, list[tuple[Any, Any]] | None, int]]:
    """A DeepLearningTask's step programs, as the compiler runs them, or a hand-built task's graphs."""
    graphs = getattr(obj, "graphs", None)
    return _programs(graphs) if graphs is not None and hasattr(graphs, "train") else _hand_programs(obj)


def _timeline_labels(obj: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """Which node runs at each time index of the liveness timeline (None if unknown)."""
    programs_ = _programs_of(obj)
    if not programs_:
        return None
    steps: list[dict[str, Any]] = []
    programs: list[dict[str, Any]] = []
    t0 = 0
    blank = {"op": "", "layer": "", "gid": "", "stream": "", "color": ""}
    for title, nodes, length in programs_:
        programs.append({"name": title, "start": t0, "end": t0 + length - 1})
        for i in range(length):
            if nodes is None:
                steps.append({"t": t0 + i, **blank})
            else:
                gid, n = nodes[i]
                steps.append({"t": t0 + i, "op": n.op, "layer": n.layer, "gid": gid.name,
                              "stream": gid.stream.name, "color": stream_color(gid.stream.name)})
        t0 += length + 1
        steps.append({"t": t0 - 1, **blank})  # the gap between programs
    return steps[:-1], programs


def accesses(obj: Any, plan: MemoryPlan) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """tensor id -> the timeline steps that read it, and those that write it, the region-wide operands of
    the optimizer, NaN check, clipping and EMA included (compiler.touches.node_access)."""
    from ..compiler.touches import node_access

    programs_ = _programs_of(obj)
    reads: dict[int, list[int]] = {}
    writes: dict[int, list[int]] = {}
    t0 = 0
    for _, nodes, length in programs_:
        for i, (_, n) in enumerate(nodes or ()):
            r, w = node_access(n, plan)
            for tid in r:
                reads.setdefault(tid, []).append(t0 + i)
            for tid in w:
                writes.setdefault(tid, []).append(t0 + i)
        t0 += length + 1
    return reads, writes


def lifetime_view(obj: Any, variant: str | None = None) -> dict[str, Any]:
    """Step order x offset: one box per tensor interval, and which tensors share bytes.

    With liveness reuse off the plan holds no lifetimes; they are then read from the graphs
    (``graph_lifetimes``), so the chart still shows when each tensor lives, every box unshared.
    """
    plans = plans_of(obj)
    if not plans:
        return {"ready": False, "tensors": [], "steps": [], "programs": [], "shared": []}
    plan = plans[variant] if variant in plans else next(iter(plans.values()))
    life = plan.lifetimes or graph_lifetimes(obj)
    labels = _timeline_labels(obj)
    steps, programs = labels if labels else ([], [])
    pairs = plan.shared_bytes()  # tensors whose slots overlap in bytes: their lifetimes never meet
    shared, partners = shared_pairs(pairs), share_partners(pairs)
    tensors = []
    reads, writes = accesses(obj, plan)
    t_max = max((e for iv in life.values() for _, e in iv), default=0)
    t_max = max([t_max, len(steps) - 1, *(t for ts in (*reads.values(), *writes.values()) for t in ts)])
    for t in plan:
        iv = life.get(t.id)
        persistent = not t.region.reusable  # state that outlives the step: weights, grads, moments, EMA...
        if persistent:
            iv = [(0, t_max)]
        if not iv:
            continue
        tensors.append({"id": t.id, "name": t.name, "region": t.region.name, "family": t.region.family,
                        "offset": t.offset, "slot_bytes": t.slot_bytes, "shape": list(t.shape), "dtype": t.dtype,
                        "intervals": [[int(a), int(b)] for a, b in iv], "reusable": t.region.reusable,
                        "persistent": persistent, "reads": reads.get(t.id, []), "writes": writes.get(t.id, []),
                        "shares": partners.get(t.id, []), "color": family_color(t.region.family)})
    if not steps and tensors:
        steps = [{"t": i, "op": "", "layer": "", "gid": "", "stream": "", "color": "#8a8f98"}
                 for i in range(t_max + 1)]
    lo, hi = focus_range((t for t in tensors if t["reusable"]), plan.total_bytes)
    return {"ready": True, "variant": plan.name, "reuse": plan.reuse, "tensors": tensors, "steps": steps,
            "programs": programs, "shared": shared, "arena_bytes": plan.total_bytes,
            "lifetimes_from": "plan" if plan.lifetimes else "graphs",
            "focus_range": [lo, hi], "saved": max(0, plan.bytes_without_reuse - plan.total_bytes),
            "saved_human": human_bytes(max(0, plan.bytes_without_reuse - plan.total_bytes)),
            "arena_human": human_bytes(plan.total_bytes),
            "without_reuse_human": human_bytes(plan.bytes_without_reuse),
            "summary": _lifetime_summary(plan, shared, bool(tensors)), "families": _families_drawn(tensors, plan)}


def _families_drawn(tensors: list[dict[str, Any]], plan: MemoryPlan) -> list[dict[str, Any]]:
    """The legend: one entry per region family drawn (the palette of every view), its regions and bytes.

    ``bytes`` is the family's share of the arena, as the region map counts it (``plan.family_bytes``);
    ``slots`` adds up its tensors' slots, more than ``bytes`` where liveness reuse packs them onto the same
    bytes; ``note`` says so."""
    out: dict[str, dict[str, Any]] = {}
    for t in tensors:
        f = out.setdefault(t["family"], {"family": t["family"], "name": FAMILIES.get(t["family"], t["family"]),
                                         "color": family_color(t["family"]), "regions": [], "slots": 0})
        if t["region"] not in f["regions"]:
            f["regions"].append(t["region"])
        f["slots"] += t["slot_bytes"]
    arena = plan.family_bytes()
    for f in out.values():
        f["bytes"] = int(arena.get(f["family"], f["slots"]))
        f["human"] = human_bytes(f["bytes"])
        f["note"] = (f"its tensors' slots add up to {human_bytes(f['slots'])}: liveness reuse packs them into "
                     f"{human_bytes(f['bytes'])}" if f["slots"] > f["bytes"] else "")
    return list(out.values())


def _lifetime_summary(plan: MemoryPlan, shared: list[dict[str, Any]], any_lifetimes: bool) -> str:
    """The sentence above the chart, the same in the widget and the static copy."""
    n = len(shared)
    if not plan.reuse:
        return ("Liveness reuse is off: every tensor keeps its own bytes, so no box shares its bytes with another"
                + (" (the lifetimes come from the graphs)." if any_lifetimes else
                   "; there are no graphs yet to tell when each tensor lives."))
    pairs = (f"{plural(n, 'pair')} of tensors share{'s' if n == 1 else ''} bytes: their boxes stack on the same "
             "offsets at different times." if n else "No two feature or temporary tensors of this plan share bytes.")
    return f"{reuse_text(plan)[0].upper()}{reuse_text(plan)[1:]}. {pairs}"


# ---- atlas ------------------------------------------------------------------------------------------
def atlas_view(obj: Any) -> dict[str, Any]:
    """Variants x GraphIds with ShapeId, stream and captured index; shared captures grouped by colour."""
    atlas = atlas_of(obj)
    if atlas is None:
        return {"ready": False, "variants": [], "graph_ids": [], "cells": {}}
    uses: dict[int, int] = {}
    for e in atlas.entries.values():
        uses[e.captured_index] = uses.get(e.captured_index, 0) + 1
    # coloured by what a cell shares: the variants one bound graph serves (a row's cells of one colour
    # share it; the same colour in another row, the same variants share there); grey, used once
    sharers: dict[int, list[str]] = {}
    for (v, _), e in atlas.entries.items():
        sharers.setdefault(e.captured_index, []).append(v)
    patterns: dict[tuple[str, ...], int] = {}
    for (v, _), e in sorted(atlas.entries.items(), key=lambda kv: -uses[kv[1].captured_index]):
        if uses[e.captured_index] > 1:
            patterns.setdefault(tuple(sorted(set(sharers[e.captured_index]), key=list(atlas.variants).index)),
                                len(patterns))
    cells: dict[str, dict[str, Any]] = {}
    for (v, gid), e in atlas.entries.items():
        pattern = tuple(sorted(set(sharers[e.captured_index]), key=list(atlas.variants).index))
        color, ink = share_colors(patterns.get(pattern))
        cells.setdefault(v, {})[gid.name] = {
            "captured": e.captured_index, "shape_id": e.shape_id, "stream": e.stream.name, "graph": e.graph,
            "gid": gid.name, "variant": v, "shared_by": uses[e.captured_index], "pattern": list(pattern),
            "color": color, "ink": ink, "stream_color": stream_color(e.stream.name)}
    gids = atlas.graph_ids()
    return {"ready": True, "variants": list(atlas.variants), "graph_ids": [g.name for g in gids],
            "streams": {g.name: g.stream.name for g in gids},
            "stream_colors": {g.stream.name: stream_color(g.stream.name) for g in gids},
            "cells": cells, "captures": len(atlas.captures), "entries": len(atlas.entries),
            "shape_ids": {str(k): shape_text(v) for k, v in atlas.shape_ids.items()},
            "collapsed": dict(atlas.collapsed), "unused": sorted(atlas.unused),
            "patterns": [{"variants": list(p), "color": share_colors(k)[0], "ink": share_colors(k)[1]}
                         for p, k in patterns.items()]}


# ---- blueprint and variants ---------------------------------------------------------------------------
def _param_count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def blueprint_view(task: Any) -> dict[str, Any]:
    """The declared model, the executable layers after fusion, and the task's settings."""
    bp = getattr(task, "blueprint", None)
    arch = getattr(task, "arch", None)
    shapes = getattr(task, "shapes", None)
    layers = []
    if arch is not None:
        io = {}
        if shapes is not None:
            io = {name: (i, o) for name, i, o in shapes.tables["train_base"].layer_shapes}
        params = {}
        if shapes is not None:
            for p in shapes.tables["train_base"].params:  # parameters, as torch counts them: BN's
                if p.trainable:                              # running statistics are buffers
                    owner = p.layer.split(".", 1)[0]  # se1.fc1's weights count for se1
                    params[owner] = params.get(owner, 0) + _param_count(p.shape)
        for layer in arch.layers:
            i, o = io.get(layer.name, (None, None))
            what = layer.describe().split(": ", 1)[-1].split("  <- ", 1)[0]
            layers.append({"name": layer.name, "kind": layer.kind, "describe": what,
                           "reads": [str(x) for x in getattr(layer, "inputs", ())],
                           "in": shape_text(i) if i else "", "out": shape_text(o) if o else "",
                           "params": params.get(layer.name, 0)})
    cfg = getattr(task, "settings", None)
    settings = []
    if isinstance(cfg, dict):
        if cfg["data"] is not None:
            settings.append(("data", repr(cfg["data"])))
        settings += [("batch size", str(cfg["batch_size"])), ("epochs", str(cfg["total_epochs"])),
                     ("steps per epoch", str(getattr(task, "steps_per_epoch", ""))),
                     ("loss", repr(cfg["loss"])), ("optimizer", repr(cfg["optimizer"])),
                     ("scheduler", repr(cfg["scheduler"]) if cfg["scheduler"] is not None else "constant lr"),
                     ("seed", str(cfg["seed"]))]
        if cfg["ema"] is not None:
            settings.append(("EMA decay", str(cfg["ema"])))
        if cfg.get("clip_grad_norm") is not None:
            settings.append(("gradient clipping", f"total 2-norm at most {cfg['clip_grad_norm']:g}"))
        if cfg["train_resolution"] is not None:
            (h0, w0), (h1, w1), b = cfg["train_resolution"]
            settings.append(("progressive resizing", f"{h0}x{w0} then {h1}x{w1} from epoch {b + 1}"))
        settings.append(("compiler options", ", ".join(f"{k}={v}" for k, v in cfg["options"].items())))
    return {"tree": bp.tree() if bp is not None else "", "layers": layers,
            "fused": list(arch.fused) if arch is not None else [], "settings": settings,
            "total_params": sum(l["params"] for l in layers), "planned": arch is not None}


def variants_view(task: Any) -> dict[str, Any]:
    """The six variants: input shape, use, ShapeId, collapse, and the tensors whose shape differs."""
    shapes = getattr(task, "shapes", None)
    if shapes is None:
        return {"ready": False, "rows": [], "differing": []}
    plans = plans_of(task)
    atlas = atlas_of(task)
    sid_of = {}
    if atlas is not None:
        sid_of = {tuple(v): k for k, v in atlas.shape_ids.items() if v is not None}
    base = shapes.tables["train_base"].specs
    rows = []
    for v, spec in shapes.specs.items():
        table = shapes.tables[v].specs
        differ = [t.name for a, t in zip(base, table) if a.shape != t.shape]
        rows.append({"variant": v, "kind": "train" if spec.is_train else "validation", "batch": spec.batch,
                     "input_shape": shape_text(spec.input_shape), "used": bool(spec.used),
                     "shape_id": sid_of.get(tuple(spec.input_shape)),
                     "collapsed_to": (atlas.collapsed.get(v) if atlas is not None else None),
                     "differs_from_base": differ,
                     "arena": human_bytes(plans[v].total_bytes) if v in plans else ""})
    diff_names = sorted({n for r in rows for n in r["differs_from_base"]})
    ids = shapes.tables["train_base"].ids
    differing = [{"name": n, "shapes": {v: shape_text(shapes.tables[v].specs[ids[n]].shape) for v in shapes.specs}}
                 for n in diff_names]
    same = None
    if plans:
        ref = next(iter(plans.values()))
        same = all(p[t.id].offset == t.offset for p in plans.values() for t in ref)
    return {"ready": True, "rows": rows, "differing": differing, "offsets_identical": same,
            "variants": list(shapes.specs)}
