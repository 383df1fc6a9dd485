"""Where the Iceberg Java readers run: separate virtualenvs with the Spark each Iceberg runtime is built for.

The reference reader is Apache Iceberg Java 1.9.2 for Spark 3.5; its runtime jar ships inside the
PyPI package ``snowpark-connect-deps-iceberg==1.0.1``, so it lives in its own venv with
``pyspark==3.5.*`` (the project's own venv runs PySpark 4.x). The project itself is installed there too (editable), so the sink can also be
run on Spark 3.5.

``ensure_java_env()`` is idempotent: a marker file holding the exact requirement list is written
only after a successful install, and a venv whose marker matches is reused as is (about 0.1 s).
An incomplete venv (no marker, or one written for other pins, another project path or other
project dependencies) is removed and built again. Concurrent callers are
serialized with a lock file in the temporary directory.

``reference_runtime()`` and ``newest_runtime()`` describe the two Iceberg Java readers of the interop
checks (python + jars, see ``ReaderRuntime``): Iceberg Java 1.9.2 on PySpark 3.5.7 from this venv, and
the newest Iceberg Java release (``NEWEST_ICEBERG_VERSION``) on the newest Spark 4 it publishes a
runtime for, in a second venv (``ensure_newest_python``, ``.venv-java-newest``) since the project's
own PySpark 4.3 has no Iceberg runtime yet. Both read ``s3://`` tables with Iceberg's own
``S3FileIO``, whose AWS SDK v2 classes come from ``org.apache.iceberg:iceberg-aws-bundle`` of the same
Iceberg version; the jars from Maven Central are fetched once into a cache (maven.py, which is
scripts/maven_fetch.py).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.interop.maven import fetch_jars

PROJECT_ROOT: Path = Path(__file__).resolve().parents[2]
DEFAULT_VENV_DIR: Path = PROJECT_ROOT / ".venv-java"
VENV_ENV_VAR: str = "ICEBERG_SINK_JAVA_VENV"
JAR_NAME: str = "iceberg-spark-runtime-3.5_2.12-1.9.2.jar"
MARKER_NAME: str = ".iceberg-sink-java-env.json"
REFERENCE_ICEBERG_VERSION: str = "1.9.2"
# The newest Iceberg Java and its Spark runtime, as published on Maven Central on 2026-11-26:
# Iceberg 1.12.0 ships runtimes for Spark 3.5, 4.0 and 4.1 only. The project's venv runs PySpark
# 4.3.0, on which the 4.1 runtime fails to load a table (IncompatibleClassChangeError:
# CatalogManager became an interface in Spark 4.2), so the newest reader runs on PySpark 4.1 (its
# latest patch) in a venv of its own, as the 1.9.2 reader does on 3.5.
NEWEST_ICEBERG_VERSION: str = "1.12.0"
NEWEST_RUNTIME_ARTIFACT: str = "iceberg-spark-runtime-4.1_2.13"
# The JDBC driver of the catalog the reader servers register s3:// tables in (java_reader_server.py).
SQLITE_JDBC_VERSION: str = "3.54.1.0"
NEWEST_VENV_DIR: Path = PROJECT_ROOT / ".venv-java-newest"
NEWEST_VENV_ENV_VAR: str = "ICEBERG_SINK_JAVA_NEWEST_VENV"
# Only what the reader server imports: PySpark and Arrow (pandas and NumPy for PySpark's Arrow path);
# the same pyarrow/pandas/numpy pins as the 1.9.2 venv (PySpark 4.1 accepts them).
NEWEST_REQUIREMENTS: tuple[str, ...] = ("pyspark==4.1.4", "numpy==1.26.4", "pyarrow==18.1.0", "pandas==2.2.3")

# Pins, and why:
# - pyspark 3.5.x: Iceberg's Spark runtime jar is built for Spark 3.5 / Scala 2.12; 3.5.x is one
#   sdist per patch release (pip builds a wheel from it once, ~1 min). Latest 3.5 patch.
# - snowpark-connect-deps-iceberg 1.0.1: carries iceberg-spark-runtime-3.5_2.12-1.9.2.jar;
#   1.0.3 is broken (its shaded jackson classes are missing).
# - numpy<2: parts of PySpark 3.5 (pyspark.pandas, some Arrow paths) still use aliases removed in
#   NumPy 2; 1.26.4 is the last 1.x and has Python 3.11 wheels.
# - pyarrow 18.1.0: the lowest version PyIceberg 0.12 accepts (>=18), built against NumPy 1.x and
#   2.x alike, well above PySpark 3.5's minimum (4.0.0).
# - pandas 2.2.3: pandas<3 for PySpark, and the last release line PySpark 3.5 was tested with.
REQUIREMENTS: tuple[str, ...] = (
    "pyspark==3.5.7",
    "snowpark-connect-deps-iceberg==1.0.1",
    "numpy==1.26.4",
    "pyarrow==18.1.0",
    "pandas==2.2.3",
)
# Modules that must import in the finished venv; checked before the marker is written.
SMOKE_IMPORTS: tuple[str, ...] = ("iceberg_sink", "pyiceberg", "pyspark", "pyarrow", "pandas", "numpy")


@dataclass(frozen=True)
class JavaEnv:
    """Where the Java reader venv's interpreter and the Iceberg Spark runtime jar are."""

    python: Path
    jar: Path


