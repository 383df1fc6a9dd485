"""Installing: ``pip install iceberg-sink[spark]`` brings every module the package imports, and
importing iceberg_sink without PySpark fails with one line saying to install the ``spark`` extra.

The real check without PySpark (a fresh venv with only the base dependencies) is in
tests/integration/test_install_venv.py; here a subprocess hides PySpark with an import hook.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from iceberg_sink._requires import MISSING_PYSPARK

ROOT = Path(__file__).resolve().parents[2]

HIDE_PYSPARK = """
import sys
class Hide:
    def find_spec(self, name, path=None, target=None):
        if name == "pyspark" or name.startswith("pyspark."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Hide())
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def test_import_without_pyspark_names_the_extra() -> None:
    run = subprocess.run(
        [sys.executable, "-c", HIDE_PYSPARK + "import iceberg_sink"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 1
    assert run.stderr.splitlines()[-1] == f"ModuleNotFoundError: {MISSING_PYSPARK}"
    # The console script: the line alone, exit code 2.
    script = HIDE_PYSPARK + "sys.argv = ['/usr/bin/iceberg-sink', '--help']\nfrom iceberg_sink.cli import main\n"
    cli = subprocess.run(
        [sys.executable, "-c", script], env=_env(), capture_output=True, text=True, timeout=120, check=False
    )
    assert (cli.returncode, cli.stdout, cli.stderr) == (2, "", f"iceberg-sink: {MISSING_PYSPARK}\n")


def _third_party_imports() -> set[str]:
    found = set()
    for path in (ROOT / "iceberg_sink").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m not in ("iceberg_sink", "__future__")}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(requirements: list[str]) -> set[str]:
    """Distributions the requirements install (transitively, extras included), as installed in this venv."""
    seen: set[tuple[str, frozenset[str]]] = set()
    names: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        key = (_norm(req.name), frozenset(req.extras))
        if key[0] == "iceberg-sink" or key in seen:
            continue
        seen.add(key)
        names.add(key[0])
        for sub in md.requires(req.name) or []:
            parsed = Requirement(sub)
            if parsed.marker is None or any(parsed.marker.evaluate({"extra": e}) for e in req.extras or {""}):
                todo.append(parsed)
    return names


def test_the_spark_extra_brings_everything_the_package_imports() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base, spark = project["dependencies"], project["optional-dependencies"]["spark"]
    assert any(Requirement(r).name == "pyspark" for r in spark)
    assert any(Requirement(r).name == "pandas" and "<3" in str(Requirement(r).specifier) for r in spark)
    # Optional features (metrics: prometheus-client, demo: rich) are imported only when used.
    optional = project["optional-dependencies"]["metrics"] + project["optional-dependencies"]["demo"]
    installed = _closure(base + spark + optional)
    providers = md.packages_distributions()
    missing = {
        module: providers.get(module)
        for module in _third_party_imports()
        if not any(_norm(d) in installed for d in providers.get(module, []))
    }
    assert missing == {}, f"imported but not brought by the base dependencies + the spark extra: {missing}"
    # ... and the package imports without the optional extras (their imports are guarded or lazy).
    hide_optional = HIDE_PYSPARK.replace('name == "pyspark" or name.startswith("pyspark.")', "name in OPTIONAL")
    lazy = subprocess.run(
        [
            sys.executable,
            "-c",
            "OPTIONAL = ('rich', 'prometheus_client')\n" + hide_optional + "import iceberg_sink.cli",
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert lazy.returncode == 0, lazy.stderr[-2000:]
    # PySpark and pandas are Spark-side only: the base install must not pull them in.
    assert not {"pyspark", "pandas"} & _closure(base)
