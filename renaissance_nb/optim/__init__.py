"""Every optimizer's rules, one module each, and the one table that lists them (base.py says what a
definition holds). The kernel tables (kernels/cpu.py, gpu/kernels.py), the emitter (compiler/emit.py)
and the inspectors look a definition up here by the ``kind`` of the optimizer's graph params. The kernel
tables and the emitter import this package inside the function that needs it: the definitions bind the
loops of kernels/ (and, lazily, gpu/'s launch helpers), so kernels/ must not need them to load; they
describe their nodes as plain tuples, so they never import the compiler.

Adding an optimizer: its builder in train/optimizers.py, a module here, one line in DEFINITIONS.
"""
from __future__ import annotations

from typing import Any

from ..errors import ConfigError, PlanError, bad_argument
from . import adam, lars, sgd
from .base import MenuEntry, OptimizerDefinition

DEFINITIONS: dict[str, OptimizerDefinition] = {d.kind: d for d in (sgd.DEFINITION, adam.ADAM, adam.ADAMW,
                                                                    lars.DEFINITION)}
"""kind (the builder's ``kind``, its graph params' "kind") -> its definition."""


def definition(kind: Any, where: str = "optimizer") -> OptimizerDefinition:
    """The definition of an optimizer kind; a PlanError naming the known ones for any other."""
    if isinstance(kind, str) and kind in DEFINITIONS:
        return DEFINITIONS[kind]
    raise PlanError(f"{where}: unknown optimizer kind {kind!r}; the known ones are {', '.join(DEFINITIONS)}. "
                    "Fix: build the node from an optimizer of renaissance_nb (its graph_params give the kind).")


def definition_of(optimizer: Any) -> OptimizerDefinition:
    """The definition of an optimizer object (a builder of train/optimizers.py)."""
    return definition(optimizer.graph_params()["kind"])


def menu() -> list[MenuEntry]:
    """The memory inspector's optimizer choices, every definition's in table order."""
    return [entry for d in DEFINITIONS.values() for entry in d.menu]


def menu_value(optimizer: Any) -> str:
    """The menu choice an optimizer object shows as (SGD with momentum: 'sgd_momentum')."""
    p = optimizer.graph_params()
    return definition(p["kind"]).menu_value(p)


def from_menu(value: Any, where: str, argument: str) -> Any:
    """The optimizer a menu choice names (any case), or ``value`` itself when it is an optimizer object;
    anything else is a ConfigError listing the choices."""
    if hasattr(value, "graph_params") and not isinstance(value, type):  # an optimizer object, not its class
        return value
    if isinstance(value, str):
        for entry in menu():
            if entry.value == value.lower():
                return entry.make()
    names = ", ".join(repr(e.value) for e in menu())
    raise bad_argument(ConfigError, where, argument, value, f"an optimizer or one of {names}",
                       "pass optimizer='sgd' or optimizer=SGD(momentum=0.9) (an object: SGD(), not SGD)")


__all__ = ["DEFINITIONS", "MenuEntry", "OptimizerDefinition", "definition", "definition_of", "from_menu", "menu",
           "menu_value"]