class JavaEnvError(RuntimeError):
    """Creating or checking the Java reader venv failed; the message carries the tool's output."""


def default_venv_dir() -> Path:
    """``$ICEBERG_SINK_JAVA_VENV`` if set, else ``<project>/.venv-java``."""
    override = os.environ.get(VENV_ENV_VAR)
    return Path(override).expanduser().resolve() if override else DEFAULT_VENV_DIR


def _venv_python(venv_dir: Path) -> Path:
    return venv_dir / "bin" / "python"


def _project_dependencies() -> list[str]:
    """The project's declared dependencies: a change to them makes the venv be rebuilt."""
    try:
        with (PROJECT_ROOT / "pyproject.toml").open("rb") as fh:
            project = tomllib.load(fh).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        return []
    return [str(d) for d in project.get("dependencies", [])]


def _marker_payload() -> dict[str, object]:
    return {
        "requirements": list(REQUIREMENTS),
        "project": str(PROJECT_ROOT),
        "project_dependencies": _project_dependencies(),
        "jar": JAR_NAME,
    }


def _run(cmd: Sequence[str | Path], what: str, log: Path | None = None, timeout: float = 1800.0) -> str:
    """Run ``cmd`` non-interactively; raise JavaEnvError with its output if it fails."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the parent's path must not leak into the other venv
    env.pop("VIRTUAL_ENV", None)
    env["PIP_NO_INPUT"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    try:
        proc = subprocess.run(
            [str(c) for c in cmd],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, str) else (exc.stdout or b"").decode(errors="replace")
        raise JavaEnvError(f"{what}: timed out after {timeout:.0f}s: {' '.join(map(str, cmd))}\n{out}") from exc
    if log is not None:
        with log.open("a", encoding="utf-8") as fh:
            fh.write(f"$ {' '.join(map(str, cmd))}\n{proc.stdout}\n[exit {proc.returncode}]\n")
    if proc.returncode != 0:
        raise JavaEnvError(
            f"{what} failed (exit {proc.returncode}): {' '.join(map(str, cmd))}\n--- output ---\n{proc.stdout}"
        )
    return proc.stdout


def _find_jar(python: Path) -> Path:
    """Locate the Iceberg Spark runtime jar inside the installed snowpark-connect-deps-iceberg."""
    out = _run(
        [
            python,
            "-c",
            "import importlib.util, json; s = importlib.util.find_spec('snowpark_connect_deps_iceberg'); "
            "print(json.dumps(list(s.submodule_search_locations or [])))",
        ],
        "locating snowpark_connect_deps_iceberg",
    )
    for location in json.loads(out.strip().splitlines()[-1]):
        for jar in sorted(Path(location).rglob(JAR_NAME)):
            return jar
    raise JavaEnvError(f"{JAR_NAME} not found in snowpark_connect_deps_iceberg at {out.strip()}")


def _complete_env(venv_dir: Path) -> JavaEnv | None:
    """The venv if its marker says it was installed with the current pins, else None."""
    marker = venv_dir / MARKER_NAME
    python = _venv_python(venv_dir)
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or any(data.get(k) != v for k, v in _marker_payload().items()):
        return None
    jar = Path(str(data.get("jar_path", "")))
    if not python.exists() or not jar.is_file():
        return None
    return JavaEnv(python=python, jar=jar)


@contextmanager
def _locked(venv_dir: Path) -> Iterator[None]:
    # The lock lives in the temp directory, not next to the venv, so it never lands in the work tree.
    digest = hashlib.sha256(str(venv_dir).encode()).hexdigest()[:16]
    lock_path = Path(tempfile.gettempdir()) / f"iceberg-sink-java-env-{digest}.lock"
    with lock_path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _remove_incomplete(venv_dir: Path) -> None:
    if not venv_dir.exists():
        return
    if (venv_dir / "pyvenv.cfg").is_file() or not any(venv_dir.iterdir()):
        shutil.rmtree(venv_dir)
        return
    raise JavaEnvError(f"{venv_dir} exists and is not a virtualenv; refusing to delete it")


def _install(venv_dir: Path) -> JavaEnv:
    _remove_incomplete(venv_dir)
    started = time.monotonic()
    _run([sys.executable, "-m", "venv", venv_dir], "creating the Java reader venv")
    log = venv_dir / "install.log"
    python = _venv_python(venv_dir)
    pip: list[str | Path] = [python, "-m", "pip", "--no-input", "--disable-pip-version-check"]
    _run([*pip, "install", "--upgrade", "pip", "setuptools>=68", "wheel"], "upgrading pip", log)
    # One resolution for the pins and the project's own dependencies (pyiceberg, pyiceberg-core,
    # attrs, pandas<3), so a conflict between them fails here, loudly, instead of at import time.
    _run([*pip, "install", *REQUIREMENTS, "-e", PROJECT_ROOT], "installing the Java reader venv", log)
    _run([*pip, "check"], "pip check in the Java reader venv", log)
    _run(
        [python, "-c", "; ".join(f"import {m}" for m in SMOKE_IMPORTS) + "; print(pyspark.__version__)"],
        "importing the project and PySpark in the Java reader venv",
        log,
    )
    jar = _find_jar(python)
    payload = {
        **_marker_payload(),
        "jar_path": str(jar),
        "install_seconds": round(time.monotonic() - started),
    }
    tmp = venv_dir / (MARKER_NAME + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2), encoding="utf-8")
    tmp.replace(venv_dir / MARKER_NAME)
    return JavaEnv(python=python, jar=jar)


def ensure_java_env(venv_dir: Path | None = None) -> JavaEnv:
    """Create (once) and return the PySpark 3.5 + Iceberg Java 1.9.2 venv.

    ``venv_dir`` defaults to ``$ICEBERG_SINK_JAVA_VENV`` or ``<project>/.venv-java``. A complete
    venv (marker present, same pins) is reused; anything else is rebuilt from scratch. The first
    install takes a few minutes (PySpark 3.5 is built from its sdist). Raises ``JavaEnvError``
    with pip's output if anything fails.
    """
    venv_dir = Path(venv_dir).resolve() if venv_dir is not None else default_venv_dir()
    env = _complete_env(venv_dir)
    if env is not None:
        return env
    with _locked(venv_dir):
        env = _complete_env(venv_dir)  # another process may have finished while we waited
        if env is not None:
            return env
        return _install(venv_dir)


@dataclass(frozen=True)
class ReaderRuntime:
    """What one Iceberg Java reader server runs on: a Python with PySpark, and its jars.

    ``jars`` go on ``spark.jars`` (the Iceberg Spark runtime first, then the AWS SDK bundle that
    ``S3FileIO`` needs), ``class_path`` on the driver's class path (the SQLite JDBC driver of the
    catalog that ``s3://`` tables are registered in); ``label`` names the reader in assertion messages.
    """

    label: str
    iceberg_version: str
    python: Path
    jars: tuple[Path, ...]
    class_path: tuple[Path, ...]


def _sqlite_jdbc() -> tuple[Path, ...]:
    return tuple(fetch_jars(f"sqlite-jdbc-{SQLITE_JDBC_VERSION}", [f"org.xerial:sqlite-jdbc:{SQLITE_JDBC_VERSION}"]))


def _aws_bundle(version: str) -> Path:
    (jar,) = fetch_jars(f"iceberg-aws-bundle-{version}", [f"org.apache.iceberg:iceberg-aws-bundle:{version}"])
    return jar


def core_jars(version: str) -> tuple[Path, ...]:
    """``iceberg-core`` of ``version`` with its dependencies, no Spark: for checks that call Iceberg
    Java's own classes (the deletion vector reader and writer, tests/interop/test_deletion_vectors_java.py)."""
    coordinates = [f"org.apache.iceberg:iceberg-core:{version}"]
    return tuple(fetch_jars(f"iceberg-core-{version}", coordinates, transitive=True))


