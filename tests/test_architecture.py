"""The layout rules of docs/architecture.md, checked on the source: no import cycles, no reads of
another object's private attributes, small files and functions, the display layer apart."""
from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "renaissance_nb"
KERNEL_SOURCES = ("kernels/", "gpu/kernels.py", "gpu/image_kernels.py")
"""Numba and CUDA launcher source: long by nature (one loop per op), exempt from the file-length rule."""


def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        out[name] = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(module: str, tree: ast.Module, known: set[str]) -> set[str]:
    """Every package module ``module`` imports, at the top or inside a function, except under TYPE_CHECKING."""
    found: set[str] = set()
    package = module if module + ".__init__" in known or _is_package(module) else module.rsplit(".", 1)[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in known else base)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in found if m in known and m != module}


def _is_package(module: str) -> bool:
    return (PACKAGE.parent / module.replace(".", "/") / "__init__.py").exists()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            strong(v)
    return out


def test_no_import_cycles_except_type_only_ones() -> None:
    """A package's __init__ re-exporting its modules is not a cycle of the modules' own: the edges
    from a package to its submodules are left out, as Python imports a submodule's parent first."""
    mods = _modules()
    known = set(mods)
    graph = {m: {d for d in _imports(m, t, known) if not (_is_package(m) and d.startswith(m + "."))}
             for m, t in mods.items()}
    assert _cycles(graph) == []


def test_the_engine_never_imports_the_display_layer_or_jupyter() -> None:
    mods = _modules()
    known = set(mods)
    for name, tree in mods.items():
        if name.startswith("renaissance_nb.display") or name in ("renaissance_nb", "renaissance_nb.task"):
            continue  # the package exports both; the task's inspect() opens the dashboard lazily
        deps = _imports(name, tree, known)
        assert not any(d.startswith("renaissance_nb.display") for d in deps), name
        if name == "renaissance_nb.progress":
            continue  # asks IPython whether it runs in a notebook (a bar there, lines in a terminal), as tqdm.auto
        raw = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        raw |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
        assert not raw & {"ipywidgets", "anywidget", "IPython", "traitlets"}, name


def _own_privates(tree: ast.Module) -> set[str]:
    """The private attributes and methods the module's own classes define: another instance of the
    same class (MemoryPlan.with_shapes' copy, a BluePrint's children) is the module's own state."""
    names = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for n in ast.walk(cls):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("_"):
                names.add(n.name)
            if (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
                    and isinstance(n.ctx, ast.Store)):
                names.add(n.attr)
    return names


def _private_reads(tree: ast.Module) -> list[str]:
    """``x._name`` where x is neither self, cls, nor a module's own class name (a dunder is public),
    and _name is not one of the module's own classes' privates; IPython's display protocol
    (``_repr_*_``) is a public convention."""
    own_classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    own = _own_privates(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        owner = node.value
        if node.attr in own or (node.attr.startswith("_repr_") and node.attr.endswith("_")):
            continue
        if isinstance(owner, ast.Name) and owner.id in ({"self", "cls"} | own_classes):
            continue
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id in ("type", "super"):
            continue
        found.append(f"{ast.unparse(node)} (line {node.lineno})")
    return found


def test_no_module_reads_another_objects_private_attributes() -> None:
    """Third-party internals are not objects of ours; each one used is listed with why: numba offers
    no public way to choose where its cache of a function lives (jit_cache.py stamps it). ``os._exit`` is
    the standard library's documented exit without cleanup, which mpi.abort_with needs after MPI_Abort."""
    allowed = {"caching.CacheImpl._locator_classes", "os._exit"}
    problems = {}
    for name, tree in _modules().items():
        reads = [r for r in _private_reads(tree) if not any(r.startswith(a) for a in allowed)]
        if reads:
            problems[name] = reads
    assert problems == {}


def _functions(tree: ast.Module) -> list[tuple[str, int]]:
    return [(n.name, (n.end_lineno or n.lineno) - n.lineno + 1) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_small_files_and_functions() -> None:
    long_files, long_functions = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > 600 and not rel.startswith(KERNEL_SOURCES):
            long_files.append(rel)
        long_functions += [f"{rel}:{f} ({n} lines)" for f, n in _functions(ast.parse(text)) if n > 80]
    assert long_files == [] and long_functions == []


@pytest.mark.parametrize("cls, most", [("DeepLearningTask", 450)])
def test_the_task_facade_stays_thin(cls: str, most: int) -> None:
    tree = ast.parse((PACKAGE / "task.py").read_text(encoding="utf-8"))
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    assert (node.end_lineno or 0) - node.lineno + 1 < most
