"""The layout rules of docs/architecture.md, checked on the source: each module imports only what
the package table allows, no import cycles, no reads of another object's private attributes, small
files and functions, the display layer apart."""
from __future__ import annotations

import ast
import pathlib
import re
from dataclasses import dataclass

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


def _import_sites(module: str, tree: ast.Module, known: set[str]) -> list[tuple[str, int, bool]]:
    """Each package module ``module`` imports, with the line and whether the import runs inside a
    function (lazily), at the top or inside a function, except under TYPE_CHECKING."""
    found: list[tuple[str, int, bool]] = []
    package = module if module + ".__init__" in known or _is_package(module) else module.rsplit(".", 1)[0]

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child, lazy)
            return
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.append((full if full in known else base, node.lineno, lazy))
        elif isinstance(node, ast.Import):
            found.extend((a.name, node.lineno, lazy) for a in node.names)
        inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(tree, False)
    return sorted({s for s in found if s[0] in known and s[0] != module})


def _imports(module: str, tree: ast.Module, known: set[str]) -> set[str]:
    """Every package module ``module`` imports, at the top or inside a function, except under TYPE_CHECKING."""
    return {m for m, _, _ in _import_sites(module, tree, known)}


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


DOC = PACKAGE.parent / "docs" / "architecture.md"
TABLE = "## Packages: what each owns, what it may import"
ROOT = "__init__"
"""The table's name for the package's own ``__init__.py`` (the public API)."""
KNOWN_VIOLATIONS = {
    ("kernels.cpu", "train.rng"): "StreamId, the Philox stream ids, belongs beside the Philox loops (kernels.philox)",
    ("kernels.transfer", "train.rng"): "StreamId, as kernels.cpu",
    ("gpu.kernels", "train.rng"): "StreamId, as kernels.cpu",
    ("kernels.transfer", "data.augment"): "the resize weights and output-size check belong in kernels.augment, "
                                          "which data.augment already imports (data and kernels import each other)",
    ("config", ROOT): "setting_from_dict finds a loss, optimizer or scheduler class by name in the whole public API "
                      "(the package that imports the task that imports config); train could own that table",
}
"""Imports that break the table today: layering debts to fix, not rules. Each (importer, imported)
pair is named relative to the package; the test fails when one is gone, so the list only shrinks."""


@dataclass(frozen=True)
class Row:
    """One row of the table: its units (``errors`` for errors.py, ``compiler`` for compiler/) and the
    package modules they may import at any time (``anytime``) or only inside a function (``lazy``)."""
    units: tuple[str, ...]
    anytime: tuple[str, ...]
    lazy: tuple[str, ...]


def _module(name: str) -> str:
    return "renaissance_nb" if name == ROOT else f"renaissance_nb.{name}"


def _short(module: str) -> str:
    """A module's name as the table writes it: ``compiler.layers``, ``__init__`` for the package itself."""
    return ROOT if module == "renaissance_nb" else module.removeprefix("renaissance_nb.")


def _unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def _groups(cell: str) -> list[str]:
    """The cell split at its semicolons outside parentheses."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(cell):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == ";" and depth == 0:
            out.append(cell[start:i])
            start = i + 1
    return out + [cell[start:]]


def _rows() -> list[Row]:
    """The table read as docs/architecture.md's rules sentence says: the first column's names in code
    font are the units (``x.py`` or ``x/``); the third column's are what they may import, those of a
    part between semicolons that says "lazily" (outside parentheses) only inside functions."""
    lines = DOC.read_text(encoding="utf-8").split(TABLE, 1)[1].strip().splitlines()
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = line.strip().strip("|").split("|")
        assert len(cells) == 3, f"docs/architecture.md: a table row without three cells: {line}"
        units = tuple(re.sub(r"(\.py|/)$", "", u) for u in re.findall(r"`([^`]+)`", cells[0]))
        anytime: list[str] = []
        lazy: list[str] = []
        for group in _groups(cells[2]):
            says_lazily = re.search(r"\blazily\b", re.sub(r"\([^()]*\)", "", group))
            (lazy if says_lazily else anytime).extend(re.findall(r"`([^`]+)`", group))
        rows.append(Row(units, tuple(anytime), tuple(lazy)))
    return rows


def _allows(names: tuple[str, ...], module: str) -> bool:
    """A package name covers its modules, a dotted name that module and the ones under it; ``__init__`` only itself."""
    return any(module == _module(n) or (n != ROOT and module.startswith(_module(n) + ".")) for n in names)


def test_the_table_names_only_units_and_modules_that_it_has() -> None:
    rows = _rows()
    units = {u for r in rows for u in r.units}
    known = set(_modules())
    bad = [f"{n} (row {r.units[0]})" for r in rows for n in r.anytime + r.lazy
           if n.split(".")[0] not in units
           or ("." in n and any(_unit_of(m) == n.split(".")[0] for m in known) and _module(n) not in known)]
    assert not bad, "docs/architecture.md's table may import names it has no row or module for: " + ", ".join(bad)


def test_every_module_has_a_row_in_the_table() -> None:
    units = {u for r in _rows() for u in r.units}
    missing = sorted({_unit_of(m) for m in _modules()} - units)
    hint = [f"add a row for {u}{'/' if u != ROOT and _is_package(_module(u)) else '.py'} in docs/architecture.md"
            for u in missing]
    assert not missing, "; ".join(hint)


def _offences() -> list[tuple[str, str, str]]:
    """(importer, imported, where) for every import of a package module its row does not allow."""
    rows = {u: r for r in _rows() for u in r.units}
    mods = _modules()
    known = set(mods)
    out = []
    for name, tree in mods.items():
        row = rows.get(_unit_of(name))
        if row is None:
            continue  # test_every_module_has_a_row_in_the_table says which
        for dep, line, lazy in _import_sites(name, tree, known):
            if _unit_of(dep) in row.units or _allows(row.anytime, dep) or (lazy and _allows(row.lazy, dep)):
                continue
            how = " (allowed only lazily, inside a function)" if _allows(row.lazy, dep) else ""
            path = name.replace(".", "/") + ("/__init__.py" if _is_package(name) else ".py")
            out.append((_short(name), _short(dep), f"{path}:{line}{how}"))
    return out


def test_every_import_is_one_the_table_allows() -> None:
    """Each module imports only what its row of docs/architecture.md's package table names (its own
    row's modules aside); the known layering debts are listed, with why, in KNOWN_VIOLATIONS."""
    problems = sorted({f"{a} -> {b}  {where}" for a, b, where in _offences() if (a, b) not in KNOWN_VIOLATIONS})
    assert not problems, ("imports docs/architecture.md's package table does not allow (fix the import, or the "
                          "table's third column saying why):\n" + "\n".join(problems))


def test_the_known_layering_debts_are_still_there() -> None:
    """A debt fixed is struck from KNOWN_VIOLATIONS, so the list never hides a new one."""
    seen = {(a, b) for a, b, _ in _offences()}
    assert sorted(set(KNOWN_VIOLATIONS) - seen) == []
