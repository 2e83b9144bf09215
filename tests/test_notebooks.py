"""Every notebook runs top to bottom in a real kernel, quickly, and shows its widgets.

The notebooks are stored without outputs; here each one is executed with nbclient
(kernel python3) in a temporary copy, and its outputs are checked: no errors, and
the widget views (application/vnd.jupyter.widget-view+json) it is meant to show.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

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
}
NEEDS = {"09_data_parallel.ipynb": ("mpi4py", "ipyparallel")}  # the [mpi] extra (in [test]): skipped without it


def test_all_notebooks_are_listed() -> None:
    assert [p.name for p in NOTEBOOKS] == list(EXPECTED_WIDGETS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_stored_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.get("outputs") == [], f"{path.name}: a code cell has stored outputs"
            assert cell.get("execution_count") is None, f"{path.name}: a code cell has an execution count"
    assert "widgets" not in nb.metadata, "no saved widget state"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the kernel inherits this environment: it imports renaissance_nb from this checkout
    for module in NEEDS.get(path.name, ()):
        pytest.importorskip(module, reason=f"{path.name} needs {module} (pip install 'renaissance_nb[mpi]')")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=LIMIT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    started = time.perf_counter()
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as err:  # pragma: no cover - reported with the cell
        pytest.fail(f"{path.name} failed:\n{str(err)[-3000:]}", pytrace=False)
    elapsed = time.perf_counter() - started
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
