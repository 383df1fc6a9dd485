"""Every tunable of the sink, declared once: key, type, default and a one-line doc.

Resolution order is builder (``write_option``) > table property > default. The options table in
``docs/options.md`` is generated from :data:`OPTIONS` by ``python -m iceberg_sink.options``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from iceberg_sink.errors import InvalidSinkConfigError

# Table property prefixes that are passed through to the writers untouched (column metrics modes).
PASS_THROUGH_PREFIXES = ("write.metadata.metrics.",)


@attrs.frozen
class Option:
    """One declared option.

    Attributes:
        key: the option key; also the table property it is read from, when ``table_property`` is true.
        type: ``int``, ``str`` or ``bool``.
        default: the value when neither the builder nor the table sets it.
        doc: one line for the docs table.
        table_property: whether a table property of the same key applies.
        builder: whether ``write_option`` may set it; False for table properties that every commit
            to the table honours (whoever commits), such as manifest merging.
        choices: allowed values for a ``str`` option, if restricted.
        minimum: smallest allowed value for an ``int`` option.
    """

    key: str
    type: type
    default: Any
    doc: str
    table_property: bool = True
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    builder: bool = True

    def parse(self, value: Any, source: str) -> Any:
        """Convert ``value`` (from ``source``: builder or table property) to this option's type."""
        try:
            if self.type is bool:
                parsed: Any = _parse_bool(value)
            elif self.type is int:
                if isinstance(value, bool):
                    raise ValueError("a boolean is not an integer")
                parsed = int(value)
                if isinstance(value, float) and value != parsed:
                    raise ValueError("not a whole number")
            else:
                parsed = str(value)
        except (TypeError, ValueError) as e:
            raise InvalidSinkConfigError(
                f"option {self.key!r} from {source}: expected {self.type.__name__}, received {value!r} ({e})"
            ) from None
        if self.choices and parsed not in self.choices:
            # Iceberg Java reads such names in any case (ZSTD, Hash: Parquet's codec names and
            # DistributionMode are enums looked up upper-cased), so a table it writes may hold them.
            folded = [c for c in self.choices if c.lower() == parsed.lower()]
            if folded:
                return folded[0]
            raise InvalidSinkConfigError(
                f"option {self.key!r} from {source}: expected one of {self.choices_text()}; received {value!r}"
            )
        if self.minimum is not None and parsed < self.minimum:
            raise InvalidSinkConfigError(
                f"option {self.key!r} from {source}: expected an integer >= {self.minimum}, received {value!r}"
            )
        return parsed

    def from_properties(self, properties: Mapping[str, str]) -> Any:
        """This option's value in table ``properties``, else its default (a malformed value raises
        InvalidSinkConfigError naming it)."""
        if self.key in properties:
            return self.parse(properties[self.key], "table property")
        return self.default

    def choices_text(self) -> str:
        """The allowed values, quoted so that an empty choice shows (``'' (empty: the default)``)."""
        return ", ".join(
            f"{c!r} (empty: the default)" if c == "" and c == self.default else repr(c) for c in self.choices
        )


def _parse_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError("expected true or false")


TARGET_FILE_SIZE_BYTES = Option(
    "write.target-file-size-bytes", int, 512 * 1024 * 1024, "Roll data files at about this size.", minimum=1
)
PARQUET_COMPRESSION = Option(
    "write.parquet.compression-codec",
    str,
    "zstd",
    "Parquet compression codec of data and delete files.",
    choices=("zstd", "snappy", "gzip", "lz4", "lz4_raw", "brotli", "uncompressed", "none"),
)


def parquet_codec(name: str) -> str:
    """PyArrow's name for the codec ``name`` (a :data:`PARQUET_COMPRESSION` value): every Parquet file the
    sink writes (data, equality and position deletes, compaction output) takes its codec from here."""
    return "none" if name in ("uncompressed", "none") else name


