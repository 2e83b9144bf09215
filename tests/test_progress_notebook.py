"""A finished run's progress bar in a saved notebook reads as the run ended (progress.BarProgress).

tqdm.auto's notebook bar is a widget whose text fallback was taken when it was shown, at 0%: a saved
notebook, nbconvert's HTML and a notebook reopened after a restart kept "0%" forever. Executed by
nbclient as a user's notebook is, the saved outputs now hold the final line and an HTML bar at 100%
and n/n in the bar's place, no widget and nothing at 0%.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
import pytest

from renaissance_nb import progress

ROOT = Path(__file__).resolve().parents[1]
STALE = re.compile(r"(?<![\d.])0%\|")  # tqdm's line at the start: "bar:   0%|          | 0/16"

RUN = ("import numpy as np\n"
       "from renaissance_nb import DeepLearningTask, fc, relu, seq\n"
       "x = np.random.default_rng(0).standard_normal((512, 8), dtype=np.float32)\n"
       "task = (DeepLearningTask('bar').model(seq(fc(16), relu(), fc(4)))\n"
       "        .data(train=(x, np.arange(512, dtype=np.int32) % 4), batch_size=64).total_epochs(2))\n"
       "result = task.run()\n"
       "print('steps', 2 * task.steps_per_epoch)")


def test_a_saved_notebook_shows_the_bar_as_the_run_ended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ipywidgets")
    nbclient = pytest.importorskip("nbclient")
    from nbconvert import HTMLExporter

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(RUN)])
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    nbformat.write(nb, tmp_path / "run.ipynb")
    saved = nbformat.read(tmp_path / "run.ipynb", as_version=4)
    outs = saved.cells[0].outputs
    steps = int(re.search(r"steps (\d+)", "".join(o.get("text", "") for o in outs)).group(1))  # type: ignore[union-attr]
    bars = [o for o in outs if o.output_type == "display_data" and "rnb-progress-final" in o.data.get("text/html", "")]
    assert len(bars) == 1, [o.output_type for o in outs]
    bar = bars[0].data
    assert "100%" in bar["text/plain"] and f"{steps}/{steps}" in bar["text/plain"]
    assert f"<progress value='{steps}' max='{steps}'" in bar["text/html"] and "100%" in bar["text/html"]
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outs), \
        "the bar's widget was replaced: a reopened notebook has no model to miss"
    everything = nbformat.writes(saved)
    assert not STALE.search(everything), "a stale 0% bar was saved"
    page, _ = HTMLExporter().from_notebook_node(saved)
    assert f"{steps}/{steps}" in page and not STALE.search(page)


def test_the_final_bundle_of_a_stopped_bar_says_where_it_stopped() -> None:
    tqdm = pytest.importorskip("tqdm").tqdm
    bar = tqdm(total=93, desc="mlp", unit="step", disable=False, file=open(os.devnull, "w"))
    bar.update(40)
    bar.set_postfix(loss="0.4100")
    bar.close()
    out = progress.final_bundle(bar)
    assert out["text/plain"].startswith("mlp:  43%|") and "40/93" in out["text/plain"] and "loss=0.4100" in out["text/plain"]
    assert "<progress value='40' max='93'" in out["text/html"] and "#cc4455" in out["text/html"]  # red: stopped
    assert re.search(r"\[(\d\d:\d\d)<", out["text/plain"]).group(1) in out["text/html"]  # type: ignore[union-attr]
