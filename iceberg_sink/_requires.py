"""Imported first by ``iceberg_sink/__init__.py``: without PySpark, importing iceberg_sink fails with
one line saying what to install, instead of a bare ``ModuleNotFoundError`` from deep inside sink.py.

PySpark (and pandas<3, which its Arrow conversion needs) come with the ``spark`` extra:
``pip install 'iceberg-sink[spark]'``.
"""

from __future__ import annotations

import importlib.util

MISSING_PYSPARK = "iceberg_sink needs PySpark, which is not installed: pip install 'iceberg-sink[spark]'"

if importlib.util.find_spec("pyspark") is None:
    raise ModuleNotFoundError(MISSING_PYSPARK, name="pyspark")
