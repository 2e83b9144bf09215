"""The op registry (renaissance_nb/ops/): every layer kind is defined in one module, and nothing
outside that module chooses by comparing a layer-kind string."""
from __future__ import annotations

import ast
import pathlib
import re

import pytest

from renaissance_nb.ops import registry

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "renaissance_nb"


def _kind_owners() -> dict[str, str]:
    """Layer kind (BluePrint or ArchLayer) -> the source file of the op module that defines it."""
    owners = {}
    for table in (registry.OPS, registry.BY_LAYER):
        for kind, op in table.items():
            module = type(op).__module__.split(".")
            owners[kind] = "/".join(module[1:]) + ".py"
    return owners


def _strings(node: ast.AST) -> list[str]:
    """The string constants a comparison operand holds: itself, or the items of a literal tuple/list/set."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    return []


def _kind_comparisons(kinds: dict[str, str]) -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare):
                continue
            for operand in [node.left, *node.comparators]:
                for s in _strings(operand):
                    if s in kinds and kinds[s] != rel and _about_layers(node):
                        found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return found


def _about_layers(node: ast.Compare) -> bool:
    """Whether a comparison reads a layer's kind: a side that is not a constant names ``kind`` or an
    activation (``act``, ``p["act"]``); a node's ``op`` names a kernel, a dtype's ``.kind`` is NumPy's."""
    for side in [node.left, *node.comparators]:
        if _strings(side):
            continue
        text = ast.unparse(side).replace("dtype.kind", "")
        if re.search(r"\bkind\b|\bact\b|\[.act.\]", text):
            return True
    return False


def test_no_layer_kind_string_is_compared_outside_its_ops_module() -> None:
    assert _kind_comparisons(_kind_owners()) == []


def test_the_checker_finds_a_comparison_it_should() -> None:
    """The scan is not vacuous: a kind compared in a module that does not define it is reported."""
    owners = {**_kind_owners(), "leaky_relu": "ops/conv.py"}  # pretend conv.py defined leaky_relu
    assert any(line.startswith("ops/activation.py") for line in _kind_comparisons(owners))


@pytest.mark.parametrize("kind", sorted(registry.BY_LAYER))
def test_every_layer_kind_has_a_builder_that_round_trips(kind: str) -> None:
    from renaissance_nb.blueprint_nodes import LAYER_BUILDERS, BluePrint
    required = {"fc": (8,), "conv": (8, 3), "attention": (4,), "embedding": (65, 16), "pos_embedding": (16,)}
    layer = LAYER_BUILDERS[kind](*required.get(kind, ()))
    assert BluePrint.from_dict(layer.to_dict()) == layer
    assert registry.op_for_layer(kind) is registry.BY_LAYER[kind]


def test_every_trainable_parameter_is_all_reduced_in_exactly_one_bucket() -> None:
    """Data-parallel buckets (allreduce='buckets') cover every gradient of every op, its named parts
    included (se's fc1/fc2), and never a feature map's gradient slot."""
    from dataclasses import replace

    import numpy as np

    from renaissance_nb import DeepLearningTask
    from renaissance_nb.compiler.emit import emit_training_graph
    from renaissance_nb.compiler.pipeline import step_options
    from renaissance_nb.ops import bn, cbr, conv, fc, gap, se
    from renaissance_nb.blueprint_nodes import seq

    x = np.random.default_rng(0).normal(size=(32, 3, 8, 8)).astype(np.float32)
    task = (DeepLearningTask().model(seq(cbr(8, 3, 1, 1), se(4), conv(8, 3, p=1, groups=8), bn(), gap(), fc(3)))
            .data(train=(x, np.arange(32) % 3), batch_size=16))
    task.lock_memory()
    ids = task.planned.shapes.tables["train_base"].ids
    params = task.planned.shapes.tables["train_base"].params
    opts = replace(step_options(task.config), ranks=2, allreduce="buckets")
    graph = emit_training_graph(task.planned.arch, ids, opts, ("G_BN_BIAS", "G_DEEP_CONV"))
    buckets = [(gid, n.inputs) for gid, n in graph if n.op == "allreduce_start"]
    once = [i for gid, ins in buckets if gid.name != "FIRST_LAYER_BWD_B" for i in ins]  # B: the A step's twin
    trainable = sorted(ids[f"{p.name}@grad"] for p in params if p.trainable)
    assert sorted(once) == trainable
