"""The house rules of issues 21 and 40, enforced: small modules, a root that is only the public face,
no import circle among modules (imports inside functions included), the layer contract of
pyproject.toml (checked by import-linter in scripts/test.sh) kept without exceptions, and the moved
modules still importable (with a warning) for one release.

Two import graphs are read from the source with ``ast``: every import a module can run (module
level, class bodies, ``try``/``if`` blocks and function bodies), and the imports it runs when it is
imported (not those inside functions, run later). Neither counts imports under ``if TYPE_CHECKING:``
(never run).
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "iceberg_sink"

MAX_LINES = 600
# Known violations, each to be removed by the change that fixes it; nothing else may exceed the limit.
KNOWN_LONG_MODULES: set[str] = set()

# The public face (issue 21): the builder, the sink, its configuration, options and errors; private
# helpers (_*.py); and the deprecated paths of moved modules, kept for one release.
ROOT_MODULES = {"__init__", "builder", "sink", "config", "options", "errors"}
DEPRECATED_SHIMS = {
    "debezium": "iceberg_sink.sources.debezium",
    "readers": "iceberg_sink.sources.readers",
    "metrics": "iceberg_sink.observe.metrics",
}


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``'s)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of ``body`` that run when the module is imported (recursively)."""
    found: list[ast.stmt] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                found += _import_time_statements(node.body)
            found += _import_time_statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *[h.body for h in node.handlers]):
                found += _import_time_statements(block)
        elif isinstance(node, ast.With | ast.ClassDef):
            found += _import_time_statements(node.body)
    return found


def _every_import(body: list[ast.stmt]) -> list[ast.stmt]:
    """Every import statement of ``body`` that may run: at any depth, functions included, except
    under ``if TYPE_CHECKING:``."""
    found: list[ast.stmt] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)  # type: ignore[arg-type]
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    for statement in body:
        visit(statement)
    return found


def import_graph(every: bool = False) -> dict[str, set[str]]:
    """Module -> the package's modules it imports when imported (``every``: or may import later)."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    statements = _every_import if every else _import_time_statements
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        for node in statements(tree.body):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")
                    anchor = anchor if is_package else anchor[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                # `from package import submodule` imports the submodule; other names come from base.
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
                ]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each strongly connected group of modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def test_no_module_exceeds_the_line_limit() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in _modules().values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    unexpected = {p: n for p, n in long.items() if p not in KNOWN_LONG_MODULES}
    assert unexpected == {}, f"modules over {MAX_LINES} lines (split them; STYLE.md 7): {unexpected}"
    fixed = KNOWN_LONG_MODULES - set(long)
    assert not fixed, f"now within {MAX_LINES} lines: remove from KNOWN_LONG_MODULES: {sorted(fixed)}"


def test_the_sink_job_only_runs_checkpoints() -> None:
    """SinkJob composes its collaborators (job/binding.py, job/pending.py) instead of holding
    their code: its module stays under 450 lines."""
    n = len((PACKAGE / "job" / "pipeline.py").read_text().splitlines())
    assert n < 450, f"job/pipeline.py has {n} lines; move what is not the per-checkpoint flow to its stage"


def test_the_root_holds_only_the_public_face() -> None:
    allowed = ROOT_MODULES | set(DEPRECATED_SHIMS)
    extra = sorted(p.name for p in PACKAGE.glob("*.py") if p.stem not in allowed and not p.stem.startswith("_"))
    assert extra == [], (
        f"modules at the root of iceberg_sink/ besides the public face: {extra}; give each a home in a "
        "subpackage (job/, sources/, observe/, cli/, table/, writer/, committer/, topology/, _iceberg/)"
    )


def test_no_import_circle() -> None:
    """No module imports, at any time, a module that imports it back (directly or not): every
    import runs one way, inside a package too (where the layer contract does not look)."""
    graph = import_graph(every=True)
    # The graph is real: it sees imports inside functions, and not those for type checking only.
    assert "iceberg_sink.builder" in graph["iceberg_sink.sink"]
    lazy = "iceberg_sink._iceberg.metadata_cache"  # imported inside a function, for start-up cost
    assert lazy in graph["iceberg_sink.table.catalog"] and lazy not in import_graph()["iceberg_sink.table.catalog"]
    assert _cycles(graph) == []


def test_the_layer_contract_has_no_exceptions() -> None:
    """The layers of pyproject.toml (import-linter, run by scripts/test.sh) name every top-level module
    and package of iceberg_sink, and no import is exempted from them."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert config["exclude_type_checking_imports"] is True
    (contract,) = config["contracts"]
    assert contract["type"] == "layers" and contract["exhaustive"] is True
    assert "ignore_imports" not in contract and "exhaustive_ignores" not in contract
    listed = {name.strip() for layer in contract["layers"] for name in layer.split("|")}
    top = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"} | {
        p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()
    }
    assert listed == top


