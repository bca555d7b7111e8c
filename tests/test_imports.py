"""The import graph of `tracegraph`, `parsers` and `reports`, read with `ast`, keeps its layers.

Every `import` / `from … import` counts, at module level or inside a function, except those
under `if TYPE_CHECKING:`; `from pkg import name` is an import of `pkg.name` when that is a
module, else of `pkg`. Importing a submodule is not counted as importing its parent package.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

from tests.conftest import REPO

PACKAGES = ("tracegraph", "parsers", "reports")
CORE = ("tracegraph.analysis", "tracegraph.graph", "tracegraph.loading", "tracegraph.verify")


@functools.cache
def modules(root: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of `packages` under `root`."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


@functools.cache
def import_graph(root: Path = REPO, packages: tuple[str, ...] = PACKAGES) -> nx.DiGraph:
    """module -> module it imports; each edge's `line` is where (first occurrence)."""
    known = modules(root, packages)
    graph = nx.DiGraph()
    graph.add_nodes_from(known)
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for base, names, line in _imports(ast.parse(path.read_text(), str(path)), package):
            targets = {f"{base}.{n}" if f"{base}.{n}" in known else base for n in names}
            for target in targets or {base}:
                if target in known and target != name and not graph.has_edge(name, target):
                    graph.add_edge(name, target, line=line)
    return graph


def cycles(graph: nx.DiGraph) -> list[str]:
    """Every import cycle, shortest first, as "a -> b -> a" from its smallest module."""
    found = []
    for cycle in nx.simple_cycles(graph):
        first = cycle.index(min(cycle))
        found.append(cycle[first:] + cycle[:first])
    return [" -> ".join([*cycle, cycle[0]]) for cycle in sorted(found, key=lambda c: (len(c), c))]