def reference_runtime(env: JavaEnv | None = None) -> ReaderRuntime:
    """Iceberg Java 1.9.2 on PySpark 3.5.7 (this module's venv), with iceberg-aws-bundle 1.9.2."""
    env = env if env is not None else ensure_java_env()
    return ReaderRuntime(
        label=f"Iceberg Java {REFERENCE_ICEBERG_VERSION} (Spark 3.5)",
        iceberg_version=REFERENCE_ICEBERG_VERSION,
        python=env.python,
        jars=(env.jar, _aws_bundle(REFERENCE_ICEBERG_VERSION)),
        class_path=_sqlite_jdbc(),
    )


def ensure_pip_venv(
    venv_dir: Path, requirements: Sequence[str], what: str, smoke_code: str, pip_check: bool = True
) -> Path:
    """The python of a venv holding ``requirements``, built once and reused: a venv whose marker
    holds other requirements is rebuilt, and the marker is written only after the install, ``pip
    check`` (unless ``pip_check`` is false) and ``smoke_code`` succeeded. Raises ``JavaEnvError``
    with pip's output; ``what`` names the venv in it."""
    venv_dir = venv_dir.resolve()
    python = _venv_python(venv_dir)
    payload = {"requirements": list(requirements)}

    def complete() -> bool:
        try:
            return python.exists() and json.loads((venv_dir / MARKER_NAME).read_text(encoding="utf-8")) == payload
        except (OSError, ValueError):
            return False

    if complete():
        return python
    with _locked(venv_dir):
        if complete():
            return python
        _remove_incomplete(venv_dir)
        _run([sys.executable, "-m", "venv", venv_dir], f"creating the {what} venv")
        log = venv_dir / "install.log"
        pip: list[str | Path] = [python, "-m", "pip", "--no-input", "--disable-pip-version-check"]
        _run([*pip, "install", "--upgrade", "pip", "setuptools>=68", "wheel"], "upgrading pip", log)
        _run([*pip, "install", *requirements], f"installing the {what} venv", log)
        if pip_check:
            _run([*pip, "check"], f"pip check in the {what} venv", log)
        _run([python, "-c", smoke_code], f"importing in the {what} venv", log)
        tmp = venv_dir / (MARKER_NAME + ".tmp")
        tmp.write_text(json.dumps(payload), encoding="utf-8")
        tmp.replace(venv_dir / MARKER_NAME)
    return python


