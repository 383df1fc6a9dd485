"""The randomized model check: a seeded driver runs real Spark writes and real commits through the public
API, applies the same operations to plain Python models, and compares after every step.

Tables (one SQLite catalog, one local warehouse):

- ``db.main`` (format v2, key ``id``, partitioned by ``bucket(4, id)``): written by a CDC sink (job A,
  ``cdc(op_column="op", key=["id"], order_by="lsn")``) and an upsert sink (job B, a second writer with a
  custom snapshot-property prefix, ``upsert(key=["id"], order_by="lsn")``). Model: ``dict id -> row``.
- branch ``b`` of ``db.main``: an upsert sink with ``.branch("b")`` (job C). Model: a copy of the main
  model taken at the branch's first commit, then its own.
- ``db.app`` (format v2, no key, ``bucket(2, id)``): an append sink (job D, custom snapshot-property
  prefix) and plain PyIceberg appends (a second writer). Model: a multiset of rows.
- ``db.v3`` and ``db.v2up`` (format v3 from creation / upgraded from v2 mid-run; CDC sinks, Iceberg
  Java's DELETE, compaction): tests/model/v3_steps.py.

Models hold rows under *logical* column names; ``Columns`` maps them to the table's current names and
types, so renames, added columns and widened types are applied to the model as to the table.

After every step each changed table (and the branch) is read by Apache Iceberg Java and by DuckDB and
compared with its model, plus filtered Java reads with random predicates (key equality, string and long
ranges, IS NULL, dates), which go through the column metrics / bounds of the files. Every sink
checkpoint must be exactly one snapshot (over the whole run, also after expiry) and no snapshot summary
total may be negative.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import json
import os
import pickle
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pyarrow as pa
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import BucketTransform, TruncateTransform
from pyiceberg.types import (
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    NestedField,
    StringType,
    StructType,
)
from pyspark.sql import DataFrame, SparkSession

from iceberg_sink import (
    CommitStateUnknownError,
    IcebergSink,
    InvalidInputError,
    PendingCheckpointsLimitError,
    SchemaMismatchError,
    _faults,
    options,
)
from iceberg_sink._iceberg.files import to_meta
from iceberg_sink._iceberg.retry import RetryPolicy
from iceberg_sink._sql import named
from iceberg_sink.committer.store import CheckpointStore
from iceberg_sink.job import codegen
from iceberg_sink.table.catalog import embedded_catalog_uri, embedded_warehouse
from iceberg_sink.table.names import allowed, table_name_problem
from iceberg_sink.topology import maintenance
from iceberg_sink.topology.compaction import CompactionConfig, compact
from tests.interop.readers import JavaIcebergReader, JavaReaderError, duckdb_connect, duckdb_read, normalize
from tests.model import debezium_steps, transactions_steps, v3_steps
from tests.model.debezium_steps import DEBEZIUM
from tests.model.points import FAULT_POINTS, Crash
from tests.model.transactions_steps import TRANSACTIONS

ADAPTIVE = "spark.sql.adaptive.enabled"
SHUFFLE = "spark.sql.shuffle.partitions"
Row = dict[str, Any]

# Operation kinds and their weights. ICEBERG_SINK_MODEL_SKIP=a,b disables kinds (default: none).
OPERATIONS: dict[str, int] = {
    "cdc": 14,
    "upsert": 8,
    "branch_upsert": 5,
    "append": 5,
    "pyiceberg_append": 3,
    "crash": 6,
    "compaction": 5,
    "convert_deletes": 5,  # equality deletes -> position deletes, alone or racing compaction / the stream
    "expire_snapshots": 3,
    "remove_orphans": 1,
    "rewrite_manifests": 2,
    "spec_evolution": 3,
    "schema_evolution": 4,
    "sink_schema_evolution": 3,  # the sink itself adds a column (and widens) for a batch that needs it
    "commit_properties": 2,
    "catalog_outage": 3,  # a stream's commits cannot land for a few checkpoints (catalog unreachable, or races
    # lost to another writer on every attempt): pending, then committed in order
    "sigkill": 2,  # a real SIGKILL of a subprocess driver; long profile only (a Spark start-up per kill)
    **v3_steps.OPERATIONS,  # format v3 tables db.v3 and db.v2up: tests/model/v3_steps.py
}
LONG_ONLY = {"sigkill"}
# Situations inside operations that can be switched off the same way (to look past a known bug).
SCENARIOS: set[str] = {"branch_on_empty_table", "expire_before_restart", "long_strings", "struct_column"}
SKIP_ENV = "ICEBERG_SINK_MODEL_SKIP"
# A routed CDC job (one sink, several tables: docs/routing.md), run between steps with a generator of
# its own (so adding it kept every seed's sequence of the other operations); skip it as "routed_cdc".
ROUTED = "routed_cdc"
ROUTED_EVERY = 0.2  # chance after each step
ROUTED_TABLES = ("rt.r0", "rt.r1", "rt.r2", "rt.rk")
# rt.rk is keyed by (g, id), named by its rows in the key column (iceberg_sink/table/keys.py); the
# others by the builder's default key (id). Equal ids of two g's are different rows of rt.rk.
ROUTED_OWN_KEY = "rt.rk"
# Where the routed job's driver may die: a checkpoint's points, and the two inside an atomic commit's
# transaction (after the first table's pointer moved; after it committed, before anyone saw it).
ROUTED_FAULT_POINTS = (*FAULT_POINTS, _faults.BETWEEN_TABLE_SWAPS, _faults.TRANSACTION_COMMITTED)
ROUTED_KEYS = 10
# Hostile routed table names (issue 18, iceberg_sink/table/names.py): after a routed step, with a
# generator of their own, a batch of the routed job mixes good rows with rows naming hostile tables;
# the whole batch must be refused (nothing committed, no table created) and every routed table stay
# as its model says. Skip it as "hostile_routed_names".
HOSTILE = "hostile_routed_names"
HOSTILE_EVERY = 0.5  # chance after each routed step
# Other writers under a running stream (issue 18 section 6), run between steps with a generator of their
# own, like the routed job; skip them all as "other_writers", or one kind by its name.
OTHER_WRITERS = "other_writers"
OTHER_WRITERS_EVERY = 0.15  # chance after each step
OTHER_WRITER_KINDS = ("rename_under_stream", "drop_under_stream", "expire_under_stream", "lost_answer_then_outage")
KEYS = 48  # key space of db.main: small, so updates, deletes and repeated keys are frequent
BASE_DATE = dt.date(2024, 1, 1)
UNICODE = ["ü", "日本", "🙂", "ß", "Ω", "é", "\u00a0", "中文字"]
BRANCH = "b"


def skipped_operations() -> set[str]:
    raw = os.environ.get(SKIP_ENV, "")
    names = {n.strip() for n in raw.split(",") if n.strip()}
    jobs = [ROUTED, HOSTILE, OTHER_WRITERS, *OTHER_WRITER_KINDS, DEBEZIUM, TRANSACTIONS]
    unknown = names - set(OPERATIONS) - SCENARIOS - set(jobs)
    if unknown:
        known = sorted(OPERATIONS) + sorted(SCENARIOS) + jobs
        raise ValueError(f"{SKIP_ENV}: unknown operation kinds {sorted(unknown)}; known: {known}")
    return names


@attrs.define
class Columns:
    """Logical column -> (current name, Spark type) of one table, in table order."""

    names: dict[str, str]
    types: dict[str, str]
    # struct columns: logical sub-field -> (current name, Spark type)
    nested: dict[str, dict[str, tuple[str, str]]] = attrs.Factory(dict)

    def spark_type(self, logical: str) -> str:
        if logical in self.nested:
            subs = ", ".join(f"`{n}`: {t}" for n, t in self.nested[logical].values())
            return f"struct<{subs}>"
        return self.types[logical]

    def ddl(self, extra: str = "") -> str:
        cols = [f"`{self.names[c]}` {self.spark_type(c)}" for c in self.names]
        return ", ".join(cols + ([extra] if extra else []))

    def arrow_schema(self) -> pa.Schema:
        return pa.schema([(self.names[c], self._arrow(c)) for c in self.names])

    def _arrow(self, logical: str) -> pa.DataType:
        arrow = {
            "bigint": pa.int64(),
            "int": pa.int32(),
            "float": pa.float32(),
            "double": pa.float64(),
            "string": pa.string(),
            "date": pa.date32(),
        }
        if logical in self.nested:
            return pa.struct([(n, arrow[t]) for n, t in self.nested[logical].values()])
        return arrow[self.types[logical]]

    def physical(self, row: Row) -> Row:
        out = {}
        for c, name in self.names.items():
            value = row.get(c)
            if c in self.nested and value is not None:
                value = {n: value.get(sub) for sub, (n, _) in self.nested[c].items()}
            out[name] = value
        return out

    def spark_value(self, logical: str, row: Row) -> Any:
        value = row.get(logical)
        if logical in self.nested and value is not None:
            return tuple(value.get(sub) for sub in self.nested[logical])
        return value


@attrs.define
class SinkJob:
    """One sink (job) and its checkpoint location; ``next_checkpoint`` is its next checkpoint id."""

    name: str
    build: Callable[[], IcebergSink]
    location: str
    prefix: str
    sink: IcebergSink | None = None
    next_checkpoint: int = 0

    def get(self) -> IcebergSink:
        if self.sink is None:
            self.sink = self.build()
        return self.sink

    def restart(self) -> IcebergSink:
        """A new sink object from the same builder and checkpoint location: a restarted driver."""
        self.sink = self.build()
        return self.sink


WORLD_FOLDER = "lake é %41 a+b"
"""The folder of a model world: a space, a literal ``%41``, ``+`` and a non-ASCII letter (the embedded
catalog's spelling of it, table/catalog.py; locations must name the folder files land in)."""

CHECKPOINT_SPELLINGS = ("file:{path}", "file://{path}", "{path}")
"""How the jobs spell their checkpoint locations, by the folder's name: Spark reads each literally
(committer/store.py ``checkpoint_parts``), and so must the sink."""


def checkpoint_location(path: Path) -> str:
    """``path`` spelled one of :data:`CHECKPOINT_SPELLINGS` (chosen by its name, so runs are reproducible)."""
    spelling = CHECKPOINT_SPELLINGS[sum(path.name.encode()) % len(CHECKPOINT_SPELLINGS)]
    return spelling.format(path=path)


class ModelMismatch(AssertionError):
    pass


def hostile_table_name(rng: random.Random) -> str | None:
    """A routed table name the sink must refuse: control characters (often inside the name of a
    real routed table, so that dropping them would alias it), URL-special characters, dots (empty
    parts, nested or other namespaces), very long names, non-ASCII letters, or null."""
    base = rng.choice([t.split(".")[1] for t in ROUTED_TABLES])
    at = rng.randrange(len(base) + 1)
    kind = rng.choice(["control", "url", "dots", "long", "unicode", "null"])
    if kind == "control":
        return base[:at] + rng.choice("\n\t\r\x00\x01\x1b\x1f\x7f") + base[at:]
    if kind == "url":
        return base[:at] + rng.choice(["#", "?", "%", "%2F", "/", "\\", ":", " ", '"', "<", "|", "*"]) + base[at:]
    if kind == "dots":
        return rng.choice([f"rt.{base}.x", f"other.{base}", f".{base}", f"{base}.", f"rt..{base}", f"rt.{base}.", "."])
    if kind == "long":
        too_long_table = (base * 200)[: rng.randrange(151, 400)]
        return rng.choice([too_long_table, "rt." + "n" * rng.randrange(98, 200) + "." + base])
    if kind == "unicode":
        return base[:at] + rng.choice(["é", "日本", "\u00a0", "\u200b"]) + base[at:]
    return None


def _short(value: Any) -> Any:
    if isinstance(value, str) and len(value) > 40:
        return f"{value[:20]!r}...<{len(value)} chars>...{value[-8:]!r}"
    return value


def _show(rows: list[Row]) -> str:
    return "\n".join("      " + repr({k: _short(v) for k, v in r.items()}) for r in rows[:20]) + (
        f"\n      ... {len(rows) - 20} more" if len(rows) > 20 else ""
    )


def diff_rows(expected: list[Row], actual: list[Row]) -> str:
    exp = collections.Counter(repr(r) for r in expected)
    act = collections.Counter(repr(r) for r in actual)
    by_repr = {repr(r): r for r in expected + actual}
    missing = [by_repr[k] for k, n in (exp - act).items() for _ in range(n)]
    extra = [by_repr[k] for k, n in (act - exp).items() for _ in range(n)]
    return (
        f"    expected {len(expected)} rows, read {len(actual)}\n"
        f"    missing (in model, not in table):\n{_show(missing)}\n"
        f"    extra (in table, not in model):\n{_show(extra)}"
    )


class World:
    """Tables, sinks, models and the trace of one seeded run."""

    def __init__(
        self,
        spark: SparkSession,
        java: JavaIcebergReader,
        root: Path,
        seed: int,
        long: bool = False,
        java_newest: JavaIcebergReader | None = None,
    ) -> None:
        self.spark = spark
        self.java = java
        self.java_newest = java_newest  # the newest Iceberg Java: v3 tables need it (v3_steps.py)
        # Everything of the world (catalog, warehouse, checkpoints) lives in a folder whose path holds
        # characters URLs escape or read, and the jobs spell their checkpoint locations three ways
        # (Hadoop's file:/, a file:// URI, a plain path): see CHECKPOINT_SPELLINGS.
        root = root / WORLD_FOLDER
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.seed = seed
        self.rng = random.Random(seed)
        self.trace: list[str] = []
        self.long = long
        self.skip = skipped_operations() | (set() if long else LONG_ONLY)
        if java_newest is None:
            self.skip |= set(v3_steps.OPERATIONS)
        self.lsn = 0
        self.catalog_props = {
            "type": "sql",
            "uri": embedded_catalog_uri(root),
            "warehouse": embedded_warehouse(root),
        }
        (root / "warehouse").mkdir(parents=True, exist_ok=True)
        self.catalog: Catalog = load_catalog("model", **self.catalog_props)
        self.catalog.create_namespace("db")
        self.main_cols = Columns(
            names={c: c for c in ("id", "s", "n", "f", "d", "dt", "lsn", "m")},
            types={
                "id": "bigint",
                "s": "string",
                "n": "int",
                "f": "float",
                "d": "double",
                "dt": "date",
                "lsn": "bigint",
                "m": "struct",
            },
            nested={"m": {"a": ("a", "string"), "b": ("b", "int")}},
        )
        struct_fields = [
            NestedField(
                8,
                "m",
                StructType(
                    NestedField(9, "a", StringType(), required=False),
                    NestedField(10, "b", IntegerType(), required=False),
                ),
                required=False,
            )
        ]
        if "struct_column" in self.skip:
            del self.main_cols.names["m"], self.main_cols.types["m"], self.main_cols.nested["m"]
            struct_fields = []
        self.app_cols = Columns(
            names={c: c for c in ("id", "s", "n", "dt")},
            types={"id": "bigint", "s": "string", "n": "bigint", "dt": "date"},
        )
        # Merging on commit and metadata retention, drawn per table so merges happen during the run.
        main_props, app_props = self.commit_properties(), self.commit_properties()
        # Codecs spelled as Iceberg Java accepts them (any case), drawn from a generator of their own
        # so every seed keeps its operation sequence: each table's files in one, read by every reader.
        # Not "UNCOMPRESSED": PyIceberg, one of the other writers, passes it to PyArrow, which has no
        # codec of that name (tests/integration/test_property_spellings.py covers it for the sink).
        codec_rng = random.Random(f"codec-{seed}")
        for props in (main_props, app_props):
            props["write.parquet.compression-codec"] = codec_rng.choice(
                ["zstd", "ZSTD", "Snappy", "LZ4_RAW", "gzip", "uncompressed"]
            )
        self.codecs = {p["write.parquet.compression-codec"].lower() for p in (main_props, app_props)}
        self.catalog.create_table(
            "db.main",
            Schema(
                NestedField(1, "id", LongType(), required=True),
                NestedField(2, "s", StringType(), required=False),
                NestedField(3, "n", IntegerType(), required=False),
                NestedField(4, "f", FloatType(), required=False),
                NestedField(5, "d", DoubleType(), required=False),
                NestedField(6, "dt", DateType(), required=False),
                NestedField(7, "lsn", LongType(), required=False),
                *struct_fields,
                identifier_field_ids=[1],
            ),
            partition_spec=PartitionSpec(PartitionField(1, 1000, BucketTransform(4), "id_bucket")),
            # Several row groups per file, so file-level bounds must cover every row group.
            properties={"format-version": "2", "write.parquet.row-group-limit": "3", **main_props},
        )
        self.catalog.create_table(
            "db.app",
            Schema(
                NestedField(1, "id", LongType(), required=False),
                NestedField(2, "s", StringType(), required=False),
                NestedField(3, "n", LongType(), required=False),
                NestedField(4, "dt", DateType(), required=False),
            ),
            partition_spec=PartitionSpec(PartitionField(1, 1000, BucketTransform(2), "id_bucket")),
            properties={"format-version": "2", "write.parquet.row-group-limit": "3", **app_props},
        )
        self.main_model: dict[int, Row] = {}
        self.branch_model: dict[int, Row] | None = None  # None until the branch's first commit
        self.app_model: list[Row] = []
        self.added_columns = 0
        self.renames = 0
        compaction = "compaction" not in self.skip
        every = self.rng.choice([3, 4, 6])
        # Drawn from a generator of their own so that adding them kept every seed's operation
        # sequence. Small buffers open files early; small limits then make writer tasks close the
        # least recently used ones, cutting a partition into several files in one checkpoint.
        writer_rng = random.Random(f"max-open-files-{seed}")
        self.max_open_files = writer_rng.choice([1, 2, 3, 100])
        self.buffer_bytes = writer_rng.choice([1, 4096, 16 * 1024 * 1024])
        # CDC batches reduced in one task without a shuffle (the default for small batches) or
        # always through the shuffle (0): both ways must agree with the model.
        self.single_task_max_bytes = random.Random(f"single-task-{seed}").choice([0, 8 * 1024 * 1024])
        # Batches Spark can size (cached, so their bytes are known) or not (Python rows), written with
        # Spark's code generation (0) or, when sized small enough, without it (job/codegen.py).
        sizing_rng = random.Random(f"sized-{seed}")
        self.sized_batches = sizing_rng.choice([False, True])
        self.sized_files = 0
        self.interpreted_max_rows = sizing_rng.choice([0, 10_000])
        # Changes reduced in the writer tasks (job/reduction.py): never, as for a bounded write
        # (auto), or always, with frames partitioned by key (each key's changes in one task: the
        # writers' road) or not (a key in two tasks: the batch is written again, reduced by Spark).
        reduce_rng = random.Random(f"reduce-in-writers-{seed}")
        self.reduce_in_writers = reduce_rng.choice(["auto", "never", "always"])
        self.keyed_frames = self.reduce_in_writers == "always" and reduce_rng.random() < 0.6
        self.roads: collections.Counter[str] = collections.Counter()  # how the sink reduced each write
        # The tables are partitioned, which hash-distributes their rows unless "none" is set; the
        # writers' road takes only a distribution that moves no rows, so "always" seeds set "none".
        self.distribution_mode = "none" if self.reduce_in_writers == "always" else ""
        # The session's adaptive execution as its user set it (Spark's default, on, or off): a small
        # batch runs with it off (job/codegen.py), and every step, a failed or killed one included,
        # leaves the session with the user's settings (check_session_settings).
        self.adaptive = random.Random(f"adaptive-{seed}").choice(["true", "false"])
        # The session's shuffle partitions as its user set them (the test session's 4, or 1): a small
        # batch whose shuffle has one partition reaches its one writer task without the shuffle
        # (job/distributing.py); a stream's micro-batch chooses its own (job/parallelism.py).
        self.shuffle_partitions = random.Random(f"shuffle-{seed}").choice(["4", "1"])
        self.user_settings = self.session_settings()  # as run() sets them, and after it as before it
        # Checkpoints a stream may keep pending through a catalog outage (op_catalog_outage).
        self.max_pending = random.Random(f"max-pending-{seed}").choice([1, 2, 3])
        # The format of the CDC tables the sinks create (routed tables; db.dbz of debezium_steps.py):
        # v3 is the default for CDC (deletion vectors), v2 (equality deletes) the opt-out; both must
        # agree with the model. From a generator of its own, so seeds keep their sequences.
        self.created_format = random.Random(f"created-format-{seed}").choice([2, 3])
        self.order_rng = random.Random(f"upsert-order-{seed}")  # stale upsert images (upsert_batch)
        self._locked_catalog_fails_fast = False
        # The CDC job's conversions keep a key index between runs: one too small for most files (those
        # are read at every run), the default, or none; by seed, so the short profile has all three.
        self.key_index_bytes = (600, 256 * 1024 * 1024, 0)[(seed - 1) % 3]
        # Odd seeds past 1 resolve deletes through the partitioned key index in table storage instead
        # (every sink: v3 commits, v2 conversions, routed tables keyed by (g, id)), with 1, 4 or 16
        # partitions, each step in the driver or as a Spark job (seed 3, in the short profile: always);
        # their partitions split past 8 or 64 entries each, or (the default) never at these sizes
        # (seed 13, in the short profile: one partition at first, split past 8: its tables are small).
        index_rng = random.Random(f"key-index-{seed}")
        self.key_index_options: dict[str, Any] = {}
        if seed % 2 == 1 and seed > 1:
            partitions = index_rng.choice([1, 4, 16])
            self.key_index_options = {
                "iceberg-sink.key-index.mode": "partitioned",
                "iceberg-sink.key-index.partitions": 1 if seed == 13 else partitions,
                "iceberg-sink.key-index.driver-max-bytes": 0 if seed == 3 else index_rng.choice([0, 64 << 20]),
                "iceberg-sink.key-index.partition-max-entries": 8 if seed == 13 else index_rng.choice([8, 64, 8 << 20]),
            }
        # The CDC job also converts its equality deletes after every few commits (between micro-batches,
        # so runs stay reproducible), when conversion is not skipped.
        convert_every = None if "convert_deletes" in self.skip else self.rng.choice([3, 5, 8])
        self.jobs: dict[str, SinkJob] = {
            "cdc": SinkJob(
                "cdc",
                lambda: self._cdc_builder(compaction, every, convert_every),
                checkpoint_location(root / "ckpt-cdc"),
                "iceberg-sink",
            ),
            "upsert": SinkJob(
                "upsert",
                lambda: (
                    self._builder("db.main")
                    .upsert(key=["id"], order_by="lsn")
                    .write_option("iceberg-sink.snapshot-property-prefix", "model-b")
                    .build()
                ),
                checkpoint_location(root / "ckpt-upsert"),
                "model-b",
            ),
            "branch": SinkJob(
                "branch",
                lambda: self._builder("db.main").upsert(key=["id"]).branch(BRANCH).build(),
                checkpoint_location(root / "ckpt-branch"),
                "iceberg-sink",
            ),
            "append": SinkJob(
                "append",
                lambda: (
                    self._builder("db.app").write_option("iceberg-sink.snapshot-property-prefix", "model-d").build()
                ),
                checkpoint_location(root / "ckpt-append"),
                "model-d",
            ),
            "evolve": SinkJob(
                "evolve",
                lambda: (
                    self._builder("db.main")
                    .cdc(op_column="op", key=["id"], order_by="lsn")
                    .schema_evolution("add-and-widen")
                    .build()
                ),
                checkpoint_location(root / "ckpt-evolve"),
                "iceberg-sink",
            ),
        }
        # (prefix, job id, checkpoint id) -> snapshot ids seen over the whole run.
        self.checkpoint_snapshots: dict[tuple[str, str, str], set[int]] = collections.defaultdict(set)
        self.verified: dict[str, str] = {}  # table -> metadata location last compared with the model
        # Compaction racing the conversion: its own generator, and how the races ended.
        self.race_rng = random.Random(f"compaction-race-{seed}")
        self.race_outcomes: collections.Counter[str] = collections.Counter()
        # The routed job (op_routed_cdc): its own generator, models and checkpoint location.
        self.routed_rng = random.Random(f"routed-{seed}")
        # Whether the routed job commits a checkpoint's tables in one transaction (job/together.py;
        # the default on this SQL catalog) or one at a time, drawn per seed from a generator of its own.
        self.routed_atomic = random.Random(f"routed-atomic-{seed}").random() < 0.7
        self.routed_lsn = 0
        self.routed_models: dict[str, dict[tuple[int | None, int], Row]] = {t: {} for t in ROUTED_TABLES}
        self.routed_keyed: set[str] = set()  # tables that hold their key (identifier fields) by now
        self.routed_cols = Columns(
            names={c: c for c in ("g", "id", "v", "lsn")},
            types={"g": "bigint", "id": "bigint", "v": "string", "lsn": "bigint"},
        )
        self.routed_job = SinkJob(
            "routed", self._routed_builder, checkpoint_location(root / "ckpt-routed"), "iceberg-sink"
        )
        self.hostile_rng = random.Random(f"hostile-{seed}")  # op_hostile_routed_names
        # Other writers under a running stream (op_other_writers): their own generator.
        self.other_rng = random.Random(f"other-writers-{seed}")
        # op_catalog_outage: an unreachable catalog or races lost to another writer (its own generator).
        self.outage_rng = random.Random(f"outage-kind-{seed}")

    # -- plumbing ---------------------------------------------------------------------------------

    def _builder(self, table: str) -> Any:
        props = dict(self.catalog_props)
        if self._locked_catalog_fails_fast:
            # SQLite's busy timeout: give up on a locked catalog file after 0.2 s instead of 5 s.
            props["uri"] += "?timeout=0.2"
        return self.key_index(
            IcebergSink.builder()
            .catalog("model", **props)
            .table(table)
            .max_pending_checkpoints(self.max_pending)
            .write_option("iceberg-sink.writer.max-open-files", self.max_open_files)
            .write_option("iceberg-sink.writer.buffer-bytes", self.buffer_bytes)
            .write_option("iceberg-sink.changes.single-task-max-bytes", self.single_task_max_bytes)
            .write_option("iceberg-sink.write.interpreted-max-rows", self.interpreted_max_rows)
            .write_option("iceberg-sink.changes.reduce-in-writers", self.reduce_in_writers)
            .write_option("write.distribution-mode", self.distribution_mode)
        )

    def key_index(self, builder: Any) -> Any:
        """``builder`` with the seed's key index options."""
        for key, value in self.key_index_options.items():
            builder = builder.write_option(key, value)
        return builder

    def _cdc_builder(self, compaction: bool, every: int, convert_every: int | None) -> IcebergSink:
        builder = self._builder("db.main").cdc(op_column="op", key=["id"], order_by="lsn")
        if compaction:
            builder = builder.compaction(every_n_commits=every)
        if convert_every is not None:
            builder = builder.convert_equality_deletes(every_n_commits=convert_every, background=False).write_option(
                "iceberg-sink.conversion.key-index-max-bytes", self.key_index_bytes
            )
        sink: IcebergSink = builder.build()
        return sink

    def _routed_builder(self) -> IcebergSink:
        sink: IcebergSink = self.key_index(
            IcebergSink.builder()
            .catalog("model", **self.catalog_props)
            .route(table_column="tbl", namespace="rt")
            .create_if_missing(partition_by=["bucket(2, id)"], format_version=self.created_format)
            .cdc(op_column="op", key=["id"], order_by="lsn", key_column="pk")
            .atomic_commits("auto" if self.routed_atomic else "off")
            .write_option("iceberg-sink.writer.max-open-files", self.max_open_files)
            .write_option("iceberg-sink.writer.buffer-bytes", self.buffer_bytes)
            .write_option("iceberg-sink.changes.single-task-max-bytes", self.single_task_max_bytes)
            .write_option("iceberg-sink.write.interpreted-max-rows", self.interpreted_max_rows)
            .write_option("iceberg-sink.changes.reduce-in-writers", self.reduce_in_writers)
            .write_option("write.distribution-mode", self.distribution_mode)
        ).build()
        return sink

    def table(self, name: str) -> Table:
        return self.catalog.load_table(name)

    def log(self, text: str) -> None:
        self.trace.append(f"{len(self.trace):3d}: {text}")

    def fail(self, message: str) -> ModelMismatch:
        trace = "\n".join("    " + t for t in self.trace)
        shown = sorted(self.skip - (LONG_ONLY if not self.long else set()))
        skip = f" {SKIP_ENV}={','.join(shown)}" if shown else ""
        return ModelMismatch(
            f"model check failed: seed={self.seed}{skip} (rerun: pytest tests/model --seed {self.seed}{' --profile long' if self.long else ''})\n"
            f"  steps so far:\n{trace}\n  {message}"
        )

    # -- values -----------------------------------------------------------------------------------

    def string_value(self) -> str | None:
        r = self.rng.random()
        if r < 0.15:
            return None
        if r < 0.27 and "long_strings" not in self.skip:
            # Longer than Parquet's statistics limit and the metrics truncation: bounds must still hold.
            head = self.rng.choice("abcdefghijklmnopqrstuvwxyz")
            return head * self.rng.randrange(5001, 7000) + self.rng.choice(["", "z", "ä", "🙂"])
        if r < 0.45:
            return self.rng.choice("abcdefghij") + "".join(self.rng.choice(UNICODE) for _ in range(3))
        return self.rng.choice("abcdefghijklmnopqrstuvwxyz") + str(self.rng.randrange(1000))

    def long_value(self, logical: str, cols: Columns) -> int | None:
        if self.rng.random() < 0.2:
            return None
        if cols.types[logical] == "bigint" and self.rng.random() < 0.4:
            return self.rng.choice([-1, 1]) * self.rng.randrange(2**31, 2**50)
        return self.rng.randrange(-1000, 1000)

    def float_value(self, cols: Columns) -> float | None:
        if self.rng.random() < 0.1:
            return None
        # Exact in float32, so widening float -> double changes no value.
        return (
            self.rng.randrange(-400, 400) / 4 if cols.types["f"] == "float" else self.rng.randrange(-(10**6), 10**6) / 8
        )

    def main_row(self, key: int) -> Row:
        self.lsn += 1
        row: Row = {
            "id": key,
            "s": self.string_value(),
            "n": self.long_value("n", self.main_cols),
            "f": self.float_value(self.main_cols),
            "d": self.rng.randrange(-(10**9), 10**9) / 1024,
            "dt": None if self.rng.random() < 0.1 else BASE_DATE + dt.timedelta(days=self.rng.randrange(400)),
            "lsn": self.lsn,
            "m": None
            if self.rng.random() < 0.15
            else {"a": self.string_value(), "b": None if self.rng.random() < 0.2 else self.rng.randrange(-99, 99)},
        }
        for logical in self.main_cols.names:
            if logical.startswith("e"):
                row[logical] = self.string_value()
        return row

    def app_row(self) -> Row:
        return {
            "id": self.rng.randrange(10**6),
            "s": self.string_value(),
            "n": self.long_value("n", self.app_cols),
            "dt": BASE_DATE + dt.timedelta(days=self.rng.randrange(400)),
        }

    def frame(self, cols: Columns, rows: list[Row], with_op: bool = False) -> DataFrame:
        names = list(cols.names)
        data = [tuple(cols.spark_value(c, r) for c in names) + ((r["op"],) if with_op else ()) for r in rows]
        df = self.spark.createDataFrame(data, cols.ddl("op string" if with_op else ""))
        partitions = self.rng.choice([1, 2, 3])
        sized = self.sized(df)
        if self.keyed_frames and "id" in cols.names:
            return sized.repartition(partitions, named(cols.names["id"]))
        return sized.repartition(partitions)

    def sized(self, df: DataFrame) -> DataFrame:
        """``df`` as Spark can size it for a seed that sizes its batches: read from a Parquet file of
        it, whose bytes are in the analyzed plan's statistics (topology/estimate.py reads those; a
        cached DataFrame's are not, so caching it sized nothing for the sink)."""
        if not self.sized_batches:
            return df
        self.sized_files += 1
        path = str(self.root / "sized-batches" / str(self.sized_files))
        df.write.parquet(path)
        return self.spark.read.parquet(path)

    # -- batches ----------------------------------------------------------------------------------

    def cdc_batch(self) -> list[Row]:
        """Changes valid against the model as it evolves within the batch: inserts, updates, deletes of
        live and absent keys, update-before images, and repeated keys (the last lsn wins)."""
        live = dict(self.main_model)
        out: list[Row] = []
        for _ in range(self.rng.randrange(1, 16)):
            key = self.rng.randrange(KEYS)
            r = self.rng.random()
            if r < 0.25:
                old = live.pop(key) if key in live else None
                row = {**(old or self.main_row(key))}
                self.lsn += 1
                out.append({**row, "lsn": self.lsn, "op": self.rng.choice(["D", "delete", "d", "-D"])})
                continue
            if key in live and r < 0.35:
                self.lsn += 1
                out.append({**live[key], "lsn": self.lsn, "op": self.rng.choice(["UB", "-U"])})
            row = self.main_row(key)
            op = self.rng.choice(["U", "u", "+U"]) if key in live else self.rng.choice(["I", "insert", "c", "+I"])
            live[key] = row
            out.append({**row, "op": op})
        self.rng.shuffle(out)  # arrival order is not lsn order: order_by must decide
        return out

    @staticmethod
    def apply_cdc(model: dict[int, Row], changes: list[Row]) -> None:
        for change in sorted(changes, key=lambda c: c["lsn"]):
            op = change["op"]
            if op in ("D", "delete", "d", "-D"):
                model.pop(change["id"], None)
            elif op not in ("UB", "-U", "update_before"):
                model[change["id"]] = {k: v for k, v in change.items() if k != "op"}

    def upsert_batch(self, model: dict[int, Row], ordered: bool = False) -> list[Row]:
        """One image per key of a random set; ``ordered`` (job B, ``upsert(order_by="lsn")``): some
        keys get up to two older images too, shuffled, the one of the highest lsn being the key's new
        state."""
        keys = self.rng.sample(range(KEYS), self.rng.randrange(1, 12))
        if not ordered:
            return [self.main_row(k) for k in keys]  # one image per key: arrival order cannot matter
        # The stale images draw from a generator of their own: seeds keep the operations they drew
        # before upserts had an order (tests/model/test_model.py relies on some seeds' sequences).
        out: list[Row] = []
        for k in keys:
            stale = []
            for _ in range(self.order_rng.choice([0, 0, 1, 2])):
                self.lsn += 1
                stale.append(self.lsn)
            row = self.main_row(k)  # the newest image: the highest lsn of its key
            out += [row, *({**row, "s": f"stale-{lsn}", "lsn": lsn} for lsn in stale)]
        self.order_rng.shuffle(out)  # arrival order is not lsn order: order_by must decide
        return out

    @staticmethod
    def apply_upserts(model: dict[int, Row], rows: list[Row]) -> None:
        for r in sorted(rows, key=lambda r: r["lsn"]):
            model[r["id"]] = r

    # -- sink writes ------------------------------------------------------------------------------

    def _write(
        self, job: SinkJob, df: DataFrame, crash_at: str | None = None, killed: list[Row] | None = None
    ) -> tuple[Any, str]:
        """Write ``df`` as the job's next checkpoint; with ``crash_at``, die there first (in process, or
        with ``killed`` = the batch's rows, a SIGKILLed subprocess driver) and replay after a restart."""
        checkpoint = job.next_checkpoint
        if killed is not None and crash_at is not None:
            crashed = "crashed" if self._sigkill_write(job, killed, crash_at, checkpoint) else "no crash (empty)"
            outcome = None
        elif crash_at is None:
            outcome = job.get().write(df, checkpoint_location=job.location, checkpoint_id=checkpoint)
            job.next_checkpoint += 1
            self._note_road(job)
            return outcome, ""

        def handler(point: str, cp: int) -> None:
            if point == crash_at and cp == checkpoint:
                raise Crash(f"simulated driver death at {point} of checkpoint {cp}")

        if killed is None:
            _faults.install(handler)
            crashed = "no crash (fault point not reached)"
            try:
                outcome = job.get().write(df, checkpoint_location=job.location, checkpoint_id=checkpoint)
            except Crash:
                crashed = "crashed"
            finally:
                _faults.clear()
        if crashed != "crashed":
            job.next_checkpoint += 1
            return outcome, crashed
        self.check_snapshots()  # remember the crashed commit's snapshot before anything expires it
        self.trace[-1] += " -> crashed"
        if job.name == "append" and "pyiceberg_append" not in self.skip and self.rng.random() < 0.5:
            # Another writer commits before the restart (a multiset model does not care about order),
            # so the crashed job's last snapshot is no longer the branch head.
            rows = [self.app_row() for _ in range(self.rng.randrange(1, 4))]
            table = self.table("db.app")
            arrow = pa.Table.from_pylist([self.app_cols.physical(r) for r in rows], schema=table.schema().as_arrow())
            table.append(arrow)
            self.app_model.extend(rows)
            self.trace[-1] += f"; pyiceberg append of {len(rows)} rows"
        if not {"expire_snapshots", "expire_before_restart"} & self.skip and self.rng.random() < 0.5:
            expired = self._expire(job_table(job), retain_last=1)
            self.trace[-1] += "; " + expired
        job.restart()  # a new driver: new sink object, same checkpoint location
        outcome = job.get().write(df, checkpoint_location=job.location, checkpoint_id=checkpoint)
        job.next_checkpoint += 1
        return outcome, f"restarted, replayed checkpoint {checkpoint}"

    def _note_road(self, job: SinkJob) -> None:
        """Count and trace how the write just done reduced its changes (job/reduction.py)."""
        progress = job.get().last_progress() or {}
        if progress.get("keys_crossed"):
            self.roads["a key in two writer tasks, written again"] += 1
            self.trace[-1] += " (a key in two writer tasks: written again, reduced by Spark)"
        elif progress.get("reduced_in_writers"):
            self.roads["reduced in the writer tasks"] += 1
            self.trace[-1] += " (reduced in its writer tasks)"

    def _sigkill_write(self, job: SinkJob, rows: list[Row], point: str, checkpoint: int) -> bool:
        """Run the checkpoint in a subprocess driver that SIGKILLs its process group at ``point``;
        False when it finished without reaching the point (a checkpoint that commits nothing)."""
        work = Path(tempfile.mkdtemp(prefix="kill-", dir=self.root))
        names = list(self.main_cols.names)
        data = [(*(self.main_cols.spark_value(c, r) for c in names), r["op"]) for r in rows]
        (work / "rows.pickle").write_bytes(pickle.dumps(data))
        request = {
            "catalog": self.catalog_props,
            "table": job_table(job),
            "location": job.location,
            "checkpoint": checkpoint,
            "point": point,
            "ddl": self.main_cols.ddl("op string"),
            "rows": str(work / "rows.pickle"),
        }
        (work / "request.json").write_text(json.dumps(request), encoding="utf-8")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        proc = subprocess.run(
            [sys.executable, "-m", "tests.model.kill_driver", str(work / "request.json")],
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
            cwd=str(Path(__file__).resolve().parents[2]),
            start_new_session=True,  # its own process group: the SIGKILL takes nothing else with it
        )
        if proc.returncode == 0 and "DONE" in proc.stdout:
            return False
        if proc.returncode != -signal.SIGKILL or "KILLING" not in proc.stdout:
            raise self.fail(
                f"the SIGKILL driver did not die at {point}: exit {proc.returncode}\n"
                f"stdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-3000:]}"
            )
        job.restart()
        return True

    def op_sigkill(self) -> None:
        self.op_cdc(crash_at=self.rng.choice(FAULT_POINTS), sigkill=True)

    def op_cdc(self, crash_at: str | None = None, sigkill: bool = False) -> None:
        changes = self.cdc_batch()
        desc = ", ".join(f"{c['op']}({c['id']}@{c['lsn']})" for c in sorted(changes, key=lambda c: c["lsn"]))
        job = self.jobs["cdc"]
        how = "SIGKILL of a subprocess driver" if sigkill else "crash"
        self.log(f"cdc checkpoint {job.next_checkpoint}: {desc}" + (f" [{how} at {crash_at}]" if crash_at else ""))
        frame = self.frame(self.main_cols, changes, with_op=True)
        _, note = self._write(job, frame, crash_at, killed=changes if sigkill else None)
        if note:
            self.trace[-1] += f" -> {note}"
        self.apply_cdc(self.main_model, changes)

    def op_upsert(self, crash_at: str | None = None) -> None:
        rows = self.upsert_batch(self.main_model, ordered=True)
        job = self.jobs["upsert"]
        self.log(
            f"upsert checkpoint {job.next_checkpoint} (job B): ids {sorted(r['id'] for r in rows)}"
            + (f" [crash at {crash_at}]" if crash_at else "")
        )
        _, note = self._write(job, self.frame(self.main_cols, rows), crash_at)
        if note:
            self.trace[-1] += f" -> {note}"
        self.apply_upserts(self.main_model, rows)

    def op_branch_upsert(self, crash_at: str | None = None) -> None:
        first = self.branch_model is None
        if first and "branch_on_empty_table" in self.skip and self.table("db.main").current_snapshot() is None:
            self.op_upsert(crash_at)  # the branch would be created on a table without snapshots
            return
        base = dict(self.main_model) if first else self.branch_model
        assert base is not None
        rows = self.upsert_batch(base)
        job = self.jobs["branch"]
        self.log(
            f"branch {BRANCH!r} upsert checkpoint {job.next_checkpoint}: ids {sorted(r['id'] for r in rows)}"
            + (" (creates the branch from main)" if first else "")
            + (f" [crash at {crash_at}]" if crash_at else "")
        )
        _, note = self._write(job, self.frame(self.main_cols, rows), crash_at)
        if note:
            self.trace[-1] += f" -> {note}"
        for r in rows:
            base[r["id"]] = r
        self.branch_model = base

    def op_append(self, crash_at: str | None = None) -> None:
        rows = [self.app_row() for _ in range(self.rng.randrange(1, 10))]
        if self.rng.random() < 0.3 and rows:
            rows.append(dict(rows[0]))  # identical rows: the model is a multiset
        job = self.jobs["append"]
        self.log(
            f"append checkpoint {job.next_checkpoint} (job D): {len(rows)} rows"
            + (f" [crash at {crash_at}]" if crash_at else "")
        )
        _, note = self._write(job, self.frame(self.app_cols, rows), crash_at)
        if note:
            self.trace[-1] += f" -> {note}"
        self.app_model.extend(rows)

    def op_pyiceberg_append(self) -> None:
        rows = [self.app_row() for _ in range(self.rng.randrange(1, 6))]
        self.log(f"pyiceberg append to db.app: {len(rows)} rows")
        table = self.table("db.app")
        table.append(pa.Table.from_pylist([self.app_cols.physical(r) for r in rows], schema=table.schema().as_arrow()))
        self.app_model.extend(rows)

    def _outage_batch(self, which: str) -> tuple[DataFrame, Callable[[], None], str]:
        """The next batch of job ``which``: its frame, how it changes the model, and a description."""
        if which == "cdc":
            changes = self.cdc_batch()

            def apply_changes() -> None:
                self.apply_cdc(self.main_model, changes)

            return self.frame(self.main_cols, changes, with_op=True), apply_changes, f"{len(changes)} changes"
        if which == "upsert":
            rows = self.upsert_batch(self.main_model, ordered=True)

            def apply_upserts() -> None:
                self.apply_upserts(self.main_model, rows)

            return self.frame(self.main_cols, rows), apply_upserts, f"ids {sorted(r['id'] for r in rows)}"
        appended = [self.app_row() for _ in range(self.rng.randrange(1, 8))]
        return self.frame(self.app_cols, appended), lambda: self.app_model.extend(appended), f"{len(appended)} rows"

    def op_catalog_outage(self) -> None:
        """A stream's commits cannot land for a few checkpoints, for one of two reasons (drawn from
        ``outage_rng``, so every seed's operation sequence is kept): the catalog is unreachable (the
        SQLite catalog file locked by another connection's exclusive transaction, as a backup or
        another tool can hold it), or another writer wins every attempt of each commit (it commits to
        the same table before each attempt is sent). Each checkpoint is written and stays pending; one
        past ``max_pending`` fails the stream naming the limit and the reason. Then the window ends and
        the stream (or a restarted driver) commits them in order, one snapshot each: the check after
        the step compares every table with the model."""
        which = self.rng.choice(["cdc", "upsert", "append"])
        job = self.jobs[which]
        batches = self.rng.randrange(1, self.max_pending + 2)
        restart = self.rng.random() < 0.5
        lost_races = self.outage_rng.random() < 0.5
        why = "another writer wins every commit attempt" if lost_races else "the catalog file is locked"
        self.log(
            f"{'lost races' if lost_races else 'catalog outage'}: {which} stream, {batches} checkpoints from "
            f"{job.next_checkpoint} while {why} (limit {self.max_pending}), then "
            f"{'a restarted driver' if restart else 'the stream'} commits them"
        )
        self._locked_catalog_fails_fast = not lost_races
        try:
            stream_sink = job.build()
        finally:
            self._locked_catalog_fails_fast = False
        # What start() runs: one job for the query, its table checked before the first micro-batch,
        # then process(batch, batch_id) per micro-batch (the foreachBatch function).
        stream = stream_sink._job(job.location, ephemeral=False, streaming=True)
        first, apply_first, desc = self._outage_batch(which)
        stream.ensure_table(first.schema)
        limited = False
        notes = []
        window = (
            self._races_lost("db.app" if which == "append" else "db.main", job.next_checkpoint)
            if lost_races
            else self._catalog_locked()
        )
        with window as other_commits:
            frame, apply, desc = first, apply_first, desc
            for i in range(batches):
                if i:
                    frame, apply, desc = self._outage_batch(which)
                checkpoint = job.next_checkpoint
                try:
                    outcome = stream.process(frame, checkpoint)
                except PendingCheckpointsLimitError as e:
                    text = str(e)
                    expected = (
                        f"limit of {self.max_pending}",
                        options.MAX_PENDING_CHECKPOINTS.key,
                        "oldest: checkpoint",
                        # The outage is a locked SQLite catalog file: the error names that cause (issue 42 item 16).
                        "other writers won every commit attempt"
                        if lost_races
                        else "another process holds the lock of the SQLite catalog file",
                    )
                    if i != self.max_pending or not all(part in text for part in expected):
                        raise self.fail(
                            f"checkpoint {checkpoint} ({i + 1} pending): unexpected limit error: {text}"
                        ) from e
                    limited = True
                else:
                    if outcome is None or not outcome.pending:
                        raise self.fail(f"checkpoint {checkpoint} during the outage was not kept pending: {outcome!r}")
                    if i >= self.max_pending:
                        raise self.fail(f"checkpoint {checkpoint}: {i + 1} pending checkpoints passed the limit")
                notes.append(f"{checkpoint} ({desc})")
                apply()
                job.next_checkpoint += 1
            pending = stream_sink.metrics().pending_checkpoints
            if pending != batches:
                raise self.fail(f"metrics count {pending} pending checkpoints, expected {batches}")
        self.trace[-1] += (
            f" -> pending {', '.join(notes)}"
            + (f" ({len(other_commits)} commits of the other writer)" if lost_races else "")
            + (" -> stream failed at the limit" if limited else "")
        )
        frame, apply, desc = self._outage_batch(which)
        checkpoint = job.next_checkpoint
        if restart or limited:
            outcome = job.restart().write(frame, checkpoint_location=job.location, checkpoint_id=checkpoint)
        else:
            outcome = stream.process(frame, checkpoint)
        apply()
        job.next_checkpoint += 1
        stream_sink.await_compactions()
        stream_sink.await_conversions()
        self.trace[-1] += f" -> commits land again, checkpoint {checkpoint} ({desc}) committed after them"
        left = CheckpointStore(job.location).pending_ids()
        if outcome is None or outcome.pending or left:
            raise self.fail(f"checkpoint {checkpoint} after the outage: {outcome!r}; still pending: {left}")

    @contextlib.contextmanager
    def _catalog_locked(self) -> Iterator[list[int]]:
        """The SQLite catalog file locked by another connection's exclusive transaction."""
        lock = sqlite3.connect(self.root / "catalog.db", isolation_level=None)
        try:
            lock.execute("BEGIN EXCLUSIVE")
            yield []
        finally:
            lock.execute("ROLLBACK")
            lock.close()

    @contextlib.contextmanager
    def _races_lost(self, name: str, first: int) -> Iterator[list[int]]:
        """Another writer commits to table ``name`` before every attempt of the sink's commits of
        checkpoints from ``first`` is sent, so each attempt loses its compare-and-swap for real. Its
        commits are PyIceberg appends of no rows (snapshots that change no row of the model); the
        snapshot ids are collected in the yielded list."""
        commits: list[int] = []

        def other_writer(point: str, checkpoint: int) -> None:
            if point != _faults.BEFORE_COMMIT_SEND or checkpoint < first:
                return
            table = self.table(name)
            table.append(table.schema().as_arrow().empty_table())
            snapshot = self.table(name).current_snapshot()
            commits.append(snapshot.snapshot_id if snapshot else -1)

        _faults.install(other_writer)
        try:
            yield commits
        finally:
            _faults.clear()

    def op_crash(self) -> None:
        point = self.rng.choice(FAULT_POINTS)
        kinds = ["cdc", "upsert", "append"] + ([] if "branch_upsert" in self.skip else ["branch_upsert"])
        getattr(self, f"op_{self.rng.choice(kinds)}")(crash_at=point)

    def op_routed_cdc(self) -> None:
        """One checkpoint of the routed CDC job over ROUTED_TABLES, maybe crashed at a fault point and
        replayed by a restarted sink (docs/routing.md)."""
        rng = self.routed_rng
        live = {t: dict(m) for t, m in self.routed_models.items()}
        rows: list[Row] = []
        for _ in range(rng.randrange(1, 14)):
            table, key = rng.choice(ROUTED_TABLES), rng.randrange(ROUTED_KEYS)
            # rt.rk's rows name its key (g, id) in the key column, as a string; once the table holds
            # it as identifier fields, some rows leave the key column null.
            g, pk = None, None
            if table == ROUTED_OWN_KEY:
                g = rng.randrange(2)
                pk = None if table in self.routed_keyed and rng.random() < 0.3 else rng.choice(["g,id", "g, id"])
            self.routed_lsn += 1
            if rng.random() < 0.3:
                live[table].pop((g, key), None)
                op, value = rng.choice(["D", "d"]), None
            else:
                op, value = ("U" if (g, key) in live[table] else "I"), f"v{self.routed_lsn}"
                live[table][(g, key)] = {"g": g, "id": key, "v": value, "lsn": self.routed_lsn}
            # Names with and without the namespace: the route adds "rt." to the latter.
            name = table if rng.random() < 0.3 else table.split(".")[1]
            rows.append({"tbl": name, "pk": pk, "g": g, "id": key, "v": value, "lsn": self.routed_lsn, "op": op})
        rng.shuffle(rows)
        crash_at = rng.choice(ROUTED_FAULT_POINTS) if rng.random() < 0.35 else None
        job = self.routed_job
        checkpoint = job.next_checkpoint
        desc = ", ".join(
            f"{r['op']}({r['tbl']}:{'' if r['g'] is None else str(r['g']) + '/'}{r['id']}@{r['lsn']})"
            for r in sorted(rows, key=lambda r: r["lsn"])
        )
        self.log(f"routed cdc checkpoint {checkpoint}: {desc}" + (f" [crash at {crash_at}]" if crash_at else ""))
        df = self.sized(
            self.spark.createDataFrame(
                [(r["tbl"], r["pk"], r["g"], r["id"], r["v"], r["lsn"], r["op"]) for r in rows],
                "tbl string, pk string, g bigint, id bigint, v string, lsn bigint, op string",
            )
        ).repartition(rng.choice([1, 2, 3]))

        def handler(point: str, cp: int) -> None:
            # The two points inside an atomic commit's transaction name no checkpoint (-1).
            if point == crash_at and cp in (checkpoint, -1):
                raise Crash(f"simulated driver death at {point} of checkpoint {checkpoint}")

        touched = {r["tbl"] if "." in r["tbl"] else f"rt.{r['tbl']}" for r in rows}
        crashed: set[str] | None = None  # the tables holding the checkpoint right after a crash
        if crash_at is not None:
            _faults.install(handler)
            try:
                job.get().write(df, checkpoint_location=job.location, checkpoint_id=checkpoint)
                self.trace[-1] += " -> no crash (fault point not reached)"
            except Crash:
                self.trace[-1] += " -> crashed; restarted, replayed"
                crashed = self._routed_holding(checkpoint, touched)
                job.restart()
            finally:
                _faults.clear()
        job.get().write(df, checkpoint_location=job.location, checkpoint_id=checkpoint)
        if crashed is not None:
            self.check_routed_cut(checkpoint, crashed, self._routed_holding(checkpoint, touched))
        job.next_checkpoint += 1
        self.routed_models = live
        if any(r["pk"] is not None for r in rows):
            self.routed_keyed.add(ROUTED_OWN_KEY)

    def _routed_holding(self, checkpoint: int, tables: set[str]) -> set[str]:
        """The tables of ``tables`` that hold ``checkpoint`` (a snapshot of it)."""
        return {t for t in tables if self.catalog.table_exists(t) and checkpoint in self._routed_checkpoints(t)}

    def check_routed_cut(self, checkpoint: int, crashed: set[str], replayed: set[str]) -> None:
        """After a crash of a routed checkpoint and its replay: with atomic commits the tables that
        held it right after the crash are none or all of those that hold it once replayed (a table
        whose part of the checkpoint needed no snapshot, deletes of absent keys, holds it in neither)."""
        self.trace[-1] += f" (held after the crash: {sorted(crashed) or 'none'}; after the replay: {sorted(replayed)})"
        if self.routed_atomic and crashed and crashed != replayed:
            raise self.fail(
                f"atomic routed checkpoint {checkpoint} had landed in {sorted(crashed)} only, of {sorted(replayed)}"
            )
        if not crashed <= replayed:
            raise self.fail(f"routed checkpoint {checkpoint}: {sorted(crashed - replayed)} lost it in the replay")

    def _routed_checkpoints(self, name: str) -> list[int]:
        table = self.table(name)
        return [int(s.summary["iceberg-sink.checkpoint-id"]) for s in table.snapshots()]  # type: ignore[index]

    def check_routed(self) -> None:
        """Each routed table read by Iceberg Java and DuckDB equals its model; one snapshot per checkpoint."""
        for name, model in self.routed_models.items():
            exists = self.catalog.table_exists(name)
            table = self.table(name) if exists else None
            if table is None or table.current_snapshot() is None:
                if model:
                    raise self.fail(f"{name} holds no snapshot but its model has {len(model)} rows")
                continue
            ids = [int(s.summary["iceberg-sink.checkpoint-id"]) for s in table.snapshots()]  # type: ignore[index]
            if ids != sorted(set(ids)):
                raise self.fail(f"{name}: checkpoints {ids} are not each committed once, in order")
            key = [table.schema().find_column_name(i) for i in sorted(table.schema().identifier_field_ids)]
            if key != (["g", "id"] if name == ROUTED_OWN_KEY else ["id"]):
                raise self.fail(f"{name} is keyed by {key}")
            loc = table.metadata_location
            if self.verified.get(name) == loc:
                continue
            rows = list(model.values())
            self.compare(f"{name} read by Iceberg Java", self.routed_cols, rows, self.java.read(loc))
            self.compare(f"{name} read by DuckDB", self.routed_cols, rows, duckdb_read(loc))
            self.verified[name] = loc

    def op_hostile_routed_names(self) -> None:
        """A batch of the routed job with good rows and 1-3 rows naming hostile tables
        (:func:`hostile_table_name`): it must fail with InvalidInputError naming a refused table
        before anything is created or committed, and leave the routed job able to go on (the next
        routed checkpoint reuses its id: nothing of it was stored)."""
        rng = self.hostile_rng
        hostile = [hostile_table_name(rng) for _ in range(rng.randrange(1, 4))]
        for name in hostile:  # the rule itself must refuse each (table/names.py)
            full = name if name is None or "." in name else f"rt.{name}"
            if full is not None and table_name_problem(full) is None and allowed(full, "rt", ()):
                raise self.fail(f"hostile name {full!r} passes the name rule")
        self.routed_lsn += 1
        rows = [(rng.choice(ROUTED_TABLES), None, None, 1000 + self.routed_lsn, "x", self.routed_lsn, "I")]
        rows += [(name, None, None, 2000 + i, "h", self.routed_lsn, "I") for i, name in enumerate(hostile)]
        rng.shuffle(rows)
        job = self.routed_job
        self.log(f"routed checkpoint {job.next_checkpoint} with hostile table names {hostile!r}: must be refused")
        before = self._routed_state()
        df = self.spark.createDataFrame(
            rows, "tbl string, pk string, g bigint, id bigint, v string, lsn bigint, op string"
        ).repartition(rng.choice([1, 2]))
        try:
            job.get().write(df, checkpoint_location=job.location, checkpoint_id=job.next_checkpoint)
        except InvalidInputError as e:
            if "routed table " not in str(e) and "names no table" not in str(e):
                raise self.fail(f"the refusal does not name the table: {e}") from e
            self.trace[-1] += " -> refused: " + str(e).split(" was not written: ")[-1][:160]
        else:
            raise self.fail(f"a batch routing rows to {hostile!r} was written")
        after = self._routed_state()
        if after != before:
            raise self.fail(f"a refused batch changed the catalog: {before} -> {after}")

    def _routed_state(self) -> dict[str, str]:
        """Every table of the catalog (any namespace) with its metadata location."""
        out = {}
        for ns in self.catalog.list_namespaces():
            for ident in self.catalog.list_tables(ns):
                out[".".join(ident)] = self.catalog.load_table(ident).metadata_location
        return out

    # -- maintenance ------------------------------------------------------------------------------

    def op_compaction(self, which: str | None = None) -> None:
        which = which or self.rng.choice(
            ["cdc", "cdc", "append"] + (["branch"] if self.branch_model is not None else [])
        )
        job = self.jobs[which]
        config = CompactionConfig(min_input_files=self.rng.choice([2, 3]), delete_file_threshold=1)
        self.log(f"compact {job_table(job)} branch {'b' if which == 'branch' else 'main'} ({config.min_input_files=})")
        result = job.get().compact(self.spark, config)
        self.trace[-1] += f" -> {result!r}"[:300]

    def op_convert_deletes(self, mode: str | None = None) -> None:
        """Convert db.main's equality deletes (main or the branch): alone, with a compaction committing
        between its plan and its commit, inside a compaction's plan and commit, or with a CDC batch
        committing between its plan and its commit. Reads must not change (check() compares)."""
        branch = BRANCH if self.branch_model is not None and self.rng.random() < 0.3 else "main"
        modes = ["alone", "compaction_commits_first", "conversion_commits_first"]
        if branch == "main":
            modes.append("cdc_commits_first")
        mode = mode or self.rng.choice(modes)

        def load() -> Table:
            return self.table("db.main")

        config = CompactionConfig(min_input_files=self.rng.choice([2, 3]), delete_file_threshold=1)
        self.log(f"convert equality deletes of db.main branch {branch} ({mode})")
        if mode == "alone":
            result: Any = maintenance.convert_equality_deletes(load, branch=branch)
        elif mode == "compaction_commits_first":
            meanwhile = {}

            def compaction() -> None:
                meanwhile["compaction"] = compact(self.spark, load, config, branch=branch)

            result = maintenance.convert_equality_deletes(racing(load, compaction), branch=branch)
            result = (result, meanwhile.get("compaction"))
        elif mode == "conversion_commits_first":
            meanwhile = {}

            def conversion() -> None:
                meanwhile["conversion"] = maintenance.convert_equality_deletes(load, branch=branch)

            # One group per file or the default groups, planned again or not (a generator of its own
            # keeps every seed's operation sequence): the conversion's file-scoped position deletes
            # then name some groups' files and not others', so compaction's per-file validation
            # drops some groups and commits others of the same partition.
            per_file = self.race_rng.random() < 0.5
            config = CompactionConfig(
                min_input_files=1 if per_file else config.min_input_files,
                max_group_bytes=1 if per_file else 512 << 20,
                delete_file_threshold=1,
                max_replans=self.race_rng.choice([0, 1]),
            )
            compaction = compact(self.spark, racing(load, conversion), config, branch=branch)
            self.log(
                f"  compaction racing the conversion ({config.max_group_bytes=}, {config.max_replans=}): "
                + self._race_outcome(compaction, meanwhile.get("conversion"))
            )
            result = (compaction, meanwhile.get("conversion"))
        else:
            result = maintenance.convert_equality_deletes(racing(load, self.op_cdc), branch=branch)
        self.trace[-1] += f" -> {result!r}"[:600]

    def _race_outcome(self, compaction: Any, conversion: Any) -> str:
        """Classify a compaction that raced a conversion, counted in ``race_outcomes``: groups
        dropped, and groups committed by the raced plan in a partition where the conversion added a
        position delete naming another file (what per-file validation allows)."""
        table = self.table("db.main")
        outcome = []
        if compaction.dropped_groups:
            self.race_outcomes["dropped"] += 1
            outcome.append(f"{compaction.dropped_groups} groups dropped")
        if compaction.snapshot_id is None or conversion is None or conversion.snapshot_id is None:
            return ", ".join(outcome) or "nothing to race"

        def entries(snapshot_id: int, content: int, status: str) -> set[tuple[int, Any, str]]:
            snapshot = table.metadata.snapshot_by_id(snapshot_id)
            found = set()
            for manifest in snapshot.manifests(table.io) if snapshot is not None else []:
                if manifest.added_snapshot_id != snapshot_id or int(manifest.content) != min(content, 1):
                    continue
                for e in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                    if e.status.name == status and int(e.data_file.content) == content:
                        meta = to_meta(e.data_file)
                        found.add((meta.spec_id, meta.partition, meta.path))
            return found

        rewritten = entries(compaction.snapshot_id, 0, "DELETED")
        positions = entries(conversion.snapshot_id, 1, "ADDED")
        beside = {(s, p) for s, p, _ in rewritten} & {(s, p) for s, p, _ in positions}
        if compaction.replans == 0 and beside:
            self.race_outcomes["committed beside new position deletes"] += 1
            outcome.append(f"committed groups beside new position deletes in partitions {sorted(beside, key=str)}")
        return ", ".join(outcome) or "committed"

    def _expire(self, table: str, retain_last: int) -> str:
        result = maintenance.expire_snapshots(
            lambda: self.table(table), older_than=dt.datetime.now(dt.UTC), retain_last=retain_last
        )
        return f"expired {len(result.expired_snapshot_ids)} snapshots of {table} (retain_last={retain_last})"

    def op_expire_snapshots(self) -> None:
        table = self.rng.choice(["db.main", "db.app"])
        self.log(self._expire(table, self.rng.choice([1, 2])))

    def op_remove_orphans(self) -> None:
        table = self.rng.choice(["db.main", "db.app"])
        dry = self.rng.random() < 0.5
        result = maintenance.remove_orphan_files(
            lambda: self.table(table), older_than=dt.timedelta(hours=1), dry_run=dry
        )
        self.log(f"remove orphans of {table} (dry_run={dry}) -> {len(result.orphan_files)} orphans")

    def op_rewrite_manifests(self) -> None:
        table = self.rng.choice(["db.main", "db.app"])
        branch = BRANCH if table == "db.main" and self.branch_model is not None and self.rng.random() < 0.3 else "main"
        snapshot = maintenance.rewrite_manifests(
            lambda: self.table(table), branch=branch, entries_per_manifest=self.rng.choice([2, 10_000])
        )
        self.log(f"rewrite manifests of {table} branch {branch} -> snapshot {snapshot}")

    def commit_properties(self) -> dict[str, str]:
        """Random manifest-merge and metadata-retention properties (Iceberg's names)."""
        props = {"commit.manifest.min-count-to-merge": str(self.rng.choice([2, 3, 5, 100]))}
        if self.rng.random() < 0.3:
            # Small bins: merges leave several manifests and pack only some of them.
            props["commit.manifest.target-size-bytes"] = str(self.rng.choice([6_000, 20_000]))
        if self.rng.random() < 0.15:
            props["commit.manifest-merge.enabled"] = "false"
        if self.rng.random() < 0.5:
            props["write.metadata.previous-versions-max"] = str(self.rng.choice([1, 3, 10]))
            props["write.metadata.delete-after-commit.enabled"] = self.rng.choice(["true", "false"])
        return props

    def op_commit_properties(self) -> None:
        name = self.rng.choice(["db.main", "db.app"])
        props = self.commit_properties()
        with self.table(name).transaction() as tx:
            tx.set_properties(props)
        self.log(f"set commit properties of {name}: {props}")

    def check_metadata_files(self) -> None:
        """The metadata log stays within write.metadata.previous-versions-max, and every metadata file
        it (and the table pointer) names still exists: deleting after commit never drops a live one."""
        for name in ("db.main", "db.app"):
            table = self.table(name)
            limit = int(table.properties.get("write.metadata.previous-versions-max", "100"))
            if len(table.metadata.metadata_log) > max(1, limit):
                raise self.fail(f"{name}: metadata log has {len(table.metadata.metadata_log)} entries, max {limit}")
            for location in [table.metadata_location, *(e.metadata_file for e in table.metadata.metadata_log)]:
                if not Path(location.removeprefix("file://")).exists():
                    raise self.fail(f"{name}: metadata file {location} named by the table is gone")

    def op_spec_evolution(self, name: str | None = None) -> None:
        table = self.table("db.main")
        current = {f.name for f in table.spec().fields}
        candidates: dict[str, Any] = {
            "id_bucket": BucketTransform(4),
            "id_t16": TruncateTransform(16),
            "id_b3": BucketTransform(3),
        }
        name = name or self.rng.choice(sorted(candidates))
        with table.update_spec() as update:
            if name in current:
                update.remove_field(name)
                action = f"remove partition field {name}"
            else:
                # Two buckets of one column are redundant partitions: Iceberg Java refuses the spec and
                # PyIceberg cannot append to it (the other writer's appends), so a bucket replaces the other.
                twins = [f for f in current if f != name and isinstance(candidates.get(f), BucketTransform)]
                if isinstance(candidates[name], BucketTransform):
                    for twin in twins:
                        update.remove_field(twin)
                update.add_field("id", candidates[name], name)
                replaced = [t for t in twins if isinstance(candidates[name], BucketTransform)]
                action = f"add partition field {name}" + (f" in place of {replaced[0]}" if replaced else "")
        self.log(f"spec evolution of db.main: {action} -> spec {self.table('db.main').spec()}")

    def op_schema_evolution(self, kind: str | None = None) -> None:
        table = self.table("db.main")
        choices = ["add"]
        if self.main_cols.types["n"] == "int":
            choices.append("widen_n")
        if self.main_cols.types["f"] == "float":
            choices.append("widen_f")
        choices += ["rename"] + (["rename_nested"] if "m" in self.main_cols.nested else [])
        kind = kind or self.rng.choice(choices)
        models = [self.main_model] + ([self.branch_model] if self.branch_model is not None else [])
        with table.update_schema() as update:
            if kind == "add":
                self.added_columns += 1
                logical = f"e{self.added_columns}"
                update.add_column(logical, StringType())
                self.main_cols.names[logical] = logical
                self.main_cols.types[logical] = "string"
                for model in models:
                    for row in model.values():
                        row[logical] = None
                action = f"add column {logical} string"
            elif kind == "widen_n":
                update.update_column(self.main_cols.names["n"], field_type=LongType())
                self.main_cols.types["n"] = "bigint"
                action = f"widen {self.main_cols.names['n']} int -> long"
            elif kind == "widen_f":
                update.update_column(self.main_cols.names["f"], field_type=DoubleType())
                self.main_cols.types["f"] = "double"
                action = f"widen {self.main_cols.names['f']} float -> double"
            elif kind == "rename_nested":
                sub = self.rng.choice(["a", "b"])
                old, typ = self.main_cols.nested["m"][sub]
                self.renames += 1
                new = f"{sub}_r{self.renames}"
                update.rename_column((self.main_cols.names["m"], old), new)
                self.main_cols.nested["m"][sub] = (new, typ)
                action = f"rename nested field {self.main_cols.names['m']}.{old} -> {new}"
            else:
                logical = self.rng.choice(["s", "n", "d", "dt"] + (["m"] if "m" in self.main_cols.names else []))
                self.renames += 1
                old = self.main_cols.names[logical]
                new = f"{logical}_r{self.renames}"
                update.rename_column(old, new)
                self.main_cols.names[logical] = new
                action = f"rename column {old} -> {new}"
        self.log(f"schema evolution of db.main: {action}")

    def op_sink_schema_evolution(self, crash_at: str | None = None) -> None:
        """A CDC batch (job E, ``.schema_evolution("add-and-widen")``) carrying a column db.main lacks,
        and sometimes a wider type (int -> long, float -> double): the sink changes the schema, then
        writes. Sometimes the driver dies right after the schema change and the batch is replayed."""
        job = self.jobs["evolve"]
        changes = self.cdc_batch()
        self.added_columns += 1
        logical = f"e{self.added_columns}"
        cols = Columns(
            dict(self.main_cols.names),
            dict(self.main_cols.types),
            {k: dict(v) for k, v in self.main_cols.nested.items()},
        )
        widened = [c for c, old in (("n", "int"), ("f", "float")) if cols.types[c] == old and self.rng.random() < 0.5]
        for c in widened:
            cols.types[c] = {"n": "bigint", "f": "double"}[c]
        cols.names[logical] = logical
        cols.types[logical] = "string"
        for change in changes:
            change[logical] = self.string_value()
        if crash_at is None and self.rng.random() < 0.3:
            crash_at = _faults.AFTER_SCHEMA_CHANGE
        self.log(
            f"sink schema evolution, checkpoint {job.next_checkpoint} (job E): adds {logical} string"
            + (f", widens {widened}" if widened else "")
            + f", {len(changes)} changes"
            + (f" [crash at {crash_at}]" if crash_at else "")
        )
        # The batch's columns after the table's: new columns come last in both.
        _, note = self._write(job, self.frame(cols, changes, with_op=True), crash_at)
        if note:
            self.trace[-1] += f" -> {note}"
        self.main_cols = cols
        for model in [self.main_model] + ([self.branch_model] if self.branch_model is not None else []):
            for row in model.values():
                row.setdefault(logical, None)
        self.apply_cdc(self.main_model, changes)

    # -- other writers under a running stream (issue 18 section 6) --------------------------------

    def op_other_writers(self, kind: str | None = None) -> None:
        """One other-writer step (``OTHER_WRITER_KINDS``) against a stream of one of the jobs: what a
        stream meets that a bounded write does not (its input check is cached between micro-batches;
        its commit comes after a proof made when the batch began). Drawn from ``other_rng``, batches
        included, so the other operations of a seed keep their sequence."""
        kinds = [k for k in OTHER_WRITER_KINDS if k not in self.skip]
        if not kinds:
            return
        kind = kind or self.other_rng.choice(kinds)
        saved, self.rng = self.rng, self.other_rng
        try:
            getattr(self, f"_other_{kind}")()
        finally:
            self.rng = saved

    def _stream(self, which: str, changes: list[Row], cols: Columns) -> tuple[IcebergSink, Any, DataFrame]:
        """What ``start()`` runs for job ``which``: its sink, the query's job (process() per micro-batch)
        with the table checked for the first batch, and that batch's frame."""
        stream_sink = self.jobs[which].build()
        stream = stream_sink._job(self.jobs[which].location, ephemeral=False, streaming=True)
        frame = self.frame(cols, changes, with_op=True)
        stream.ensure_table(frame.schema)
        return stream_sink, stream, frame

    def _stream_batch(self, which: str, stream: Any, frame: DataFrame, changes: list[Row]) -> int:
        job = self.jobs[which]
        checkpoint = job.next_checkpoint
        stream.process(frame, checkpoint)
        self.apply_cdc(self.main_model, changes)
        job.next_checkpoint += 1
        return checkpoint

    def _other_rename_under_stream(self) -> None:
        """A CDC stream writes a batch; another writer renames a column; the stream's next batch still
        sends the old name. Without schema evolution that must fail naming the column, and commit
        nothing (never write the batch with that column's values dropped)."""
        logical = self.rng.choice(["s", "n", "d", "dt"])
        old = self.main_cols.names[logical]
        self.renames += 1
        new = f"{logical}_r{self.renames}"
        self.log(f"other writer under a stream: cdc stream batch, rename {old} -> {new}, next batch with {old}")
        changes = self.cdc_batch()
        stream_sink, stream, frame = self._stream("cdc", changes, self.main_cols)
        self._stream_batch("cdc", stream, frame, changes)
        stale = Columns(dict(self.main_cols.names), dict(self.main_cols.types), dict(self.main_cols.nested))
        with self.table("db.main").update_schema() as update:
            update.rename_column(old, new)
        self.main_cols.names[logical] = new
        later = self.cdc_batch()
        try:
            self._stream_batch("cdc", stream, self.frame(stale, later, with_op=True), later)
        except SchemaMismatchError as e:
            if old not in str(e):
                raise self.fail(f"the refusal of a batch with renamed column {old!r} does not name it: {e}") from e
        else:
            raise self.fail(f"a batch with column {old!r}, renamed to {new!r} by another writer, was written")
        stream_sink.await_compactions()
        stream_sink.await_conversions()
        self.trace[-1] += " -> refused naming the column, nothing committed"

    def _other_drop_under_stream(self) -> None:
        """A stream of job E (add-and-widen) writes a batch with an added column; another writer drops
        that column; the stream's next batch carries it again: the sink must add it back and keep the
        batch's values (rows written before read null: their values went with the drop)."""
        models = [self.main_model] + ([self.branch_model] if self.branch_model is not None else [])
        added = [c for c in self.main_cols.names if c.startswith("e")]
        if not added:
            self.added_columns += 1
            logical = f"e{self.added_columns}"
            with self.table("db.main").update_schema() as update:
                update.add_column(logical, StringType())
            self.main_cols.names[logical] = logical
            self.main_cols.types[logical] = "string"
            for model in models:
                for row in model.values():
                    row[logical] = None
            added = [logical]
        logical = self.rng.choice(sorted(added))
        name = self.main_cols.names[logical]
        self.log(f"other writer under a stream: job E stream batch, drop column {name}, next batch carries it")
        changes = self.cdc_batch()
        _, stream, frame = self._stream("evolve", changes, self.main_cols)
        self._stream_batch("evolve", stream, frame, changes)
        with self.table("db.main").update_schema() as update:
            update.delete_column(name)
        for model in models:
            for row in model.values():
                row[logical] = None
        later = self.cdc_batch()
        for change in later:
            change[logical] = change.get(logical) or f"back-{change['id']}"
        self._stream_batch("evolve", stream, self.frame(self.main_cols, later, with_op=True), later)
        if name not in self.table("db.main").schema().column_names:
            raise self.fail(f"column {name!r} dropped by another writer was not added back for a batch carrying it")
        self.trace[-1] += " -> added back, values kept"

    def _other_expire_under_stream(self) -> None:
        """A CDC stream's batch begins (its keys' proof is made); before it commits another writer
        appends rows of the same keys and snapshots are expired fresh (older_than=now, retain_last=1),
        which cuts parent chains. The commit must still delete the other writer's rows of those keys:
        no key may be in the table twice (the model check reads it back)."""
        changes = self.cdc_batch()
        keys = sorted({c["id"] for c in changes})
        self.log(
            f"other writer under a stream: cdc stream batch of keys {keys}; appends of them + expiry before commit"
        )
        stream_sink, stream, frame = self._stream("cdc", changes, self.main_cols)
        checkpoint = self.jobs["cdc"].next_checkpoint
        theirs = [self.main_cols.physical(self.main_row(k)) for k in keys]
        notes: list[str] = []

        def other_writer(point: str, cp: int) -> None:
            if point != _faults.BEFORE_WRITE or cp != checkpoint or notes:
                return
            table = self.table("db.main")
            sources = [f.source_id for f in table.spec().fields]
            if len(sources) != len(set(sources)):
                # PyIceberg 0.12 cannot append to a spec with two fields of one column (truncate and
                # bucket of id, after spec evolution): the other writer only expires, and says so.
                notes.append("no append (PyIceberg cannot write two partition fields of one column)")
            else:
                table.append(pa.Table.from_pylist(theirs, schema=table.schema().as_arrow()))
            notes.append(self._expire("db.main", retain_last=1))

        _faults.install(other_writer)
        try:
            self._stream_batch("cdc", stream, frame, changes)
        finally:
            _faults.clear()
        stream_sink.await_compactions()
        stream_sink.await_conversions()
        self.trace[-1] += f" -> {'; '.join(notes) or 'the batch wrote nothing'}"

    def _other_lost_answer_then_outage(self) -> None:
        """A compaction, conversion or manifest rewrite whose commit lands but whose answer is lost,
        then the catalog stays unreachable (the SQLite file locked by another connection) past the
        retry budget: it must end in CommitStateUnknownError and delete none of its files, so that once
        the catalog is back the table reads as the model says (the snapshot landed)."""
        which = self.rng.choice(["compaction", "conversion", "rewrite_manifests"])
        name = "db.main" if which == "conversion" else self.rng.choice(["db.main", "db.app"])
        self.log(f"other writer: {which} of {name}, its answer lost, then the catalog locked")
        # The same catalog name: a SQL catalog keeps its tables under its name; a shorter lock timeout only.
        fast = load_catalog("model", **{**self.catalog_props, "uri": self.catalog_props["uri"] + "?timeout=0.2"})
        retry = RetryPolicy(num_retries=2, min_wait_ms=10, max_wait_ms=50)
        lock = sqlite3.connect(self.root / "catalog.db", isolation_level=None)
        lost: list[bool] = []

        def lose(point: str, cp: int) -> None:
            if point == _faults.MAINTENANCE_COMMIT_SENT and not lost:
                lost.append(True)
                lock.execute("BEGIN EXCLUSIVE")
                raise ConnectionResetError("the catalog's answer was lost (model check)")

        def load() -> Table:
            return fast.load_table(name)

        _faults.install(lose)
        try:
            if which == "compaction":
                compact(self.spark, load, CompactionConfig(min_input_files=2, delete_file_threshold=1), retry=retry)
            elif which == "conversion":
                maintenance.convert_equality_deletes(load, retry=retry)
            else:
                maintenance.rewrite_manifests(load, entries_per_manifest=2, retry=retry)
        except CommitStateUnknownError:
            if not lost:
                raise
            self.trace[-1] += " -> CommitStateUnknownError, files kept"
        else:
            if lost:
                raise self.fail(f"{which} returned although its answer was lost and the catalog stayed locked")
            self.trace[-1] += " -> nothing to commit"
        finally:
            _faults.clear()
            if lock.in_transaction:
                lock.execute("ROLLBACK")
            lock.close()

    # -- checks -----------------------------------------------------------------------------------

    def expected(self, cols: Columns, rows: list[Row]) -> list[Row]:
        return normalize(pa.Table.from_pylist([cols.physical(r) for r in rows], schema=cols.arrow_schema()), ["id"])

    def compare(self, what: str, cols: Columns, model_rows: list[Row], read: pa.Table) -> None:
        expected = self.expected(cols, model_rows)
        actual = normalize(read, ["id"])
        if actual != expected:
            raise self.fail(f"{what} differs from the model:\n{diff_rows(expected, actual)}")

    def predicates(self, cols: Columns, rows: list[Row]) -> list[tuple[str, Callable[[Row], bool]]]:
        """Random Spark SQL predicates with their Python meaning (SQL null semantics)."""
        out: list[tuple[str, Callable[[Row], bool]]] = []
        key = self.rng.choice([r["id"] for r in rows] or [0]) if self.rng.random() < 0.8 else self.rng.randrange(KEYS)
        out.append((f"id = {key}", lambda r: r["id"] == key))
        s = cols.names["s"]
        strings = [r["s"] for r in rows if r.get("s") is not None]
        if strings and self.rng.random() < 0.7:
            bound = self.rng.choice(strings)
            if self.rng.random() < 0.5:
                bound = bound[: self.rng.randrange(1, 12)]
            op = self.rng.choice([">=", "<=", ">", "<", "="])
            ops: dict[str, Callable[[str, str], bool]] = {
                ">=": lambda a, b: a >= b,
                "<=": lambda a, b: a <= b,
                ">": lambda a, b: a > b,
                "<": lambda a, b: a < b,
                "=": lambda a, b: a == b,
            }
            fn = ops[op]
            out.append((f"`{s}` {op} '{bound}'", lambda r: r.get("s") is not None and fn(r["s"], bound)))
        else:
            lo = self.rng.choice("abcdefghijklm")
            hi = chr(ord(lo) + self.rng.randrange(1, 6))
            out.append((f"`{s}` >= '{lo}' AND `{s}` < '{hi}'", lambda r: r.get("s") is not None and lo <= r["s"] < hi))
        n = cols.names["n"]
        r = self.rng.random()
        if r < 0.3:
            out.append((f"`{n}` IS NULL", lambda row: row.get("n") is None))
        elif r < 0.6:
            cut = self.rng.choice([-1000, 0, 500, 2**31, -(2**31)])
            out.append((f"`{n}` > {cut}", lambda row: row.get("n") is not None and row["n"] > cut))
        else:
            day = BASE_DATE + dt.timedelta(days=self.rng.randrange(400))
            d = cols.names["dt"]
            out.append(
                (f"`{d}` >= DATE '{day.isoformat()}'", lambda row: row.get("dt") is not None and row["dt"] >= day)
            )
        return self.rng.sample(out, self.rng.choice([1, 2]))

    def java_filtered(self, what: str, location: str, cols: Columns, rows: list[Row]) -> None:
        for where, keep in self.predicates(cols, rows):
            try:
                read = self.java.read(location, where=where)
            except JavaReaderError as exc:
                if not self.lz4_raw_filter_bug(exc):
                    raise
                # The files are sound: Iceberg Java reads them whole, and must equal the model.
                self.trace[-1] += (
                    " [Iceberg Java 1.9.2: LZ4_RAW dictionary page over 8 KiB in its filtered read "
                    "(apache/parquet-java#3478, fixed upstream in 2026-04); compared unfiltered]"
                )
                self.compare(f"{what} (unfiltered: parquet-java#3478)", cols, rows, self.java.read(location))
                continue
            self.compare(f"{what} filtered by {_short(where)}", cols, [r for r in rows if keep(r)], read)

    def lz4_raw_filter_bug(self, exc: Exception) -> bool:
        """Whether a filtered Java read failed with parquet-java's LZ4_RAW bug (apache/parquet-java#3478:
        its dictionary filter decompresses an LZ4_RAW page over ~8 KiB in chunks and aircompressor
        refuses the partial input: "all input must be consumed", "last 5 bytes must be literals") on a
        world whose tables are written with LZ4_RAW."""
        return "airlift.compress.MalformedInputException" in str(exc) and "lz4_raw" in self.codecs

    def check_snapshots(self) -> None:
        for name in ("db.main", "db.app"):
            table = self.table(name)
            prefixes = {j.prefix for j in self.jobs.values()}
            for snap in table.metadata.snapshots:
                summary = snap.summary.additional_properties if snap.summary is not None else {}
                for key, value in summary.items():
                    if key.startswith("total-") and int(value) < 0:
                        raise self.fail(f"{name} snapshot {snap.snapshot_id} summary {key}={value} is negative")
                for prefix in prefixes:
                    job, cp = summary.get(f"{prefix}.job-id"), summary.get(f"{prefix}.checkpoint-id")
                    if job is not None and cp is not None:
                        self.checkpoint_snapshots[(prefix, job, cp)].add(snap.snapshot_id)
        doubled = {k: v for k, v in self.checkpoint_snapshots.items() if len(v) > 1}
        if doubled:
            raise self.fail(f"sink checkpoints committed as more than one snapshot: {doubled}")

    def duckdb(self, read: Callable[[], pa.Table], table: Table) -> pa.Table | None:
        """DuckDB's read, or None when DuckDB 1.5.5 fails with its known internal error on tables whose
        equality deletes span several partition specs (Iceberg Java reads them; noted in the trace)."""
        try:
            return read()
        except Exception as exc:
            specs = {s.spec_id for s in table.metadata.partition_specs}
            if "Comparison on NULL values" in str(exc) and len(specs) > 1:
                self.trace[-1] += " [DuckDB: 'INTERNAL Error: Comparison on NULL values' with several specs; skipped]"
                return None
            raise

    def session_settings(self) -> dict[str, str | None]:
        return {key: self.spark.conf.get(key, None) for key in (*codegen.SMALL_BATCH, SHUFFLE)}

    def check_session_settings(self) -> None:
        """The settings a small batch changes are the user's again once a step is over."""
        now = self.session_settings()
        if now != self.user_settings:
            raise self.fail(f"the session's settings after the step are {now}, its user's {self.user_settings}")

    def check(self) -> None:
        self.check_session_settings()
        self.check_snapshots()
        self.check_metadata_files()
        main = self.table("db.main")
        loc = main.metadata_location
        if self.verified.get("db.main") != loc:
            rows = list(self.main_model.values())
            self.compare("db.main read by Iceberg Java", self.main_cols, rows, self.java.read(loc))
            duck = self.duckdb(lambda: duckdb_read(loc), main)
            if duck is not None:
                self.compare("db.main read by DuckDB", self.main_cols, rows, duck)
            self.java_filtered("db.main read by Iceberg Java", loc, self.main_cols, rows)
            if self.branch_model is not None:
                ref = main.metadata.refs.get(BRANCH)
                if ref is None:
                    raise self.fail(f"branch {BRANCH!r} does not exist after its first commit")
                brows = list(self.branch_model.values())
                self.compare(
                    f"branch {BRANCH!r} read by Iceberg Java",
                    self.main_cols,
                    brows,
                    self.java.read(f"{loc}#branch_{BRANCH}"),
                )
                head = main.metadata.snapshot_by_id(ref.snapshot_id)
                # DuckDB reads a snapshot with the schema it was written with; Java reads a branch
                # with the table's current schema. Compare DuckDB only when they are the same.
                duck = None
                if head is not None and head.schema_id in (None, main.metadata.current_schema_id):
                    duck = self.duckdb(lambda: duckdb_snapshot_read(loc, ref.snapshot_id), main)
                if duck is not None:
                    self.compare(
                        f"branch {BRANCH!r} (snapshot {ref.snapshot_id}) read by DuckDB", self.main_cols, brows, duck
                    )
                if self.rng.random() < 0.5:
                    self.java_filtered(
                        f"branch {BRANCH!r} read by Iceberg Java", f"{loc}#branch_{BRANCH}", self.main_cols, brows
                    )
            self.verified["db.main"] = loc
        app = self.table("db.app").metadata_location
        if self.verified.get("db.app") != app:
            self.compare("db.app read by Iceberg Java", self.app_cols, self.app_model, self.java.read(app))
            self.compare("db.app read by DuckDB", self.app_cols, self.app_model, duckdb_read(app))
            if self.rng.random() < 0.5:
                self.java_filtered("db.app read by Iceberg Java", app, self.app_cols, self.app_model)
            self.verified["db.app"] = app
        v3_steps.check(self)

    # -- driver -----------------------------------------------------------------------------------

    def run(self, steps: int) -> float:
        started = time.monotonic()
        kinds = [k for k in OPERATIONS if k not in self.skip]
        weights = [OPERATIONS[k] for k in kinds]
        self.log(
            f"seed {self.seed}, {steps} steps, max-open-files {self.max_open_files}, "
            f"buffer-bytes {self.buffer_bytes}, key-index-max-bytes {self.key_index_bytes}, "
            f"key index {self.key_index_options or 'in the driver'}, "
            f"single-task-max-bytes {self.single_task_max_bytes}, sized batches {self.sized_batches}, "
            f"interpreted-max-rows {self.interpreted_max_rows}, adaptive execution {self.adaptive}, "
            f"reduce-in-writers {self.reduce_in_writers} (keyed frames {self.keyed_frames}), "
            f"shuffle partitions {self.shuffle_partitions}, "
            f"created format v{self.created_format}, "
            f"routed commits {'atomic' if self.routed_atomic else 'one table at a time'}, operations {kinds}"
        )
        before = {key: self.spark.conf.get(key, None) for key in (ADAPTIVE, SHUFFLE)}
        self.spark.conf.set(ADAPTIVE, self.adaptive)
        self.spark.conf.set(SHUFFLE, self.shuffle_partitions)
        self.user_settings = self.session_settings()
        try:
            self._steps(steps, kinds, weights)
        finally:
            for key, value in before.items():
                if value is None:
                    self.spark.conf.unset(key)
                else:
                    self.spark.conf.set(key, value)
            self.user_settings = self.session_settings()
            self.log(f"seed {self.seed}: writes by road {dict(self.roads) or 'none in the writer tasks'}")
        return time.monotonic() - started

    def _steps(self, steps: int, kinds: list[str], weights: list[int]) -> None:
        for _ in range(steps):
            kind = self.rng.choices(kinds, weights)[0]
            try:
                if kind in v3_steps.OPERATIONS:
                    v3_steps.step(self, kind)
                else:
                    getattr(self, f"op_{kind}")()
                self.check()
                if ROUTED not in self.skip and self.routed_rng.random() < ROUTED_EVERY:
                    self.op_routed_cdc()
                    self.check_routed()
                    if HOSTILE not in self.skip and self.hostile_rng.random() < HOSTILE_EVERY:
                        self.op_hostile_routed_names()
                        self.check_routed()
                if self.long and OTHER_WRITERS not in self.skip and self.other_rng.random() < OTHER_WRITERS_EVERY:
                    self.op_other_writers()
                    self.check()
                if DEBEZIUM not in self.skip:
                    debezium_steps.maybe_step(self)  # its own generator: tests/model/debezium_steps.py
                if TRANSACTIONS not in self.skip:
                    transactions_steps.maybe_step(self)  # its own generator: tests/model/transactions_steps.py
            except ModelMismatch:
                raise
            except Exception as exc:
                raise self.fail(
                    f"step raised {type(exc).__name__}: {exc}\n{''.join(traceback.format_exc()[-4000:])}"
                ) from exc


def racing(load: Callable[[], Table], meanwhile: Callable[[], None]) -> Callable[[], Table]:
    """A loader that runs ``meanwhile`` before its second load: for compaction and conversion alike
    that is between the plan (first load) and the first commit attempt."""
    calls = [0]

    def loader() -> Table:
        calls[0] += 1
        if calls[0] == 2:
            meanwhile()
        return load()

    return loader


def job_table(job: SinkJob) -> str:
    return "db.app" if job.name == "append" else "db.main"


def duckdb_snapshot_read(metadata_location: str, snapshot_id: int) -> pa.Table:
    path = metadata_location.removeprefix("file://").replace("'", "''")
    con = duckdb_connect()
    try:
        return con.sql(f"select * from iceberg_scan('{path}', snapshot_from_id={snapshot_id})").to_arrow_table()
    finally:
        con.close()


def run_seed(
    spark: SparkSession,
    java: JavaIcebergReader,
    seed: int,
    steps: int,
    root: Path | None = None,
    long: bool = False,
    java_newest: JavaIcebergReader | None = None,
) -> float:
    """Run one seed in a fresh directory; returns the wall time. Raises ModelMismatch with the trace."""
    own = root is None
    work = Path(tempfile.mkdtemp(prefix=f"model-{seed}-")) if root is None else root
    try:
        return World(spark, java, work, seed, long=long, java_newest=java_newest).run(steps)
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)
