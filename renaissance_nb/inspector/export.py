"""The plan in other tools' formats: PyTorch's memory_viz snapshot and the Chrome Trace Event format.

Why: engineers already read memory in https://pytorch.org/memory_viz and in Perfetto/chrome://tracing;
a plan written in their formats opens there before any step has run. Time is the step's order
(one tick per node of the liveness timeline, inspector/planview.py), not seconds; addresses are
arena offsets (the arena is one segment).

* ``memory_viz_snapshot``: the dict ``torch.cuda.memory._snapshot()`` returns and memory_viz reads
  from a pickle: ``segments`` (the arena, its blocks the tensors live at the variant's peak, gaps
  inactive) and ``device_traces`` (each tensor allocated when its first interval starts and freed
  when each ends; stateful tensors allocated once, before the step). A block's "frame" names the
  tensor, its producer op and layer, so memory_viz's stacks read as the model's structure.
* ``chrome_trace``: one complete event per node (pid 0, one tid per program), and a counter of the
  live bytes per category at every tick. Given the kernels' measured times (``MemoryInspector.profile``,
  inspector/timings.py) it is laid out on a real time axis instead: the two training step programs
  (buffer A, then buffer B) end to end, each kernel a complete event as long as its median time
  (microseconds, the format's unit), the same live-bytes counters at each kernel's start; nodes no
  timed step ran (the validation programs) are named in ``otherData``, not drawn.
"""
from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

from ..errors import ExportError, bad_argument
from ..files import write_atomically
from ..memory.dtensor import align_up
from .planview import CATEGORIES, LiveTensor, MemoryInspector, Tick, category_of
from .timings import StepTimings

ARENA_ADDRESS = 0
"""The arena segment's address in the snapshot: tensors' addresses are their arena offsets."""


def _frames(t: LiveTensor) -> list[dict[str, Any]]:
    """memory_viz stack frames (innermost first) that name a tensor: tensor, producer, layer, category."""
    return [{"filename": t.name, "line": 0, "name": f"{t.producer} writes {t.name}"},
            {"filename": t.layer or "-", "line": 0, "name": f"layer {t.layer or '-'}"},
            {"filename": t.category, "line": 0, "name": t.category}]


def _block(t: LiveTensor, size: int) -> dict[str, Any]:
    return {"address": ARENA_ADDRESS + t.offset, "size": size, "requested_size": t.nbytes,
            "state": "active_allocated", "frames": _frames(t)}


def memory_viz_snapshot(inspector: MemoryInspector, variant: str = "train_base") -> dict[str, Any]:
    """The plan of ``variant`` as a memory_viz snapshot (pickle it, or use ``save_memory_viz``)."""
    plan = inspector.plan(variant)
    arena = plan.total_bytes
    peak = inspector.peak(variant)
    blocks: list[dict[str, Any]] = []
    cursor = 0
    for t in sorted(peak.tensors, key=lambda t: t.offset):
        if t.offset < cursor:  # a zero-size or packed-over tensor: memory_viz wants disjoint blocks
            continue
        if t.offset > cursor:
            blocks.append({"address": ARENA_ADDRESS + cursor, "size": t.offset - cursor, "requested_size": 0,
                           "state": "inactive", "frames": []})
        size = min(max(align_up(t.nbytes), 1), arena - t.offset)
        blocks.append(_block(t, size))
        cursor = t.offset + size
    if cursor < arena:
        blocks.append({"address": ARENA_ADDRESS + cursor, "size": arena - cursor, "requested_size": 0,
                       "state": "inactive", "frames": []})
    active = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    segment = {"device": 0, "address": ARENA_ADDRESS, "total_size": arena, "allocated_size": active,
               "active_size": active, "requested_size": sum(b["requested_size"] for b in blocks),
               "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
               "frames": [], "blocks": blocks}
    return {"segments": [segment], "device_traces": [_trace_entries(inspector, variant)],
            "allocator_settings": {"renaissance_nb": f"the arena of {variant}, planned"}}


