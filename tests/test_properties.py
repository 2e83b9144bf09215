"""Property tests: any valid small model and data set compiles into a sound memory plan."""
from __future__ import annotations

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from renaissance_nb import (DeepLearningTask, dropout, fc, gelu, identity, leaky_relu, relu, seq, sigmoid,  # noqa: E402
                           silu, tanh)
from renaissance_nb.memory.dtensor import ALIGNMENT  # noqa: E402

ACTS = [relu, tanh, sigmoid, silu, gelu, identity, lambda: leaky_relu(0.1)]


@st.composite
def problems(draw):  # type: ignore[no-untyped-def]
    classes = draw(st.integers(2, 6))
    layers = []
    for _ in range(draw(st.integers(0, 3))):  # hidden layers; the final fc(C) makes 1-4 fc layers
        layers.append(fc(draw(st.integers(1, 64))))
        if draw(st.booleans()):
            layers.append(ACTS[draw(st.integers(0, len(ACTS) - 1))]())
        if draw(st.booleans()):
            layers.append(dropout(draw(st.sampled_from([0.0, 0.1, 0.5, 0.9]))))
    layers.append(fc(classes))
    n = draw(st.integers(classes, 80))
    features = draw(st.integers(1, 20))
    batch = draw(st.integers(1, n))
    n_val = draw(st.sampled_from([0, 1, 7, 33]))
    val_batch = draw(st.one_of(st.none(), st.integers(1, 16)))
    seed = draw(st.integers(0, 2**31 - 1))
    return seq(*layers), classes, n, features, batch, n_val, val_batch, seed


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_any_valid_model_compiles_into_a_sound_plan(problem) -> None:  # type: ignore[no-untyped-def]
    model, classes, n, features, batch, n_val, val_batch, seed = problem
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, features)).astype(np.float32)
    y = np.arange(n) % classes  # every class present, so num_classes == classes
    val = None
    if n_val:
        val = (rng.standard_normal((n_val, features)).astype(np.float32), np.arange(n_val) % classes)
    t = DeepLearningTask("prop").model(model).data(train=(x, y), val=val, batch_size=batch,
                                                   val_batch_size=val_batch).seed(seed % 1000)
    t.compile()
    plan = t.memory
    assert all(tt.offset % ALIGNMENT == 0 for tt in plan), "an offset is not 256-aligned"
    assert all(s.base % ALIGNMENT == 0 for s in plan.regions.values())
    assert plan.total_bytes % ALIGNMENT == 0
    assert all(tt.offset + tt.nbytes <= plan.total_bytes for tt in plan)
    assert plan.live_overlaps() == []
    assert len(t.plans) == 6
    offsets = {name: [tt.offset for tt in p] for name, p in t.plans.items()}
    ref = offsets["train_base"]
    assert all(o == ref for o in offsets.values()), "variant plans disagree on offsets"
    for p in t.plans.values():  # every variant's tensor fits its slot
        assert all(tt.nbytes <= tt.slot_bytes for tt in p)
    # one training step runs on the plan (cheap smoke check of the bound graphs)
    res = t.run(epochs=1, progress=False)
    assert len(res.history) == 1 and np.isfinite(res.history[0].train_loss)
