"""Imported first by ``iceberg_sink/__init__.py``: without PySpark, importing iceberg_sink fails with
one line saying what to install, instead of a bare ``ModuleNotFoundError`` from deep inside sink.py.

PySpark (and pandas<3, which its Arrow conversion needs) come with the ``spark`` extra:
``pip install 'iceberg-sink[spark]'``. The ``iceberg-sink`` command prints that line alone (no
traceback) and exits with code 2.
"""

from __future__ import annotations

import importlib.util
import os
import sys

MISSING_PYSPARK = "iceberg_sink needs PySpark, which is not installed: pip install 'iceberg-sink[spark]'"


def _has_pyspark() -> bool:
    try:
        return importlib.util.find_spec("pyspark") is not None
    except (ImportError, ValueError):  # an import hook refusing it, a broken half-installed package
        return False


if not _has_pyspark():
    if os.path.basename(sys.argv[0] if sys.argv else "") in ("iceberg-sink", "iceberg-sink.exe"):
        print(f"iceberg-sink: {MISSING_PYSPARK}", file=sys.stderr)
        raise SystemExit(2)
    raise ModuleNotFoundError(MISSING_PYSPARK, name="pyspark")