def ensure_newest_python(venv_dir: Path | None = None) -> Path:
    """The python of the newest reader's venv (``NEWEST_REQUIREMENTS``), built once and reused.

    ``venv_dir`` defaults to ``$ICEBERG_SINK_JAVA_NEWEST_VENV`` or ``<project>/.venv-java-newest``; a
    venv whose marker holds other requirements is rebuilt. Raises ``JavaEnvError`` with pip's output.
    """
    override = os.environ.get(NEWEST_VENV_ENV_VAR)
    if venv_dir is None:
        venv_dir = Path(override).expanduser() if override else NEWEST_VENV_DIR
    return ensure_pip_venv(
        venv_dir, NEWEST_REQUIREMENTS, "newest Iceberg Java reader", "import pyspark, pyarrow, pandas, numpy"
    )


def newest_runtime(python: Path | None = None) -> ReaderRuntime:
    """The newest Iceberg Java (``NEWEST_ICEBERG_VERSION``) on PySpark 4.1 (``ensure_newest_python``).

    The runtime and aws-bundle jars come from Maven Central (cached).
    """
    runtime = fetch_jars(
        f"{NEWEST_RUNTIME_ARTIFACT}-{NEWEST_ICEBERG_VERSION}",
        [f"org.apache.iceberg:{NEWEST_RUNTIME_ARTIFACT}:{NEWEST_ICEBERG_VERSION}"],
    )
    return ReaderRuntime(
        label=f"Iceberg Java {NEWEST_ICEBERG_VERSION} (Spark 4.1)",
        iceberg_version=NEWEST_ICEBERG_VERSION,
        python=python if python is not None else ensure_newest_python(),
        jars=(*runtime, _aws_bundle(NEWEST_ICEBERG_VERSION)),
        class_path=_sqlite_jdbc(),
    )


if __name__ == "__main__":
    # Everything the interop readers need, built or fetched now (scripts/test.sh runs this first).
    started_at = time.monotonic()
    for runtime in (
        reference_runtime(ensure_java_env(Path(sys.argv[1]) if len(sys.argv) > 1 else None)),
        newest_runtime(),
    ):
        print(f"{runtime.label}: python={runtime.python} jars={', '.join(str(j) for j in runtime.jars)}")
    for version in (REFERENCE_ICEBERG_VERSION, NEWEST_ICEBERG_VERSION):
        print(f"iceberg-core {version}: {len(core_jars(version))} jars")
    print(f"({time.monotonic() - started_at:.1f}s)")