def _trace_entries(inspector: MemoryInspector, variant: str) -> list[dict[str, Any]]:
    """alloc / free_requested / free_completed entries in tick order, after the arena's segment_alloc."""
    plan = inspector.plan(variant)
    lives = inspector.locked.lifetimes
    producers = inspector.producers()
    events: list[tuple[int, int, dict[str, Any]]] = []
    for t in plan:
        if t.storage_bytes == 0:
            continue
        tick = producers.get(t.id)
        live = LiveTensor(t.name, category_of(t.region), t.region.name, int(t.offset or 0), t.storage_bytes,
                          tick.node.op if tick else "-", tick.node.layer if tick else "", ())
        entry = {"addr": ARENA_ADDRESS + live.offset, "size": t.storage_bytes, "stream": 0, "frames": _frames(live)}
        intervals = lives.get(t.id, ()) if (lives is not None and t.region.reusable) else ()
        if not intervals:  # stateful (or never touched): allocated before the step, never freed
            events.append((-1, 0, {"action": "alloc", **entry, "time_us": -1}))
            continue
        for a, b in intervals:
            events.append((a, 1, {"action": "alloc", **entry, "time_us": a}))
            events.append((b + 1, 0, {"action": "free_requested", **entry, "time_us": b + 1}))
            events.append((b + 1, 0, {"action": "free_completed", **entry, "time_us": b + 1}))
    events.sort(key=lambda e: (e[0], e[1]))  # frees of a tick before its allocations
    start = {"action": "segment_alloc", "addr": ARENA_ADDRESS, "size": plan.total_bytes, "stream": 0,
             "frames": [], "time_us": -2}
    return [start] + [e for _, _, e in events]


def save_memory_viz(inspector: MemoryInspector, path: str | Path, variant: str = "train_base") -> Path:
    """Write the snapshot as the pickle https://pytorch.org/memory_viz opens (drag the file in)."""
    blob = pickle.dumps(memory_viz_snapshot(inspector, variant))
    return Path(write_atomically(path, lambda f: f.write(blob), op="save_memory_viz", error=ExportError,
                                 example="'plan.pickle'"))


def chrome_trace(inspector: MemoryInspector, variant: str = "train_base",
                 timings: StepTimings | None = None) -> dict[str, Any]:
    """The step as Trace Event JSON: a complete event ("X") per node, one thread per program, and a
    live-bytes counter ("C") per category at each event. Without ``timings`` time is the step order
    (one tick per node); with them, measured microseconds (see the module's doc)."""
    if timings is not None:
        return _timed_trace(inspector, variant, timings)
    ticks = inspector.ticks()
    programs = list(dict.fromkeys(k.program for k in ticks))
    events = _metadata(f"renaissance_nb plan ({variant}), 1 tick = 1 node", programs)
    names = {t.id: t.name for t in inspector.plan(variant)}
    for k in ticks:
        events.append(_node_event(names, k, k.time, 1, programs.index(k.program)))
    for k in ticks:
        events.append(_counter(inspector, variant, k, k.time))
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"arena_bytes": inspector.plan(variant).total_bytes, "time": "step order: one tick per node"}}


