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

Where Spark runs its Python workers on this machine (a ``local`` master), the probe needs no Spark
job: the workers' interpreter runs the same lookup in a subprocess here, with the environment Spark
gives its workers (``PYTHONPATH`` from ``spark.executorEnv`` and this process) and without the working
directory on its path, a subset of what a worker's path holds. That takes a fraction of a second
where the Spark job took 2-3 s of every ``start()`` (it starts a Python daemon whose workers the first
batch does not reuse). If the subprocess cannot run or misses a module, the Spark job decides: a
worker may still have what the subprocess lacked (``addPyFile``), and its answer names what is missing.

The probe function is compiled from source in a namespace that is not an importable module, so
cloudpickle ships it by value: it must run on a worker where ``iceberg_sink`` itself is missing.

:func:`start_python_workers` starts the workers a stream's first write task will reuse, in the
background while Spark plans that micro-batch: a new Python worker imports the writer (PyArrow,
PyIceberg, pandas; 0.4-0.5 s here) before its first task can run, and a write task holds two (the
Debezium row reader's Arrow function and the writer's ``mapInArrow``). A first micro-batch of a
160-column Debezium table spent 1.2-1.4 s of its write job waiting for them (docs/benchmarks-debezium-wide.md).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from iceberg_sink.errors import WorkerEnvironmentError
from iceberg_sink.writer.spark import task_failure
from iceberg_sink.writer.task_start import task_start

logger = logging.getLogger(__name__)

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

# What the local check runs: the probe's lookup, printed, with the working directory ('' first on
# sys.path under -c) left off the path, since a worker's working directory may differ from ours.
_LOCAL_SOURCE = (
    _PROBE_SOURCE
    + """
import sys as _sys
if _sys.path and _sys.path[0] == "":
    del _sys.path[0]
print(next(probe(None)))
"""
)

# Seconds the local check may take before the Spark job decides instead.
_LOCAL_TIMEOUT = 60.0

_JOB_GROUP_PROPERTIES = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
_checked: set[tuple[str, str]] = set()
_lock = threading.Lock()


def _probe_function(modules: tuple[str, ...]) -> Any:
    namespace: dict[str, Any] = {"__name__": "iceberg_sink_worker_probe", "MODULES": modules}
    exec(compile(_PROBE_SOURCE, "<iceberg_sink worker probe>", "exec"), namespace)
    return namespace["probe"]


def check_python_workers(spark: SparkSession, modules: tuple[str, ...] = REQUIRED_MODULES) -> None:
    """Raise :class:`WorkerEnvironmentError` unless a Python worker of ``spark`` imports ``modules``.

    Checks once per SparkContext and worker interpreter (later calls return at once): on a ``local``
    master with a subprocess of that interpreter, else (or if that misses a module) with one
    single-task Spark job.
    """
    context = spark.sparkContext
    key = _context_key(context)
    interpreter = key[1]
    with _lock:
        if key in _checked:
            return
    if _local_check(context, interpreter, modules):
        with _lock:
            _checked.add(key)
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


def _context_key(context: Any) -> tuple[str, str]:
    """What the check and the start are done once for: the SparkContext and its workers' interpreter."""
    return str(context.applicationId), str(getattr(context, "pythonExec", "python3"))


def _local_check(context: Any, interpreter: str, modules: tuple[str, ...]) -> bool:
    """Whether the workers' interpreter, run here with the workers' environment, finds ``modules``.

    Only for a ``local`` master, whose Python workers run on this machine; False whenever that is not
    proven (another master, the interpreter cannot run, a module is missing): the Spark job decides.
    """
    master = str(context.master)
    if not (master == "local" or master.startswith("local[")):
        return False
    environment = {str(k): str(v) for k, v in dict(getattr(context, "environment", {}) or {}).items()}
    env = {**os.environ, **environment}
    paths = [environment.get("PYTHONPATH", ""), os.environ.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    namespace = "MODULES = " + repr(tuple(modules)) + "\n"
    try:
        done = subprocess.run(
            [interpreter, "-c", namespace + _LOCAL_SOURCE],
            env=env,
            capture_output=True,
            text=True,
            timeout=_LOCAL_TIMEOUT,
            check=False,
        )
        reply = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return False
    return isinstance(reply, dict) and reply.get("missing") == []


# The warm-up's Spark job group and description (to find its jobs in Spark's status tracker and UI).
START_JOB_GROUP = "iceberg_sink-worker-start"
#: Python functions a write task chains, each in a worker of its own: the Debezium row reader's
#: Arrow function and the writer's mapInArrow. The warm-up chains as many in one task.
STARTED_WORKERS = 2
_started: set[tuple[str, str]] = set()


def start_python_workers(spark: SparkSession, modules: tuple[str, ...]) -> None:
    """Start, in the background, the Python workers the first write task will reuse, ``modules``
    imported: one single-task job of :data:`STARTED_WORKERS` chained ``mapInArrow`` functions (a
    Python worker each), once per SparkContext and worker interpreter; nothing when
    ``spark.python.worker.reuse`` is off (no task would reuse them). Its failure is logged at DEBUG
    only: the first write task reports its own."""
    context = spark.sparkContext
    if str(context.getConf().get("spark.python.worker.reuse", "true")).strip().lower() == "false":
        return
    key = _context_key(context)
    with _lock:
        if key in _started:
            return
        _started.add(key)
    threading.Thread(target=_run_start, args=(spark, modules), name="iceberg_sink-python-workers", daemon=True).start()


def _run_start(spark: SparkSession, modules: tuple[str, ...]) -> None:
    # A thread of its own: its job group is its own (PySpark pins a JVM thread to each Python thread).
    spark.sparkContext.setJobGroup(START_JOB_GROUP, "iceberg_sink: start the writers' Python workers")
    try:
        started = spark.range(1, numPartitions=1)
        for _ in range(STARTED_WORKERS):
            started = started.mapInArrow(_starting(modules), "id long")  # type: ignore[arg-type]
        started.collect()
    except Exception as e:  # a stopped session, a worker without the modules: the writers say so
        logger.debug("iceberg_sink: starting the Python workers failed: %s", e)


def _starting(modules: tuple[str, ...]) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A task function that imports ``modules`` in its worker and then starts as every task the sink
    ships does (writer/task_start.py: the worker's heap settled, the imports in it)."""

    def start(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception:  # the write task that needs it fails with its own error
                break
        task_start()  # after the imports, so the worker's heap is settled with them in it
        yield from batches

    return start
