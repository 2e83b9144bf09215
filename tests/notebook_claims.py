"""What tests/test_notebooks.py asks of an executed notebook besides running: the claims its text makes
about its outputs, and its exercises.

Each notebook runs once, with one probe cell appended (``probe_source``): in the notebook's own kernel it
recomputes, independently of the cells that print them, the facts the text states (``FACTS``), and tries
every correct form of every exercise's answer on the check that posed it (renaissance_nb.exercises keeps
each check's expected value). ``CLAIMS`` then compares the printed text with those facts; nothing here is a
typed number.
"""
from __future__ import annotations

import json
import re
from typing import Any, Callable

PROBE_MARK = "RNB-PROBE "

FACTS: dict[str, str] = {
    "01_tour.ipynb": """{"pairs": len(task.memory.shared_bytes()),
        "grad": sum(a.region.name == b.region.name == "F_GRAD_SLOT_FP32" for a, b, _ in task.memory.shared_bytes()),
        "temp": sum(a.region is b.region and a.region.name.startswith("T_") for a, b, _ in task.memory.shared_bytes()),
        "feature": sum(a.region.name == b.region.name == "F_FEATURE_FP32" for a, b, _ in task.memory.shared_bytes())}""",
    "02_phases_by_hand.ipynb": """{"padded": [t.name for t in deep.memory if t.pitch] + [t.name for t in wider.memory if t.pitch]}""",
    "03_memory_plan.ipynb": """{"start": start_tick, "peak": insp.peak("train_base").time,
        "extra": sum(t.storage_bytes - t.nbytes for t in wide.memory if t.pitch),
        "grew": wide.memory.total_bytes - flat.memory.total_bytes,
        "slots": sum(align_up(t.slot_bytes) - align_up(flat.memory[t.name].slot_bytes) for t in wide.memory if t.pitch)}""",
    "04_graph_and_atlas.ipynb": """{"own": [g.name for g in GraphId
        if even.compiled.atlas.table[even.compiled.atlas.variants.index("train_last")][g] >= 0
        and even.compiled.atlas.table[even.compiled.atlas.variants.index("train_last")][g]
        != even.compiled.atlas.table[even.compiled.atlas.variants.index("train_base")][g]],
        "collapsed": dict(even.compiled.atlas.collapsed)}""",
    "05_training_and_determinism.ipynb": """{"missing": [g.name for v, g in ex.train_step_gids(variants, 0)
        if ex.entry(v, g) < 0]}""",
    "06_static_vs_dynamic.ipynb": """{"note": next(n for n in task.runner.notes if n.startswith("device"))}""",
    "07_on_a_gpu.ipynb": """{"note": next(n for n in reference.runner.notes if n.startswith("device"))}""",
    "08_image_models.ipynb": """{"base": list(task.shapes.specs["train_base"].input_shape),
        "lowres": list(task.shapes.specs["train_lowres"].input_shape),
        "conv1": list(task.plans["train_base"]["conv1.out"].shape)}""",
    "09_data_parallel.ipynb": """{"records": len(pulled["records"][by_rank[0]]), "shown": len(monitor.records),
        "line": monitor.one_line()}""",
}
"""Per notebook, a Python expression evaluated in its kernel after its last cell: the facts its text states."""


def placeholders(sources: list[str]) -> list[str]:
    """The example answers code cells offer (``my_x = None   # e.g. (64, 16)``), as source text."""
    found = []
    for src in sources:
        for m in re.finditer(r"^my_\w+\s*=\s*None\s*#\s*e\.g\.\s*(.+)$", src, re.M):
            found.append(m.group(1).strip())
    return found


def probe_source(name: str, sources: list[str]) -> str:
    """The cell appended to notebook ``name``: prints one JSON line of facts, forms and placeholders."""
    facts = FACTS.get(name, "{}")
    examples = placeholders(sources)
    return f"""
import json as _json
from renaissance_nb import exercises as _ex
_out = {{"facts": {facts}, "asked": {{}}, "placeholders": {{}}}}
for _name, _a in _ex.asked.items():
    _out["asked"][_name] = {{"want": repr(_a.want), "forms": [[repr(_f), bool(_a.accepts(_f))] for _f in _ex.forms(_a.want)]}}
for _src in {examples!r}:
    try:
        _value = eval(_src, {{}})
    except Exception:
        continue
    _out["placeholders"][_src] = [_n for _n, _a in _ex.asked.items() if _a.accepts(_value)]
print({PROBE_MARK!r} + _json.dumps(_out, default=str))
"""


def probe_result(nb: Any) -> dict[str, Any]:
    """The probe cell's JSON, from the last code cell's output."""
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
    line = next(ln for ln in text.splitlines() if ln.startswith(PROBE_MARK))
    return json.loads(line[len(PROBE_MARK):])


