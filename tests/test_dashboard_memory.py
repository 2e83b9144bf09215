"""The dashboard's memory tools: the Inspector tab and the Memory tab's allocation count."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("anywidget")

from renaissance_nb import DeepLearningTask, datasets, fc, relu, seq  # noqa: E402
from renaissance_nb.display import dashboard  # noqa: E402
from renaissance_nb.display.allocations_panel import STEPS, AllocationsPanel  # noqa: E402
from renaissance_nb.display.inspector_view import MemoryInspectorView  # noqa: E402


def _task() -> DeepLearningTask:
    return (DeepLearningTask("t").model(seq(fc(32), relu(), fc(10)))
            .data(datasets.default_mnist(), batch_size=128).total_epochs(1).seed(2))


def _tab(d, title: str):  # type: ignore[no-untyped-def]
    return d.tabs.children[list(d.tabs.titles).index(title)]


def test_the_inspector_tab_follows_the_phases() -> None:
    t = _task()
    d = dashboard(t)
    assert "Inspector" in d.tabs.titles and not isinstance(_tab(d, "Inspector"), MemoryInspectorView)
    t.lock_memory()
    d.refresh()
    assert isinstance(_tab(d, "Inspector"), MemoryInspectorView)
    assert not any(isinstance(c, AllocationsPanel) for c in _tab(d, "Memory").children)  # nothing to replay yet
    t.compile()
    d.refresh()
    panels = [c for c in _tab(d, "Memory").children if isinstance(c, AllocationsPanel)]
    assert len(panels) == 1 and "not counted yet" in panels[0].out.value
    d.close()


def test_the_allocation_count_measures_and_leaves_the_task_as_it_was() -> None:
    t = _task().compile()
    before = {k: v.copy() for k, v in t.state_dict().items()}
    panel = AllocationsPanel(t)
    got = panel.count()
    assert got.steps == STEPS and got.nrt_net == 0 and got.python_growth == 0
    assert got.per_step == t.memory_inspector.allocations(steps=STEPS).per_step  # the same count, measured again
    assert f"{got.per_step:.1f}" in panel.out.value and "numba allocations per step" in panel.out.value
    assert not panel.button.disabled
    after = t.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_the_allocation_count_shows_the_library_error() -> None:
    t = _task()  # not compiled: nothing to replay
    panel = AllocationsPanel(t)
    assert panel.count() is None
    assert "PhaseError" in panel.out.value and not panel.button.disabled