def _imports(tree: ast.AST, package: str) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) of every import in `tree` outside
    `if TYPE_CHECKING:`; a plain `import a.b` imports module a.b itself (no names)."""
    found: list[tuple[str, list[str], int]] = []
    pending = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found += [(alias.name, [], node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module or "", node.level, package)
            found.append((base, [alias.name for alias in node.names], node.lineno))
        pending.extend(ast.iter_child_nodes(node))
    return sorted(found, key=lambda item: item[2])


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _absolute(module: str, level: int, package: str) -> str:
    """The absolute name of `from <level dots><module> import ...` inside `package`."""
    if not level:
        return module
    base = package.split(".")[: len(package.split(".")) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _where(module: str, target: str) -> str:
    return f"{module} (line {import_graph().edges[module, target]['line']}) imports {target}"


def _offending(importers: tuple[str, ...], forbidden: tuple[str, ...],
               allowed: tuple[str, ...] = ()) -> list[str]:
    """Imports by modules under `importers` of modules under `forbidden`, except `allowed`."""
    def under(name: str, prefixes: tuple[str, ...]) -> bool:
        return any(name == p or name.startswith(f"{p}.") for p in prefixes)

    return [_where(a, b) for a, b in import_graph().edges
            if under(a, importers) and under(b, forbidden) and b not in allowed]


def test_the_graph_sees_the_pipeline() -> None:
    """Sanity: the reader finds imports of each form (absolute, `from pkg import submodule`,
    function-level) and skips `if TYPE_CHECKING:` ones, so the rules below mean something."""
    graph = import_graph()
    assert graph.has_edge("tracegraph.analysis.analyze", "tracegraph.graph.match")
    assert graph.has_edge("tracegraph.loading.groups", "tracegraph.schema")  # from tracegraph …
    assert graph.has_edge("tracegraph", "tracegraph.loading.loader")  # inside a function
    assert not graph.has_edge("tracegraph", "tracegraph.loading.trace")  # TYPE_CHECKING only


def test_the_reader_finds_a_cycle_and_skips_type_checking(tmp_path: Path) -> None:
    """A cycle through `from . import b` and a function-level import is found; one closed only
    by an `if TYPE_CHECKING:` import is not."""
    files = {
        "__init__.py": "",
        "a.py": "from . import b\n",
        "b.py": "def f():\n    import pkg.a\n",
        "c.py": "import typing\nfrom pkg.b import f\nif typing.TYPE_CHECKING:\n"
                "    from pkg.d import x\n",
        "d.py": "from pkg import c\n",
    }
    (tmp_path / "pkg").mkdir()
    for name, text in files.items():
        (tmp_path / "pkg" / name).write_text(text)
    graph = import_graph(tmp_path, ("pkg",))
    assert sorted(graph.edges) == [("pkg.a", "pkg.b"), ("pkg.b", "pkg.a"), ("pkg.c", "pkg.b"),
                                   ("pkg.d", "pkg.c")]
    assert cycles(graph) == ["pkg.a -> pkg.b -> pkg.a"]


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert not found, f"{len(found)} import cycles:\n" + "\n".join(found[:10])


def test_parsers_use_only_the_schema_of_tracegraph() -> None:
    found = _offending(("parsers",), ("tracegraph",),
                       allowed=("tracegraph.schema", "tracegraph.heap"))  # a leaf the schema loads
    assert not found, "\n".join(found)


def test_the_analysis_pipeline_never_imports_the_simulator() -> None:
    found = _offending(CORE, ("tracegraph.simulate",))
    assert not found, "\n".join(found)


def test_reports_never_import_the_cli() -> None:
    found = _offending(("reports",), ("tracegraph.cli",))
    assert not found, "\n".join(found)


# --- start-up: what the command line imports before it has work to do ------------------------
HEAVY = ("pandas", "numpy", "pyarrow", "scipy", "plotly", "networkx", "msgspec", "dask",
         "distributed")
"""Libraries that cost tenths of a second to import: only a command with work may load them."""


def _module_level_imports(tree: ast.Module, package: str) -> list[str]:
    """Modules `tree` imports when it is imported: its top-level statements (and `if`/`try`
    blocks among them), not function bodies nor `if TYPE_CHECKING:` blocks."""
    found, pending = [], list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If):
            pending.extend(node.orelse if _is_type_checking(node.test) else node.body + node.orelse)
        elif isinstance(node, ast.Try):
            pending.extend(node.body + node.orelse + node.finalbody)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module or "", node.level, package)
            found += [base] + [f"{base}.{alias.name}" for alias in node.names]
    return found


def loaded_on_import(entry: str) -> set[str]:
    """Every module (ours and third-party, top-level names for the latter) that importing
    `entry` loads, following module-level imports through our packages."""
    known = modules()
    seen, pending, external = set(), [entry], set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        path = known[name]
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for target in _module_level_imports(ast.parse(path.read_text(), str(path)), package):
            parts = target.split(".")
            ours = [".".join(parts[:k]) for k in range(1, len(parts) + 1)
                    if ".".join(parts[:k]) in known]
            pending += ours  # a submodule's import runs its packages' __init__ too
            if not ours:
                external.add(parts[0])
    return seen | external


def test_the_command_line_imports_no_heavy_library_at_start() -> None:
    """`tracegraph --help` and argument parsing load typer and rich only: every heavy library
    is imported inside the command that needs it, after its inputs were checked."""
    loaded = loaded_on_import("tracegraph.cli.app")
    assert "tracegraph.cli.analyze" in loaded and "typer" in loaded  # the walk follows imports
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


MISSING_INPUT_COMMANDS = [
    ["analyze", "{missing}"],
    ["report", "{missing}", "-o", "{tmp}/r.html"],
    ["check", "{missing}", "--preset", "hsdp-async-reduction"],
    ["diff", "{missing}", "{missing}"],
    ["export", "{missing}", "--parquet", "{tmp}/tables"],
    ["graph", "{missing}", "-o", "{tmp}/g.graphml"],
]
REPORT_MODULES = ("import atexit, sys\n"
                  "atexit.register(lambda: print('LOADED', *sorted(sys.modules)))\n"
                  "sys.argv = ['tracegraph', *sys.argv[1:]]\n"
                  "from tracegraph.cli.app import main\n"
                  "main()\n")


@pytest.mark.parametrize("command", MISSING_INPUT_COMMANDS, ids=lambda c: c[0])
def test_a_missing_input_fails_before_the_heavy_imports(command: list[str],
                                                         tmp_path: Path) -> None:
    """Each command that reads a bundle checks it exists before importing pandas and the
    analysis: one line, exit 2, and none of the heavy libraries loaded."""
    missing = tmp_path / "no-such-bundle"
    args = [a.format(missing=missing, tmp=tmp_path) for a in command]
    run = subprocess.run([sys.executable, "-c", REPORT_MODULES, *args], capture_output=True,
                         text=True, timeout=120, cwd=REPO)
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip() == f"error: {missing}: no such file or directory"
    loaded = {m.split(".")[0] for m in run.stdout.split("LOADED", 1)[1].split()}
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
