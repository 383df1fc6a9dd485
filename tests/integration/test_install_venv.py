"""A real install without PySpark: a fresh venv holding the built wheel (``--no-deps``) and only the
base dependencies from pyproject.toml, downloaded by pip (its cache makes reruns quick; ~1 min cold).
Importing iceberg_sink there, and running the ``iceberg-sink`` console script, must fail with one line
saying to install the ``spark`` extra."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

from iceberg_sink._requires import MISSING_PYSPARK

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _run(*cmd: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "PYTHONPATH", "VIRTUAL_ENV"))}
    return subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False
    )


def test_a_venv_without_pyspark_says_to_install_the_spark_extra(tmp_path: Path) -> None:
    built = _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp_path / "wheels", ROOT)
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = (tmp_path / "wheels").glob("iceberg_sink-*.whl")
    venv.create(tmp_path / "venv", with_pip=True)
    python = tmp_path / "venv" / "bin" / "python"
    base = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    installed = _run(*pip, "--no-deps", wheel)
    assert installed.returncode == 0, installed.stderr[-3000:]
    installed = _run(*pip, *base)
    assert installed.returncode == 0, installed.stderr[-3000:]
    listed = _run(python, "-m", "pip", "list", "--format=freeze")
    names = {line.split("==")[0].lower() for line in listed.stdout.splitlines()}
    assert "pyiceberg" in names and "iceberg-sink" in names and "pyspark" not in names

    imported = _run(python, "-c", "import iceberg_sink", cwd=tmp_path)  # not the source tree
    assert imported.returncode == 1
    assert imported.stderr.splitlines()[-1] == f"ModuleNotFoundError: {MISSING_PYSPARK}"
    assert "site-packages/iceberg_sink/_requires.py" in imported.stderr
    script = _run(tmp_path / "venv" / "bin" / "iceberg-sink", "inspect", "db.t", cwd=tmp_path)
    assert (script.returncode, script.stdout, script.stderr) == (2, "", f"iceberg-sink: {MISSING_PYSPARK}\n")
