"""The Spark driver's JVM options that shorten a fresh stream's start and first micro-batch.

A PySpark driver is a JVM started cold. Before its first micro-batch is written it loads and
verifies about 15,000 of Spark's classes, and on a small machine its optimizing JIT compiler (C2)
takes a core for methods that run a few thousand times during start-up and rarely after. Two
options of the JVM itself, no change to Spark or to the sink, address both
(docs/benchmarks.md, issue 41, "the driver's JVM"):

- **Class data sharing** (CDS): the classes a driver loaded are written once to an archive in a
  cache folder when it exits, and a later driver maps them ready-made. Java 19 and later make and
  renew the archive themselves (``-XX:+AutoCreateSharedArchive``); on Java 17 and 18 the first
  driver writes it at exit (``-XX:ArchiveClassesAtExit``) and the drivers after it use it. The
  archive is named by the Java runtime and by Spark's jars, so a new JDK or Spark makes a new one;
  an archive the JVM cannot use (another class path, a file cut short by a kill) is ignored by the
  JVM, which then starts as without it.
- **Later C2 compilation**: a method is compiled by C2 after 10x Java's default invocations and
  loop iterations (``-XX:Tier4*Threshold``). C1 compiles as before, and the methods a stream runs for
  every row and micro-batch still reach C2, a little later.

Usage, before the session starts (a running JVM keeps the options it was started with)::

    from iceberg_sink import driver_java_options

    spark = (SparkSession.builder.master("local[2]")
             .config("spark.driver.extraJavaOptions", driver_java_options())
             .getOrCreate())
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from iceberg_sink.errors import InvalidSinkConfigError

#: The C2 thresholds, 10x the JVM's defaults (5,000, 600, 15,000 and 40,000).
LATER_C2 = (
    "-XX:Tier4InvocationThreshold=50000",
    "-XX:Tier4MinInvocationThreshold=6000",
    "-XX:Tier4CompileThreshold=150000",
    "-XX:Tier4BackEdgeThreshold=400000",
)
#: Keeps the JVM from logging the classes it leaves out of an archive, or an archive it cannot use.
QUIET_CDS = "-Xlog:cds=off,cds+dynamic=off"
#: The Java feature version from which the JVM writes an archive of the classes it loaded.
DYNAMIC_ARCHIVE_JAVA = 13
#: The Java feature version from which the JVM makes and renews its archive itself.
AUTO_ARCHIVE_JAVA = 19


def driver_java_options(cache_dir: str | os.PathLike[str] | None = None, class_sharing: bool = True) -> str:
    """The JVM options for ``spark.driver.extraJavaOptions`` (or ``--driver-java-options``).

    Args:
        cache_dir: where the class data sharing archive is kept; default
            ``$XDG_CACHE_HOME/iceberg-sink/cds`` (``~/.cache/iceberg-sink/cds``). Created when missing.
        class_sharing: False leaves the archive out (only the later C2 compilation), as do a Java
            runtime that cannot be run or has no class data sharing of its own, and options of the
            environment that already name an archive (``JAVA_TOOL_OPTIONS``, ``JDK_JAVA_OPTIONS``,
            ``_JAVA_OPTIONS``: Java 17 refuses to start with two).

    Returns:
        The options as one string; a user's own options may follow it (the JVM takes an option's
        last value), except class data sharing ones: pass ``class_sharing=False`` with those.

    Raises:
        InvalidSinkConfigError: ``cache_dir`` is a file, or a folder that cannot be created.
    """
    options = list(LATER_C2)
    if class_sharing and not any(names_class_sharing(os.environ.get(v, "")) for v in ENVIRONMENT):
        java = _java()
        report = _java_version(java) if java is not None else None
        feature = feature_version(report) if report is not None else None
        # "sharing" in the report: the runtime maps its own archive, which Java 17's archive of a
        # driver's classes extends (without it the JVM refuses to start with -XX:ArchiveClassesAtExit).
        if (
            java is not None
            and report
            and feature is not None
            and feature >= DYNAMIC_ARCHIVE_JAVA
            and "sharing" in report
        ):
            folder = _cache_folder(cache_dir)
            options.extend(archive_options(folder, feature, archive_key(java, report, _spark_jars()), java))
    return " ".join(options)


#: Environment variables whose options every JVM takes before its command line's.
ENVIRONMENT = ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS")
_CDS_FLAGS = ("SharedArchiveFile", "ArchiveClassesAtExit", "AutoCreateSharedArchive", "Xshare", "AOTCache", "AOTMode")


def names_class_sharing(options: str) -> bool:
    """Whether JVM options already choose a class data sharing archive (or turn sharing off)."""
    return any(flag in options for flag in _CDS_FLAGS)


#: A partial archive younger than this may still be being written by a JVM that is exiting.
SETTLED_S = 60.0
#: The first bytes of a dynamic archive (CDS_DYNAMIC_ARCHIVE_MAGIC, little-endian).
DYNAMIC_MAGIC = (0xF00BABA8).to_bytes(4, "little")


def archive_options(folder: Path, feature: int, key: str, java: str) -> list[str]:
    """The class data sharing options for a Java runtime (``java``) of ``feature`` version: the
    archive in ``folder`` named by ``key``, used when it exists, written at exit when it does not."""
    archive = folder / f"spark-{key}.jsa"
    if feature >= AUTO_ARCHIVE_JAVA:
        # The JVM checks the archive and writes a new one at exit when it cannot use it.
        return ["-XX:+AutoCreateSharedArchive", f"-XX:SharedArchiveFile={archive}", QUIET_CDS]
    if _promote(folder, archive, java):
        return [f"-XX:SharedArchiveFile={archive}", QUIET_CDS]
    # Java 17 and 18 map an archive cut short (a driver killed while writing it at exit) and crash
    # (SIGBUS), so a driver writes under a name of its own and a later call checks the file with the
    # JVM itself before it takes the archive's name.
    partial = folder / f"{archive.stem}.{os.getpid()}-{secrets.token_hex(4)}.partial"
    return [f"-XX:ArchiveClassesAtExit={partial}", QUIET_CDS]


def _promote(folder: Path, archive: Path, java: str) -> bool:
    """Give ``archive``'s name to a settled partial archive the JVM starts with, unless it has one;
    remove the other settled partials (drivers started before the archive existed each wrote one).
    True when the archive exists now."""
    now = time.time()
    for partial in sorted(folder.glob(f"{archive.stem}.*.partial")):
        try:
            if now - partial.stat().st_mtime < SETTLED_S:
                continue
            if not archive.is_file() and _usable(partial, java):
                os.replace(partial, archive)
            else:
                partial.unlink()
        except OSError:
            continue  # another driver took or removed it meanwhile
    return archive.is_file()


def _usable(partial: Path, java: str) -> bool:
    """Whether ``java`` starts with ``partial`` as its archive (one cut short crashes it)."""
    with partial.open("rb") as f:
        if f.read(4) != DYNAMIC_MAGIC:
            return False
    command = [
        java,
        f"-XX:SharedArchiveFile={partial}",
        QUIET_CDS,
        "-XX:-CreateCoredumpOnCrash",
        f"-XX:ErrorFile={os.devnull}",
        "-version",
    ]
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False, cwd=partial.parent)
    except (OSError, subprocess.SubprocessError):
        return False
    return run.returncode == 0


def _cache_folder(cache_dir: str | os.PathLike[str] | None) -> Path:
    if cache_dir is None:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        folder = Path(base) / "iceberg-sink" / "cds"
    else:
        folder = Path(cache_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InvalidSinkConfigError(
            f"driver_java_options(cache_dir=...): expected a folder the archive can be written to, "
            f"received {str(folder)!r} ({e.strerror or e})"
        ) from e
    return folder


def _java() -> str | None:
    """The java Spark's launcher runs: ``$JAVA_HOME/bin/java``, else the one on the PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        return str(candidate) if candidate.is_file() else None
    return shutil.which("java")


def _java_version(java: str) -> str | None:
    """``java -version``'s report, or None when it does not run."""
    try:
        run = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return run.stderr if run.returncode == 0 and run.stderr else None


def feature_version(report: str) -> int | None:
    """The feature version in a ``java -version`` report: 17 of ``openjdk version "17.0.13"``, 8 of
    ``"1.8.0_392"``; None when the report names none."""
    found = re.search(r'version "(\d+)(?:\.(\d+))?', report)
    if found is None:
        return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major


def archive_key(java: str, version: str, jars: Sequence[Path]) -> str:
    """A name for the archive of this Java runtime and these Spark jars: any change makes a new one."""
    listing = sorted(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in jars if p.is_file())
    text = "\n".join([str(Path(java).resolve()), version, *listing])
    feature = feature_version(version)
    return f"java{feature}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _spark_jars() -> list[Path]:
    """The jars of the Spark PySpark starts: ``$SPARK_HOME/jars``, else PySpark's own."""
    home = os.environ.get("SPARK_HOME")
    if not home:
        import pyspark  # start-up cost: only to find its folder

        home = str(Path(pyspark.__file__).parent)
    return sorted((Path(home) / "jars").glob("*.jar"))