def test_the_package_imports_its_public_names_on_first_use() -> None:
    # iceberg_sink/__init__.py runs in every Python worker process Spark starts for a writer task:
    # it must not import the builder, the catalogs or the jobs (PEP 562 __getattr__ does, on use).
    assert import_graph()["iceberg_sink"] == {"iceberg_sink._requires"}
    code = (
        "import sys\n"
        "import iceberg_sink.writer.spark\n"
        "heavy = [m for m in ('iceberg_sink.builder', 'iceberg_sink.sink', 'iceberg_sink.config',\n"
        "    'iceberg_sink.table.catalog', 'iceberg_sink.job.pipeline', 'pyiceberg.catalog', 'sqlalchemy')\n"
        "    if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "import iceberg_sink\n"
        "assert iceberg_sink.IcebergSink.__module__ == 'iceberg_sink.sink'\n"
        "assert set(iceberg_sink.__all__) <= set(dir(iceberg_sink))\n"
        "try:\n"
        "    iceberg_sink.NoSuchName\n"
        "except AttributeError as e:\n"
        "    assert 'NoSuchName' in str(e)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_the_circle_finder_finds_circles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    tree = ast.parse(
        "import a\nif TYPE_CHECKING:\n    import b\nelse:\n    import c\ntry:\n    import d\nexcept E:\n"
        "    import e\ndef f():\n    import g\nclass K:\n    import h\n"
    )
    names = [n.names[0].name for n in _import_time_statements(tree.body) if isinstance(n, ast.Import)]
    assert names == ["a", "c", "d", "e", "h"]
    every = [n.names[0].name for n in _every_import(tree.body) if isinstance(n, ast.Import)]
    assert sorted(every) == ["a", "c", "d", "e", "g", "h"]


@pytest.mark.parametrize(("old", "new"), sorted(DEPRECATED_SHIMS.items()))
def test_moved_modules_import_from_their_old_path_with_a_warning(old: str, new: str) -> None:
    # A fresh interpreter: the old path warns when it is first imported.
    code = (
        "import importlib, warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        f"    old = importlib.import_module('iceberg_sink.{old}')\n"
        f"new = importlib.import_module('{new}')\n"
        "assert old is new, (old, new)\n"
        "warned = [w for w in caught if issubclass(w.category, DeprecationWarning) and 'moved to' in str(w.message)]\n"
        f"assert warned and '{new}' in str(warned[0].message), [str(w.message) for w in caught]\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_old_names_are_the_moved_objects() -> None:
    with pytest.warns(DeprecationWarning):
        sys.modules.pop("iceberg_sink.debezium", None)
        from iceberg_sink.debezium import read_envelope
    from iceberg_sink.sources.debezium import read_envelope as moved

    assert read_envelope is moved
    readers = importlib.import_module("iceberg_sink.sources.readers")
    with pytest.warns(DeprecationWarning):
        sys.modules.pop("iceberg_sink.readers", None)
        old = importlib.import_module("iceberg_sink.readers")
    assert old.read_json is readers.read_json
