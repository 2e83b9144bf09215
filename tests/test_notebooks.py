"""Every notebook runs top to bottom in a real kernel, quickly, shows its widgets, says what its outputs
show, and poses exercises that teach.

The notebooks are stored without outputs; here each one is executed once with nbclient (kernel python3)
in a temporary copy, with one probe cell appended (tests/notebook_claims.py), and its outputs are
checked: no errors; the widget views (application/vnd.jupyter.widget-view+json) it is meant to show;
the claims its text makes about its outputs; and its exercises, whose answers are left at None: each
check says "not yet" without giving the answer away, and accepts every correct form of the answer.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from notebook_claims import CLAIMS, check_lines, markdown, probe_result, probe_source

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
WIDGET = "application/vnd.jupyter.widget-view+json"
LIMIT_S = float(os.environ.get("RNB_NOTEBOOK_SECONDS", "120"))

# the widget views each notebook must show (at least)
EXPECTED_WIDGETS = {
    "01_tour.ipynb": 10,
    "02_phases_by_hand.ipynb": 5,
    "03_memory_plan.ipynb": 5,
    "04_graph_and_atlas.ipynb": 4,
    "05_training_and_determinism.ipynb": 1,
    "06_static_vs_dynamic.ipynb": 0,
    "07_on_a_gpu.ipynb": 1,
    "08_image_models.ipynb": 2,
    "09_data_parallel.ipynb": 3,
    "10_build_a_planner.ipynb": 0,
    "11_from_python_to_graph.ipynb": 0,
    "12_small_gpt_memory.ipynb": 3,
    "13_mixed_precision.ipynb": 1,
}
NEEDS = {"09_data_parallel.ipynb": ("mpi4py", "ipyparallel")}
ENV = {"12_small_gpt_memory.ipynb": {"RNB_GPT_TRAIN_SECONDS": "15"}}
"""Settings a notebook reads (its training budget: three minutes for a reader, seconds under test)."""  # the [mpi] extra (in [test]): skipped without it
_RUNS: dict[str, tuple[Any, float]] = {}


def executed(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, float]:
    """The notebook run once (with the probe cell appended) and the seconds it took; later tests reuse it."""
    if path.name in _RUNS:
        return _RUNS[path.name]
    for module in NEEDS.get(path.name, ()):
        pytest.importorskip(module, reason=f"{path.name} needs {module} (pip install 'renaissance_nb[mpi]')")
    # the kernel inherits this environment: it imports renaissance_nb from this checkout
    for key, value in ENV.get(path.name, {}).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(probe_source(path.name, [c.source for c in nb.cells if c.cell_type == "code"])))
    client = nbclient.NotebookClient(nb, timeout=LIMIT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    started = time.perf_counter()
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as err:  # pragma: no cover - reported with the cell
        pytest.fail(f"{path.name} failed:\n{str(err)[-3000:]}", pytrace=False)
    _RUNS[path.name] = (nb, time.perf_counter() - started)
    return _RUNS[path.name]


def test_all_notebooks_are_listed() -> None:
    assert [p.name for p in NOTEBOOKS] == list(EXPECTED_WIDGETS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_stored_without_outputs_and_linked_to_the_glossary(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.get("outputs") == [], f"{path.name}: a code cell has stored outputs"
            assert cell.get("execution_count") is None, f"{path.name}: a code cell has an execution count"
    assert "widgets" not in nb.metadata, "no saved widget state"
    assert "](../docs/glossary.md)" in markdown(nb)
    assert (ROOT / "docs" / "glossary.md").is_file()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nb, elapsed = executed(path, tmp_path, monkeypatch)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors, [f"{o.ename}: {o.evalue}" for o in errors]
    tracebacks = [o.text for o in outputs if o.output_type == "stream" and o.name == "stderr" and "Traceback" in o.text]
    assert not tracebacks, tracebacks
    widgets = [o for o in outputs if o.output_type in ("display_data", "execute_result") and WIDGET in o.data]
    assert len(widgets) >= EXPECTED_WIDGETS[path.name], f"{path.name}: {len(widgets)} widget views"
    for o in widgets:  # every widget also carries its static fallback for nbconvert / GitHub
        if "tqdm" in o.data.get("text/plain", "") or "%|" in o.data.get("text/plain", ""):
            continue
        assert "text/html" in o.data or "text/plain" in o.data
    assert elapsed < LIMIT_S, f"{path.name} took {elapsed:.0f}s (limit {LIMIT_S:.0f}s)"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_exercises_left_unanswered_say_not_yet_and_accept_every_correct_form(
        path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nb, _ = executed(path, tmp_path, monkeypatch)
    probe, lines = probe_result(nb), check_lines(nb)
    assert len(lines) >= 2 and len(lines) == len(probe["asked"]), lines
    for line in lines:
        name = line[2:].split(": not yet")[0]
        assert line.startswith("✗ ") and ": not yet: no answer" in line, line
        told = line.split(": not yet", 1)[1]
        assert probe["asked"][name]["want"] not in told and "Hint" not in told, line
    for name, asked in probe["asked"].items():
        forms = asked["forms"]
        assert all(ok for _, ok in forms), (name, forms)
        if asked["want"].startswith(("'", "(", "{", "[", "<", "True", "False")) or asked["want"].isdigit():
            assert len(forms) >= 2, (name, forms)  # a name, a tuple, a set, a class, a count: more than one form
    assert not {src: hits for src, hits in probe["placeholders"].items() if hits}, "a placeholder is an answer"
    text = markdown(nb).lower()
    assert "(predict, then change the code and see)" in text, "each notebook has a predict-then-change exercise"
    assert not re.search(r"\*\*exercise \d+\.\*\*[^\n]*\(hint", text), "hints come only after a wrong answer"


def test_no_exercise_is_asked_twice() -> None:
    names = [n for nb, _ in _RUNS.values() for n in probe_result(nb)["asked"]]
    assert len(names) == len(set(names)), sorted(names)


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_the_text_says_what_the_outputs_show(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nb, _ = executed(ROOT / "notebooks" / name, tmp_path, monkeypatch)
    CLAIMS[name](nb, probe_result(nb)["facts"])
