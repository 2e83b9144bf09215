"""The views of one task share one poll (display/peers.py): the front end sends it through one view, naming
those it shows, and Python re-reads the task into each stale one; a phase button pressed in one view makes
the others shown follow at once, without waiting for the next poll."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from renaissance_nb import DeepLearningTask, datasets, fc, relu, seq  # noqa: E402
from renaissance_nb.display import LifetimeView, PhaseView, RegionMap, peers  # noqa: E402  (peers: a module)

rng = np.random.default_rng(0)
X = rng.standard_normal((200, 12)).astype(np.float32)
Y = (np.arange(200) % 3).astype(np.int32)


def task(name: str = "p") -> DeepLearningTask:
    return (DeepLearningTask(name).model(seq(fc(8), relu(), fc(3)))
            .data(datasets.from_arrays((X, Y), (X[:40], Y[:40])), batch_size=32).seed(0))


def test_views_of_one_task_share_a_key_and_others_do_not() -> None:
    a, b = task("a"), task("b")
    va, ra, vb = PhaseView(a), RegionMap(a), PhaseView(b)
    assert va.poll_key == ra.poll_key != vb.poll_key
    assert va.view_id and va.view_id != ra.view_id
    assert {id(v) for v in peers.views_of(va.poll_key)} == {id(va), id(ra)}
    ra.close()
    assert [id(v) for v in peers.views_of(va.poll_key)] == [id(va)]


def test_one_poll_refreshes_every_view_shown_and_only_those() -> None:
    t = task()
    phase, regions, life = PhaseView(t), RegionMap(t), LifetimeView(t)
    assert not regions.view["ready"] and not life.view["ready"]
    t.lock_memory()  # in code: nothing has re-read the task yet
    phase._on_poll(phase, {"poll": 1, "shown": [phase.view_id, regions.view_id]}, [])
    assert phase.view["current"] == "MEMORY_LOCKED"
    assert regions.view["ready"] and regions.view["arena_bytes"] == t.memory.total_bytes
    assert not life.view["ready"], "not shown: not re-read"
    assert life.stale() and not regions.stale()


def test_a_phase_button_makes_the_other_shown_views_follow_at_once() -> None:
    t = task()
    phase, regions = PhaseView(t), RegionMap(t)
    phase._on_poll(phase, {"poll": 1, "shown": [phase.view_id, regions.view_id]}, [])  # both shown
    phase.act("plan")
    phase.act("lock_memory")  # no poll in between: the button itself tells the region map
    assert phase.view["current"] == "MEMORY_LOCKED"
    assert regions.view["ready"] and regions.view["arena_bytes"] == t.memory.total_bytes