def printed(nb: Any) -> str:
    """Everything the notebook's cells printed or displayed as text or Markdown (the probe cell excluded)."""
    parts = []
    for cell in nb.cells[:-1]:
        for o in cell.get("outputs", []):
            if o.output_type == "stream":
                parts.append(o.text)
            elif o.output_type in ("display_data", "execute_result"):
                parts.append(o.data.get("text/markdown", "") or o.data.get("text/plain", ""))
    return "\n".join(parts)


def markdown(nb: Any) -> str:
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def check_lines(nb: Any) -> list[str]:
    """The lines exercise checks printed ("✓ ..." or "✗ ...")."""
    return [ln for ln in printed(nb).splitlines() if ln.startswith(("✓ ", "✗ "))]


# ---- the claims, one function per notebook: each asserts what the text says against the facts ----------
def _01(nb: Any, f: dict[str, Any]) -> None:
    out, text = printed(nb), markdown(nb)
    assert "only gradient slots can share" not in text
    assert f"In this plan **{f['pairs']}** pairs of tensors share bytes" in out
    for count, kind in ((f["grad"], "gradient slots"), (f["temp"], "temporaries"), (f["feature"], "feature maps")):
        assert (f"**{count}** of {kind}" in out) == bool(count), kind
    assert ("No feature map shares" in out) == (f["feature"] == 0)
    # the dashboard is live: the text must not say that after Run All only two tabs are filled
    assert "Right now only" not in text and "after *Run All*" in text
    # replay looks nothing up: 01, 04 and 05 agree on when the atlas is read
    assert "no lookup." not in text and "the atlas was read once, at `compile()`" in text


def _02(nb: Any, f: dict[str, Any]) -> None:
    exercises = markdown(nb).split("## Exercises")[1]
    assert f["padded"] == [] and "pitch" not in exercises and "padded" not in exercises


def _03(nb: Any, f: dict[str, Any]) -> None:
    out = printed(nb)
    assert f"the scrubber started at tick {f['start']}; the peak of train_base is at tick {f['peak']}" in out
    assert f["start"] == f["peak"], "the text says the scrubber starts at the peak"
    assert "The scrubber starts at the peak." not in markdown(nb)
    assert f"the slots take {f['slots']:,} bytes more, and the arena grows by {f['grew']:,}" in out
    assert f"({f['extra']:,} bytes)" in out
    assert ("the alignment is the difference" in out) == (f["slots"] == f["grew"])


def _04(nb: Any, f: dict[str, Any]) -> None:
    out, text = printed(nb), markdown(nb)
    assert f"train_last's entries not shared with train_base: {f['own'] or 'none'}" in out
    assert f["collapsed"].get("train_last") == "train_base"
    assert ("one GraphId of its own" in text) == (len(f["own"]) == 1)
    assert "at run time (phase C)" not in text and "once per step program" in text


def _05(nb: Any, f: dict[str, Any]) -> None:
    out, text = printed(nb), markdown(nb)
    assert f"**{len(f['missing'])}** GraphIds have no entry in this task" in out
    assert all(f"`{g}`:" in out for g in f["missing"])
    assert "those two GraphIds" not in text and "each an atlas lookup" not in text
    assert "these kernels, end to end, are the step's program: True" in out


def _kernels_named(nb: Any, f: dict[str, Any]) -> None:
    assert f["note"] in printed(nb)
    assert "numba kernels" not in markdown(nb), "the text must not say which kernels run: the note does"


def _08(nb: Any, f: dict[str, Any]) -> None:
    out, text = printed(nb), markdown(nb)
    base, low = tuple(f["base"][2:]), tuple(f["lowres"][2:])
    assert f"train_base: {base} pixels, train_lowres: {low} pixels" in out
    assert ("Here it is the higher one" in text) == (low > base)
    n, c, h, w = f["base"]
    assert f["conv1"][0] == n and f["conv1"][1:3] == [h, w] and f["conv1"][3] != c, "stored channels-last"
    assert "channels-last" in text and "like PyTorch)" not in text


def _09(nb: Any, f: dict[str, Any]) -> None:
    assert f["records"] > 0 and f["shown"] == f["records"] and not f["line"].startswith("not trained yet")
    assert f"the monitor read {f['records']} epoch records of rank 0: {f['line']}" in printed(nb)


CLAIMS: dict[str, Callable[[Any, dict[str, Any]], None]] = {
    "01_tour.ipynb": _01, "02_phases_by_hand.ipynb": _02, "03_memory_plan.ipynb": _03,
    "04_graph_and_atlas.ipynb": _04, "05_training_and_determinism.ipynb": _05,
    "06_static_vs_dynamic.ipynb": _kernels_named, "07_on_a_gpu.ipynb": _kernels_named,
    "08_image_models.ipynb": _08, "09_data_parallel.ipynb": _09,
}
"""The nine text/output mismatches of issue 41, each kept fixed by one function (06 and 07 share one)."""