PARQUET_COMPRESSION_LEVEL = Option(
    "write.parquet.compression-level", int, -1, "Codec level; -1 means the codec's default."
)
PARQUET_ROW_GROUP_LIMIT = Option(
    "write.parquet.row-group-limit", int, 1_048_576, "Maximum rows per Parquet row group.", minimum=1
)
DISTRIBUTION_MODE = Option(
    "write.distribution-mode",
    str,
    "",
    "How rows reach writers: none, hash or range. Empty: hash for partitioned tables, else none.",
    choices=("", "none", "hash", "range"),
)
WRITER_BUFFER_BYTES = Option(
    "iceberg-sink.writer.buffer-bytes",
    int,
    16 * 1024 * 1024,
    "Rows a writer holds per open file before flushing a Parquet row-group chunk.",
    table_property=False,
    minimum=1,
)
WRITER_MAX_OPEN_FILES = Option(
    "iceberg-sink.writer.max-open-files",
    int,
    100,
    "Files one writer task keeps open; past it the least recently used is closed (its partition gets a new file).",
    table_property=False,
    minimum=1,
)
ROUTE_COMMIT_THREADS = Option(
    "iceberg-sink.route.commit-threads",
    int,
    8,
    "Routed sinks committing one table at a time (.atomic_commits('off'), or a catalog without transactions): "
    "tables of one checkpoint committed at once, each on its own thread (1: one after another, in name order). "
    "Atomic commits run every table of the checkpoint at once.",
    table_property=False,
    minimum=1,
)
COMMIT_NUM_RETRIES = Option(
    "commit.retry.num-retries", int, 4, "Commit attempts after the first when another writer won.", minimum=0
)
COMMIT_MIN_WAIT_MS = Option("commit.retry.min-wait-ms", int, 100, "First backoff between commit attempts.", minimum=0)
COMMIT_MAX_WAIT_MS = Option(
    "commit.retry.max-wait-ms", int, 60_000, "Largest backoff between commit attempts.", minimum=0
)
COMMIT_TOTAL_TIMEOUT_MS = Option(
    "commit.retry.total-timeout-ms", int, 1_800_000, "Give up retrying a commit after this long.", minimum=0
)
MAX_PENDING_CHECKPOINTS = Option(
    "iceberg-sink.commit.max-pending-checkpoints",
    int,
    100,
    "Streams: checkpoints written and kept pending while the catalog is unreachable (or other writers win every commit attempt) before the stream fails (0: fail at once).",
    table_property=False,
    minimum=0,
)
PENDING_RETRY_INTERVAL_MS = Option(
    "iceberg-sink.commit.pending-retry-interval-ms",
    int,
    30_000,
    "Streams: how often checkpoints left pending (a catalog outage, lost races) are retried while no micro-batch runs (0: only by the next micro-batch).",
    table_property=False,
    minimum=0,
)
COMMIT_OVERLAP = Option(
    "iceberg-sink.commit.overlap",
    str,
    "auto",
    "Streams: whether a micro-batch's commit may run beside the next micro-batch (job/lane.py). 'auto': on a "
    "format v3 table (whose commit resolves deleted keys to deletion vectors), for a one-table sink without a "
    "dead-letter table, when the stream's source already had more records waiting (so the next micro-batch "
    "follows at once and takes the commit's result) and the trigger is not once or availableNow; the "
    "committable is durable before the micro-batch returns. 'never': every micro-batch commits before it returns.",
    table_property=False,
    choices=("auto", "never"),
)
TRANSACTIONS_MAX_HELD_EVENTS = Option(
    "iceberg-sink.transactions.max-held-events",
    int,
    1_000_000,
    'With .debezium(transactions="consistent"): events of incomplete source transactions a checkpoint may carry '
    "into the next; past it the oldest held transaction is committed in parts, with a warning "
    "(sources/transactions.py).",
    table_property=False,
    minimum=0,
)
TRANSACTIONS_MAX_HELD_BATCHES = Option(
    "iceberg-sink.transactions.max-held-batches",
    int,
    100,
    'With .debezium(transactions="consistent"): micro-batches a source transaction may wait for its missing '
    "events (its END, its counts) before it is committed in parts, with a warning.",
    table_property=False,
    minimum=1,
)
SNAPSHOT_PROPERTY_PREFIX = Option(
    "iceberg-sink.snapshot-property-prefix",
    str,
    "iceberg-sink",
    "Prefix of the job-id and checkpoint-id keys written in each snapshot summary.",
    table_property=False,
)