def _timed_trace(inspector: MemoryInspector, variant: str, timings: StepTimings) -> dict[str, Any]:
    """The training step programs end to end, each kernel as long as its measured median time."""
    if variant != "train_base":
        raise bad_argument(ExportError, "chrome_trace", "variant", variant,
                           "'train_base' with timings (the variant profile() times)",
                           "pass variant='train_base', or no timings for a plan-order trace")
    ticks = [k for k in inspector.ticks() if k.program.startswith("train step")]
    programs = list(dict.fromkeys(k.program for k in ticks))
    events = _metadata(f"renaissance_nb step ({variant}), measured over {timings.steps} steps", programs)
    names = {t.id: t.name for t in inspector.plan(variant)}
    clock, seen, missing = 0.0, dict.fromkeys(programs, 0), []
    counters: list[dict[str, Any]] = []
    in_graph: dict[tuple[str, Any], int] = {}
    for k in ticks:
        node_index = in_graph[k.program, k.gid] = in_graph.get((k.program, k.gid), -1) + 1  # as the bound kernel
        measured = timings.get(k.gid.name, node_index)
        if measured is None:
            missing.append(f"{k.program}: {k.gid.name}[{node_index}] {k.node.op}")
            continue
        if measured.op != k.node.op:
            raise ExportError(f"chrome_trace: node {node_index} of {k.gid.name} is {k.node.op} in this plan and "
                              f"{measured.op} in the timings. Fix: pass the profile() of this inspector's own task.")
        dur = measured.seconds * 1e6
        event = _node_event(names, k, clock, dur, programs.index(k.program))
        event["args"].update(median_us=dur, calls=measured.calls)
        events.append(event)
        counters.append(_counter(inspector, variant, k, clock))
        seen[k.program] += 1
        clock += dur
    measured_programs = [p for p in programs if seen[p]]
    other = [p for p in dict.fromkeys(t.program for t in inspector.ticks()) if p not in measured_programs]
    events += _whole_step(timings, len(programs))
    return {"traceEvents": events + counters, "displayTimeUnit": "ms",
            "otherData": {"arena_bytes": inspector.plan(variant).total_bytes,
                          "time": "measured: each kernel's median over the timed steps, in microseconds",
                          "step_seconds": timings.step_seconds, "steps": timings.steps, "replay": timings.replay,
                          "not_measured": missing + [f"{p} (not a training step)" for p in other]}}


def _whole_step(timings: StepTimings, tid: int) -> list[dict[str, Any]]:
    """A track of its own under the kernels: the whole step as run() replays it (one native call where the
    CPU step is captured, kernels/program.py), as long as its measured median; the kernels above it were
    timed one by one, so the gap between the two is what the capture saves."""
    whole = "native program" if timings.replay.startswith("CPU step captured as one native program") else "replay"
    track = f"step as run() replays it ({whole})"
    return [{"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "ts": 0, "args": {"name": track}},
            {"name": f"whole step ({whole})", "cat": "step", "ph": "X", "ts": 0.0, "dur": timings.step_seconds * 1e6,
             "pid": 0, "tid": tid, "args": {"replay": timings.replay, "median_us": timings.step_seconds * 1e6}}]


def _metadata(process: str, programs: list[str]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "ts": 0,
                                     "args": {"name": process}}]
    return events + [{"name": "thread_name", "ph": "M", "pid": 0, "tid": i, "ts": 0, "args": {"name": p}}
                     for i, p in enumerate(programs)]


def _node_event(names: dict[int, str], k: Tick, ts: float, dur: float, tid: int) -> dict[str, Any]:
    return {"name": k.node.op, "cat": k.gid.name, "ph": "X", "ts": ts, "dur": dur, "pid": 0, "tid": tid,
            "args": {"layer": k.node.layer, "graph": k.gid.name,
                     "reads": [names.get(i, str(i)) for i in k.node.inputs],
                     "writes": [names.get(i, str(i)) for i in k.node.outputs]}}


def _counter(inspector: MemoryInspector, variant: str, k: Tick, ts: float) -> dict[str, Any]:
    """Live bytes per category at a tick, as a counter event at ``ts``."""
    per = dict.fromkeys(CATEGORIES, 0)
    for t in inspector.live_at(k.time, variant):
        per[t.category] += t.nbytes
    return {"name": "live bytes", "ph": "C", "ts": ts, "pid": 0, "tid": 0, "args": per}


def save_chrome_trace(inspector: MemoryInspector, path: str | Path, variant: str = "train_base",
                      timings: StepTimings | None = None) -> Path:
    """Write the trace as JSON (open it in https://ui.perfetto.dev or chrome://tracing)."""
    blob = json.dumps(chrome_trace(inspector, variant, timings)).encode()
    return Path(write_atomically(path, lambda f: f.write(blob), op="save_chrome_trace", error=ExportError,
                                 example="'plan.json'"))
