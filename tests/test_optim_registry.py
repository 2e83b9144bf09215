"""The optimizer registry (renaissance_nb/optim/): every optimizer's rules in its own module, found by kind;
nothing outside those modules chooses by comparing an optimizer's name."""
from __future__ import annotations

import ast
import pathlib
import re

import pytest

from renaissance_nb import LARS, SGD, Adam, AdamW, ConfigError
from renaissance_nb.errors import PlanError
from renaissance_nb.optim import DEFINITIONS, definition, definition_of, from_menu, menu, menu_value

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "renaissance_nb"
OWNERS = ("optim/", "train/optimizers.py")
"""Where an optimizer's name may be spelt out: its definition, and its builder (which sets ``kind``)."""


def _names() -> set[str]:
    return set(DEFINITIONS) | {e.value for e in menu()}


def _strings(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    if isinstance(node, ast.Dict):
        return [s for k in node.keys if k is not None for s in _strings(k)]
    return []


def _sources() -> list[tuple[str, str]]:
    """(path, text) of every package module but the owners', and of the widgets' JavaScript."""
    py = [(p.relative_to(PACKAGE).as_posix(), p) for p in sorted(PACKAGE.rglob("*.py"))]
    js = [(f"widgets/{p.name}", p) for p in sorted((ROOT / "widgets").glob("*.js"))]
    return [(rel, p.read_text(encoding="utf-8")) for rel, p in py + js if not rel.startswith(OWNERS)]


def _name_choices(names: set[str], sources: list[tuple[str, str]]) -> list[str]:
    """Comparisons with an optimizer's name and dicts keyed by names (Python), names as string literals or
    object keys (JavaScript)."""
    found = []
    for rel, text in sources:
        if rel.endswith(".js"):
            for i, line in enumerate(text.splitlines(), 1):
                if any(re.search(rf"""["']{re.escape(n)}["']|\b{re.escape(n)}\s*:""", line) for n in names):
                    found.append(f"{rel}:{i}: {line.strip()[:100]}")
            continue
        for node in ast.walk(ast.parse(text)):
            operands = [node.left, *node.comparators] if isinstance(node, ast.Compare) else (
                [node] if isinstance(node, ast.Dict) else [])
            if any(s in names for side in operands for s in _strings(side)):
                found.append(f"{rel}:{node.lineno}: {ast.unparse(node)[:100]}")
    return found


def test_no_optimizer_name_is_compared_outside_its_definition() -> None:
    assert _name_choices(_names(), _sources()) == []


def test_the_checker_finds_what_it_should() -> None:
    """Not vacuous: the choices the code made before the registry are each found."""
    old = [("kernels/cpu.py", 'if kind in ("adam", "adamw"):\n    pass\n'),
           ("display/inspector_data.py", 'kind = "sgd_momentum" if opt["kind"] == "sgd" else opt["kind"]\n'),
           ("inspector/planview.py", 'names = {"sgd": SGD, "adam": Adam}\n'),
           ("widgets/inspector.js", '{ sgd: "SGD", adamw: "AdamW" }[o]')]
    assert [line.split(":")[0] for line in _name_choices(_names(), old)] == [rel for rel, _ in old]


@pytest.mark.parametrize("opt", [SGD(), SGD().momentum(0.9), Adam(), AdamW(), LARS()], ids=repr)
def test_each_builder_has_a_definition_and_a_menu_choice(opt) -> None:  # type: ignore[no-untyped-def]
    d = definition_of(opt)
    assert d.kind == opt.kind and d is DEFINITIONS[opt.graph_params()["kind"]]
    value = menu_value(opt)
    rebuilt = from_menu(value, "test", "optimizer")
    assert type(rebuilt) is type(opt) and menu_value(rebuilt) == value
    assert from_menu(opt, "test", "optimizer") is opt
    assert value in {e.value for e in menu()} and d.label in {e.label for e in menu()}


def test_unknown_kinds_and_menu_names_are_named_with_the_known_ones() -> None:
    with pytest.raises(PlanError, match="unknown optimizer kind 'lion'.*sgd, adam, adamw, lars"):
        definition("lion")
    with pytest.raises(ConfigError, match="'sgd_momentum'.*'lars'.*Fix:"):
        from_menu("lion", "memory.what_if", "optimizer")