POST_COMMIT_FAIL_ON_ERROR = Option(
    "iceberg-sink.post-commit.fail-on-error",
    bool,
    False,
    "Stop the stream when a post-commit hook fails (the commit stands either way).",
    table_property=False,
)

SKIP_DELETES_FOR_NEW_KEYS = Option(
    "iceberg-sink.cdc.skip-deletes-for-new-keys",
    bool,
    True,
    "Upsert/CDC: a key outside the table's key bounds gets a conditional delete, committed only if rows were added since.",
    table_property=False,
)

# Read by every commit the sink makes (checkpoints, compaction, maintenance), as Iceberg Java's
# merging snapshot producers read them: table properties only, so every writer of a table agrees.
MANIFEST_MERGE_ENABLED = Option(
    "commit.manifest-merge.enabled",
    bool,
    True,
    "Merge small manifests of one content and partition spec on commit (as Iceberg Java's merge-append).",
    builder=False,
)
MANIFEST_MIN_COUNT_TO_MERGE = Option(
    "commit.manifest.min-count-to-merge",
    int,
    100,
    "Merge once a commit's new manifest shares a bin with this many manifests.",
    minimum=1,
    builder=False,
)
MANIFEST_TARGET_SIZE_BYTES = Option(
    "commit.manifest.target-size-bytes",
    int,
    8 * 1024 * 1024,
    "Size merged manifests are packed to.",
    minimum=1,
    builder=False,
)
DELETION_VECTOR_FILES = Option(
    "iceberg-sink.deletion-vectors.files",
    str,
    "one-per-commit-spaced",
    "How a commit's deletion vectors (format v3) are laid out in Puffin files: 'one-per-commit-spaced' (all in "
    "one file, each DV followed by zero bytes one more than its own size: every reader checked reads them "
    "right), 'one-per-vector' (a file each: as many files as DVs, each written and later deleted on its own) or "
    "'one-per-commit' (all in one file side by side, as Iceberg Java's writers do: DuckDB's iceberg extension "
    "1.5.x returns a DV that follows a larger one in a file as the larger one; docs/format-v3.md).",
    choices=("one-per-commit-spaced", "one-per-vector", "one-per-commit"),
    builder=False,
)
CONVERSION_KEY_INDEX_MAX_BYTES = Option(
    "iceberg-sink.conversion.key-index-max-bytes",
    int,
    256 * 1024 * 1024,
    "Driver memory the equality-delete conversion keeps data files' keys in between runs (about 8-12 bytes "
    "per row for a long key); files past it are read at each run. 0 keeps none. On a format v3 table the "
    "committer keeps the same index within this bound to resolve deletes to deletion vectors.",
    table_property=False,
    minimum=0,
)
CONVERSION_KEY_INDEX_PERSIST = Option(
    "iceberg-sink.conversion.key-index-persist",
    bool,
    True,
    "Also keep the key index's entries in table storage (<metadata>/iceberg-sink-key-index/, written in the "
    "background), so that a restarted driver loads them instead of reading every data file again.",
    table_property=False,
)
KEY_INDEX_MODE = Option(
    "iceberg-sink.key-index.mode",
    str,
    "driver",
    "Where the key index lives: 'driver' (data files' keys in driver memory within key-index-max-bytes) or "
    "'partitioned' (key -> file, position in runs partitioned by key hash in table storage, looked up on "
    "Spark's executors when large: driver memory flat in the table's size; docs/cdc.md).",
    table_property=False,
    choices=("driver", "partitioned"),
)
KEY_INDEX_PARTITIONS = Option(
    "iceberg-sink.key-index.partitions",
    int,
    16,
    "Partitions of a new partitioned key index (the next power of two; each is merged and read by one task).",
    table_property=False,
    minimum=1,
)
KEY_INDEX_PARTITION_MAX_ENTRIES = Option(
    "iceberg-sink.key-index.partition-max-entries",
    int,
    8_000_000,
    "Partitioned key index: when a partition holds more entries, every partition splits in two (in the index's "
    "manifest; merges rewrite its runs later), so one merge task stays bounded as the table grows.",
    table_property=False,
    minimum=1,
)
KEY_INDEX_DRIVER_MAX_BYTES = Option(
    "iceberg-sink.key-index.driver-max-bytes",
    int,
    64 * 1024 * 1024,
    "Partitioned key index: a step (indexing new files, a lookup, a merge) involving at most this many bytes "
    "runs in the driver; a larger one runs as a Spark job on the executors. 0: always on the executors.",
    table_property=False,
    minimum=0,
)
JVM_PARQUET_WRITER = Option(
    "iceberg-sink.writer.jvm-parquet",
    bool,
    False,
    "Appends: write data files with Spark's own Parquet writer where provably equivalent (measured slower when partitioned).",
    table_property=False,
)
SINGLE_TASK_MAX_BYTES = Option(
    "iceberg-sink.changes.single-task-max-bytes",
    int,
    8 * 1024 * 1024,
    "A micro-batch Spark estimates at most this large is reduced (CDC) and written by one task, without a shuffle, "
    "and a routed micro-batch's tables and columns are counted in one task (0: never). A stream's micro-batch of Kafka alone, which Spark cannot size, is sized by its records (counted from "
    "Spark's offset log, from the second micro-batch on) times a row's default size; other sources without an "
    "estimate never are.",
    table_property=False,
    minimum=0,
)
REDUCE_IN_WRITERS = Option(
    "iceberg-sink.changes.reduce-in-writers",
    str,
    "auto",
    "Where an upsert/CDC micro-batch's changes are reduced to the last change of each key. 'auto': a stream's "
    "micro-batch of Kafka alone (whose messages Debezium and most producers key by the row's key, so a key's "
    "changes are in one Kafka partition) is reduced inside its writer tasks, one per Kafka partition, without a "
    "shuffle or a single task; every other batch in Spark. 'always': every batch that can be (one table, no "
    "dead-letter table, no truncates or TOASTed columns, keys of simple types, a distribution that moves no "
    "rows). 'never': always in Spark. A batch whose key changes turn out to be in two tasks is written again "
    "reduced in Spark, and so are the job's later batches.",
    table_property=False,
    choices=("auto", "always", "never"),
)
INTERPRETED_MAX_ROWS = Option(
    "iceberg-sink.write.interpreted-max-rows",
    int,
    10_000,
    "A micro-batch Spark's size estimate puts at most this many rows (its bytes over a row's default size; a "
    "Kafka micro-batch's records counted from Spark's offset log) is read, planned and written with Spark's code "
    "generation, adaptive execution and constraint propagation off (spark.sql.codegen.wholeStage=false, "
    "spark.sql.codegen.factoryMode=NO_CODEGEN, spark.sql.adaptive.enabled=false, "
    "spark.sql.constraintPropagation.enabled=false, set on the batch's session until its write job ends; its commit "
    "and post-commit work run with the session's own): a small batch's jobs spend most of their time generating "
    "code, adaptive execution runs each of their stages as a job of its own, and the optimizer's constraints of a "
    "wide plan cost more than the filters they infer save. 0: never. See job/codegen.py.",
    table_property=False,
    minimum=0,
)
START_PYTHON_WORKERS = Option(
    "iceberg-sink.write.start-python-workers",
    bool,
    True,
    "Streams of Debezium envelopes or routed: start() starts the Python workers the first micro-batch's write "
    "task reuses (one single-task Spark job in the background, once per SparkContext) while that micro-batch "
    "runs its other Spark jobs, so its write does not wait for them to import the writer. See writer/workers.py.",
    table_property=False,
)
SHUFFLE_PARTITIONS = Option(
    "iceberg-sink.write.shuffle-partitions",
    int,
    0,
    "Streams: partitions of the shuffles a micro-batch runs (change reduction, distribution, checks, a routed "
    "batch's cache). 0: chosen per micro-batch from its size (128 MiB each; up to the cores while each gets "
    "4 MiB; at most spark.sql.shuffle.partitions unless the cores are more; a Kafka micro-batch by its "
    "records counted from Spark's offset log) or, when it cannot be sized, the cluster's cores. A small batch "
    "(iceberg-sink.write.interpreted-max-rows) shuffling into one partition reaches its one writer task without "
    "the distribution's shuffle. See job/parallelism.py and job/distributing.py.",
    table_property=False,
    minimum=0,
)
SCHEMA_EVOLUTION = Option(
    "iceberg-sink.schema-evolution",
    str,
    "off",
    "Change the table's schema for a batch that needs it, before its data is written: off, add-columns (add "
    "optional columns), add-and-widen (also int->long, float->double, wider decimal). See docs/schema-evolution.md.",
    table_property=False,
    choices=("off", "add-columns", "add-and-widen"),
)

