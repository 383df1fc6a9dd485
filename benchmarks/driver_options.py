"""The driver JVM a benchmark's Spark session starts with: the sink's ``driver_java_options()``
(class data sharing and later C2 compilation, iceberg_sink/_driver_jvm.py) or Spark's defaults.

- ``sink``: ``driver_java_options()`` with its default cache folder, as the guides run it; after a
  first run on the machine the class data sharing archive is there and used.
- ``sink-new-archive``: the same options over an empty cache folder of the run: a first start, whose
  JVM writes the archive at exit (Java 17 and 18) instead of using one.
- ``none``: no driver JVM options (Spark's and the JVM's defaults).
"""

from __future__ import annotations

import argparse
from pathlib import Path

MODES = ("sink", "sink-new-archive", "none")


def java_options(mode: str, scratch: Path) -> str:
    """The ``spark.driver.extraJavaOptions`` of ``mode`` ("" for none); ``scratch``: the run's own folder."""
    if mode not in MODES:
        raise ValueError(f"driver JVM mode: expected one of {MODES}, received {mode!r}")
    if mode == "none":
        return ""
    from iceberg_sink import driver_java_options

    return driver_java_options(cache_dir=scratch / "cds") if mode == "sink-new-archive" else driver_java_options()


def class_sharing(options: str) -> str:
    """What the options do with a class data sharing archive: used, written at exit, made and renewed
    by the JVM itself (Java 19+), or none."""
    if "AutoCreateSharedArchive" in options:
        return "auto"
    if "ArchiveClassesAtExit=" in options:
        return "written at exit"
    return "used" if "SharedArchiveFile=" in options else "none"


def add_argument(parser: argparse.ArgumentParser) -> None:
    """``--driver-jvm``: one of :data:`MODES`, ``sink`` by default (as the guides run)."""
    parser.add_argument(
        "--driver-jvm",
        choices=list(MODES),
        default="sink",
        help="the driver JVM's options: driver_java_options() (default, as the guides), the same over a new "
        "archive folder (a first start), or none (benchmarks/driver_options.py)",
    )
