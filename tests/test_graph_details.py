"""GraphView's details panel (display/graphpick.py): a clicked tensor's shape in every variant, region,
offset and the ops that write and read it; a clicked op's GraphId, stream, parameters and operands; a
malformed pick answered in the panel, not raised."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ipywidgets")
pytest.importorskip("anywidget")

from renaissance_nb import DeepLearningTask, datasets, fc, relu, seq  # noqa: E402
from renaissance_nb.compiler.touches import node_access  # noqa: E402
from renaissance_nb.display import GraphView  # noqa: E402

rng = np.random.default_rng(0)
X = rng.standard_normal((256, 24)).astype(np.float32)
Y = (np.arange(256) % 4).astype(np.int32)


def view() -> tuple[GraphView, DeepLearningTask]:
    t = (DeepLearningTask("d").model(seq(fc(32), relu(), fc(4)))
         .data(datasets.from_arrays((X, Y), (X[:64], Y[:64])), batch_size=64).seed(0).lock_memory())
    return GraphView(t, gid=""), t


def test_a_tensor_pick_lists_its_shapes_place_and_the_ops_that_touch_it() -> None:
    g, t = view()
    w = t.plans["train_base"]["fc1.weight"]
    g.picked = {"tensor": w.id}
    d = g.details
    assert d["name"] == "fc1.weight" and d["region"] == w.region.name and d["offset"] == w.offset
    assert [v["variant"] for v in d["variants"]] == list(t.plans)
    assert all(v["shape"] == "(32, 24)" and v["bytes"] == 32 * 24 * 4 for v in d["variants"])
    ref = t.plans["train_base"]
    nodes = [(gid, n) for gid in t.graphs.train.ids() for n in t.graphs.train.nodes(gid)]
    assert len(d["writers"]) == sum(w.id in node_access(n, ref)[1] for _, n in nodes) >= 1
    assert len(d["readers"]) == sum(w.id in node_access(n, ref)[0] for _, n in nodes) >= 3
    assert any(x.startswith("optimizer") for x in d["writers"])


def test_an_op_pick_and_a_bad_pick() -> None:
    g, t = view()
    g.gid = "DEEP_FWD_BWD"
    g.picked = {"op": 0}
    d = g.details
    first = t.graphs.train.nodes(next(x for x in t.graphs.train.ids() if x.name == "DEEP_FWD_BWD"))[0]
    assert d["op"] == first.op and d["graph_id"] == "DEEP_FWD_BWD" and d["stream"] == "COMP_1"
    assert d["params"] == [[str(k), str(v)] for k, v in first.params] and d["writes"]
    g.picked = {"op": 10_000}
    assert "No op #10000" in g.details["error"]
    g.picked = {"tensor": "x"}
    assert g.details["error"].startswith("Cannot show")
    g.picked = {}
    assert g.details == {}