OPTIONS: tuple[Option, ...] = (
    TARGET_FILE_SIZE_BYTES,
    PARQUET_COMPRESSION,
    PARQUET_COMPRESSION_LEVEL,
    PARQUET_ROW_GROUP_LIMIT,
    DISTRIBUTION_MODE,
    WRITER_BUFFER_BYTES,
    WRITER_MAX_OPEN_FILES,
    ROUTE_COMMIT_THREADS,
    COMMIT_NUM_RETRIES,
    COMMIT_MIN_WAIT_MS,
    COMMIT_MAX_WAIT_MS,
    COMMIT_TOTAL_TIMEOUT_MS,
    MAX_PENDING_CHECKPOINTS,
    PENDING_RETRY_INTERVAL_MS,
    COMMIT_OVERLAP,
    TRANSACTIONS_MAX_HELD_EVENTS,
    TRANSACTIONS_MAX_HELD_BATCHES,
    SNAPSHOT_PROPERTY_PREFIX,
    POST_COMMIT_FAIL_ON_ERROR,
    SKIP_DELETES_FOR_NEW_KEYS,
    MANIFEST_MERGE_ENABLED,
    MANIFEST_MIN_COUNT_TO_MERGE,
    MANIFEST_TARGET_SIZE_BYTES,
    DELETION_VECTOR_FILES,
    CONVERSION_KEY_INDEX_MAX_BYTES,
    CONVERSION_KEY_INDEX_PERSIST,
    KEY_INDEX_MODE,
    KEY_INDEX_PARTITIONS,
    KEY_INDEX_PARTITION_MAX_ENTRIES,
    KEY_INDEX_DRIVER_MAX_BYTES,
    JVM_PARQUET_WRITER,
    SINGLE_TASK_MAX_BYTES,
    REDUCE_IN_WRITERS,
    INTERPRETED_MAX_ROWS,
    START_PYTHON_WORKERS,
    SHUFFLE_PARTITIONS,
    SCHEMA_EVOLUTION,
)
_BY_KEY = {o.key: o for o in OPTIONS}


