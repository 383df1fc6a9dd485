"""A check that Spark's Python workers can run the writers, once per SparkContext.

The driver may run in one Python environment while the workers run another interpreter
(``PYSPARK_PYTHON`` / ``spark.pyspark.python``, or another machine's Python). Without the modules
the tasks need, every task would fail with its own JVM stack trace. Before the first write, one
single-task job looks for them on a worker and reports what is missing: :class:`WorkerEnvironmentError`
names the interpreter and the modules.

The probe finds the modules (``importlib.util.find_spec``) without importing them: importing pyarrow,
pandas and pyiceberg in a worker the first batch does not reuse (an RDD job's Python workers come
from another daemon than a SQL job's) cost about 1.5 s of every ``start()`` and ``write()`` call. A
module that is installed but fails to import still fails the first task, with its own error.

The probe function is compiled from source in a namespace that is not an importable module, so
cloudpickle ships it by value: it must run on a worker where ``iceberg_sink`` itself is missing.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from pyspark.sql import SparkSession

from iceberg_sink.errors import WorkerEnvironmentError
from iceberg_sink.writer.spark import task_failure

# What a writer or rewrite task imports: the sink (and through it everything else it needs).
REQUIRED_MODULES = ("pyarrow", "pandas", "pyiceberg", "pyiceberg_core", "attrs", "iceberg_sink.writer.task_writer")

_PROBE_SOURCE = """
def probe(_rows):
    import importlib.util
    import json
    import sys

    missing = []
    for name in MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
            error = f"No module named {name!r}"
            absent = name
        except ImportError as e:  # a parent package is missing, or fails to import
            found, error, absent = False, str(e), getattr(e, "name", None) or name
        if not found:
            missing.append({"module": name, "missing": absent, "error": error})
    yield json.dumps({"python": sys.executable, "version": sys.version.split()[0], "missing": missing})
"""

# The probe's Spark job group (to find its jobs in Spark's status tracker).
PROBE_JOB_GROUP = "iceberg_sink-worker-check"

_JOB_GROUP_PROPERTIES = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
_checked: set[tuple[str, str]] = set()
_lock = threading.Lock()


def _probe_function(modules: tuple[str, ...]) -> Any:
    namespace: dict[str, Any] = {"__name__": "iceberg_sink_worker_probe", "MODULES": modules}
    exec(compile(_PROBE_SOURCE, "<iceberg_sink worker probe>", "exec"), namespace)
    return namespace["probe"]


def check_python_workers(spark: SparkSession, modules: tuple[str, ...] = REQUIRED_MODULES) -> None:
    """Raise :class:`WorkerEnvironmentError` unless a Python worker of ``spark`` imports ``modules``.

    Runs one single-task job the first time per SparkContext and worker interpreter; later calls
    return at once.
    """
    context = spark.sparkContext
    interpreter = str(getattr(context, "pythonExec", "python3"))
    key = (str(context.applicationId), interpreter)
    with _lock:
        if key in _checked:
            return
    saved = {k: context.getLocalProperty(k) for k in _JOB_GROUP_PROPERTIES}
    context.setJobGroup(PROBE_JOB_GROUP, "iceberg_sink: check the Python workers' environment")
    try:
        replies = context.parallelize([0], 1).mapPartitions(_probe_function(modules)).collect()
    except Exception as e:
        failure = task_failure(e)
        if failure is None:
            raise
        raise WorkerEnvironmentError(
            f"Spark's Python workers (interpreter {interpreter!r}, from spark.pyspark.python or PYSPARK_PYTHON) "
            f"could not run a one-task check of the modules iceberg_sink needs: {failure}. Check that this "
            "interpreter exists on every worker and has iceberg_sink installed, or point PYSPARK_PYTHON / "
            "spark.pyspark.python at one that does. Nothing was written."
        ) from e
    finally:
        for name, value in saved.items():
            context.setLocalProperty(name, value)  # type: ignore[arg-type]  # None removes it
    reply = json.loads(replies[0])
    if reply["missing"]:
        names = sorted({m["missing"] for m in reply["missing"]})
        details = "; ".join(f"import {m['module']}: {m['error']}" for m in reply["missing"])
        raise WorkerEnvironmentError(
            f"Spark's Python workers run {reply['python']} (Python {reply['version']}), which lacks "
            f"{', '.join(names)} ({details}). The writers run there: install iceberg_sink (pip install iceberg-sink) "
            "into that interpreter's environment on every worker, or point PYSPARK_PYTHON / spark.pyspark.python "
            "at an interpreter that has it. Nothing was written."
        )
    with _lock:
        _checked.add(key)