def lookup(key: str) -> Option | None:
    """Return the declared option for ``key``, or None for a pass-through or unknown key."""
    return _BY_KEY.get(key)


def validate_builder_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Parse options given to the builder; raise naming every unknown key or bad value at once."""
    problems: list[str] = []
    parsed: dict[str, Any] = {}
    for key, value in options.items():
        option = _BY_KEY.get(key)
        if option is None:
            if key.startswith(PASS_THROUGH_PREFIXES):
                parsed[key] = str(value)
                continue
            problems.append(
                f"unknown write option {key!r}; expected one of {', '.join(sorted(_BY_KEY))} "
                f"or a key starting with {', '.join(PASS_THROUGH_PREFIXES)}"
            )
            continue
        if not option.builder:
            problems.append(
                f"option {key!r} is a table property only (every commit to the table honours it, whoever "
                f"writes): set it on the table instead of with write_option, received {value!r}"
            )
            continue
        try:
            parsed[key] = option.parse(value, "the builder")
        except InvalidSinkConfigError as e:
            problems.append(str(e))
    if problems:
        raise InvalidSinkConfigError("; ".join(problems))
    return parsed


@attrs.frozen
class ResolvedOptions:
    """Options after applying builder > table property > default."""

    values: Mapping[str, Any]
    pass_through: Mapping[str, str]

    def get(self, option: Option) -> Any:
        return self.values[option.key]

    def writer_properties(self) -> dict[str, str]:
        """The table-property view the writers use (metrics modes, codec, row groups)."""
        props = {k: str(v) for k, v in self.values.items()}
        props.update(self.pass_through)
        return props


def resolve(builder: Mapping[str, Any], table_properties: Mapping[str, str]) -> ResolvedOptions:
    """Resolve every declared option for one table."""
    values: dict[str, Any] = {}
    for option in OPTIONS:
        if option.key in builder:
            values[option.key] = builder[option.key]
        elif option.table_property:
            values[option.key] = option.from_properties(table_properties)
        else:
            values[option.key] = option.default
    pass_through = {k: v for k, v in table_properties.items() if k.startswith(PASS_THROUGH_PREFIXES)}
    pass_through.update({k: str(v) for k, v in builder.items() if k.startswith(PASS_THROUGH_PREFIXES)})
    return ResolvedOptions(values=values, pass_through=pass_through)


def _source(option: Option) -> str:
    if not option.builder:
        return "only (not a builder option)"
    return "yes" if option.table_property else "no"


def options_table_markdown(extra: Callable[[Option], str] | None = None) -> str:
    """Render the options table for docs/options.md."""
    rows = [
        "| key | type | default | read from table property | description |",
        "|---|---|---|---|---|",
    ]
    for o in OPTIONS:
        default = repr(o.default) if o.type is str else str(o.default)
        allowed = (
            f" One of (in any case, as Iceberg Java reads its own): {', '.join(c or '(empty)' for c in o.choices)}."
            if o.choices
            else ""
        )
        rows.append(f"| `{o.key}` | {o.type.__name__} | `{default}` | {_source(o)} | {o.doc}{allowed} |")
    return "\n".join(rows) + "\n"


def options_doc() -> str:
    """The whole of docs/options.md."""
    return (
        "# Options\n\n"
        "Generated from `iceberg_sink/options.py` by `python -m iceberg_sink.options > docs/options.md`; "
        "do not edit by hand.\n\n"
        "Precedence: builder (`.write_option(key, value)`) > table property of the same key > default. "
        "Keys starting with `write.metadata.metrics.` (column metrics modes, e.g. "
        "`write.metadata.metrics.column.name = truncate(8)`) are passed to the writers as given.\n\n"
        + options_table_markdown()
        + "\nUpserts/CDC (`.upsert(key=...)`, `.cdc(op_column=..., key=..., order_by=...)`), hooks "
        "(`.pre_commit_hook`, `.post_commit_hook`), compaction (`.compaction(...)`) and the equality-delete "
        "conversion (`.convert_equality_deletes(...)`) are builder methods; see docs/cdc.md and docs/compaction.md.\n"
        "\nThe format version of a table `.create_if_missing(...)` creates is an argument of that method, not an "
        "option: without `format_version` it is 3 for upserts and CDC (deletion vectors, which PyIceberg reads) "
        "and 2 for appends; `format_version=2` keeps an upsert/CDC table on equality deletes. See docs/format-v3.md.\n"
        "\nWhether an upsert/CDC table it creates declares its key as identifier fields is an argument too, "
        "`identifier_fields` (default true): `identifier_fields=False` creates it without them, for tables that "
        "Iceberg Java 1.6 to 1.9 runs merge-on-read DELETE/UPDATE/MERGE on (apache/iceberg #11709), and needs "
        "`key=[...]` on every run. See docs/troubleshooting.md.\n"
    )


if __name__ == "__main__":  # pragma: no cover - docs generator
    sys.stdout.write(options_doc())
