"""Run one compaction: plan, rewrite in Spark, validate against what was committed since, commit.

The commit is a ``replace`` snapshot whose new files keep the data sequence number of the snapshot
the plan read (S). Against the branch head at commit time:

- an equality delete committed after S has a higher sequence number than the new files, so it still
  applies to the rewritten rows: nothing deleted meanwhile comes back;
- a group whose input file is no longer live (another compaction or an overwrite removed it), or to
  one of whose input files a position delete committed after S may apply (checked per data file by
  ``DeleteRules``, as Iceberg Java's ``validateNoNewDeletesForDataFiles``: a file-scoped position
  delete naming another file of the partition is no conflict), is dropped (its new files deleted),
  not the stream;
- delete files are removed only when no remaining live data file they apply to is left; for a
  global equality delete (unpartitioned spec) that means no data file of any spec or partition.

A lost race with another writer (the branch head moved) is retried on the new head. When groups were
dropped, the compaction plans again on the new head, at most ``max_replans`` times (the new plan
sees the deletes that conflicted and applies them). New files of a group that is dropped, or of a
compaction that fails, are deleted: a compaction leaves no orphans, except after an attempt whose
outcome is unknown (a lost response): then they are deleted only once a table read since proves no
snapshot lists them (``CommitAttempt.discard``), and kept otherwise (the snapshot may have landed).

Format v3: the rewrite carries every row's ``_row_id`` and ``_last_updated_sequence_number`` into the
new files as columns (topology/compaction/rewriter.py), so readers see the same lineage after the
commit as before; the commit itself assigns row ids as Iceberg Java's does (the new files' manifest
and every manifest the commit rewrites get fresh ranges from the manifest list). Deletion vectors of
the rewritten files are applied (the new files leave their positions out) and dropped by the commit
(``RewriteFiles``), entry by entry: DVs of other data files in the same Puffin file stay.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import attrs
from pyiceberg.table import Table
from pyspark.sql import SparkSession

from iceberg_sink import options
from iceberg_sink._iceberg import producer, rewrites
from iceberg_sink._iceberg.deletes import DeleteRules
from iceberg_sink._iceberg.entries import ManifestEntries, live_files
from iceberg_sink._iceberg.files import LiveFile, branch_head, delete_quietly
from iceberg_sink._iceberg.lineage import ROW_LINEAGE_FORMAT_VERSION, first_row_ids, with_lineage_columns
from iceberg_sink._iceberg.live_vectors import live_vectors
from iceberg_sink._iceberg.position_deletes import referenced_data_file
from iceberg_sink._iceberg.retry import CommitAttempt, RetryPolicy
from iceberg_sink.table.catalog import file_io_properties
from iceberg_sink.topology.compaction.config import CompactionConfig
from iceberg_sink.topology.compaction.planner import CompactionPlan, plan
from iceberg_sink.topology.compaction.rewriter import SortField, SortSpec, encode_group, sortable, spark_rewrite
from iceberg_sink.vocab import summary_keys
from iceberg_sink.vocab.files import FileContent
from iceberg_sink.writer.result import WriteResult
from iceberg_sink.writer.spark import shipped
from iceberg_sink.writer.spec import WriterSpec

logger = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]


@attrs.frozen
class CompactionResult:
    """What one compaction did.

    Attributes:
        snapshot_id: the ``replace`` snapshot, or None when nothing was committed.
        planned_groups / committed_groups / dropped_groups: groups planned, committed, dropped on
            conflict (summed over the plans of one run).
        rewritten_data_files: data files replaced; added_data_files: new data files.
        removed_delete_files: delete files no longer needed and removed.
        rewritten_bytes / added_bytes: sizes before and after.
        replans: plans made again because groups of the previous one were dropped.
        duration_ms: wall time.
    """

    snapshot_id: int | None = None
    planned_groups: int = 0
    committed_groups: int = 0
    dropped_groups: int = 0
    rewritten_data_files: int = 0
    added_data_files: int = 0
    removed_delete_files: int = 0
    rewritten_bytes: int = 0
    added_bytes: int = 0
    replans: int = 0
    duration_ms: float = 0.0

    @property
    def noop(self) -> bool:
        """Whether groups were planned but every one was dropped: nothing was rewritten."""
        return self.planned_groups > 0 and self.committed_groups == 0

    def then(self, later: CompactionResult) -> CompactionResult:
        """This result followed by ``later``'s (a plan made again in the same run)."""
        return CompactionResult(
            snapshot_id=later.snapshot_id if later.snapshot_id is not None else self.snapshot_id,
            planned_groups=self.planned_groups + later.planned_groups,
            committed_groups=self.committed_groups + later.committed_groups,
            dropped_groups=self.dropped_groups + later.dropped_groups,
            rewritten_data_files=self.rewritten_data_files + later.rewritten_data_files,
            added_data_files=self.added_data_files + later.added_data_files,
            removed_delete_files=self.removed_delete_files + later.removed_delete_files,
            rewritten_bytes=self.rewritten_bytes + later.rewritten_bytes,
            added_bytes=self.added_bytes + later.added_bytes,
            replans=self.replans + 1,
            duration_ms=self.duration_ms + later.duration_ms,
        )


def _writer_spec(table: Table, config: CompactionConfig, overrides: Mapping[str, Any]) -> WriterSpec:
    resolved = options.resolve(dict(overrides), table.properties)
    schema = table.schema()
    if table.metadata.format_version >= ROW_LINEAGE_FORMAT_VERSION:
        schema = with_lineage_columns(schema)  # the new files carry each row's lineage (rewriter.py)
    return WriterSpec(
        table_name=str(table.name()),
        location=table.location(),
        schema_json=schema.model_dump_json(),
        spec_json=table.spec().model_dump_json(),
        io_properties=file_io_properties(table.io.properties),
        writer_properties={**table.properties, **resolved.writer_properties()},
        job_id="compact-" + uuid.uuid4().hex[:12],
        checkpoint_id=0,
        target_file_size=config.target(resolved.get(options.TARGET_FILE_SIZE_BYTES)),
        buffer_bytes=resolved.get(options.WRITER_BUFFER_BYTES),
        max_open_files=resolved.get(options.WRITER_MAX_OPEN_FILES),
        row_group_limit=resolved.get(options.PARQUET_ROW_GROUP_LIMIT),
        compression=resolved.get(options.PARQUET_COMPRESSION),
        compression_level=resolved.get(options.PARQUET_COMPRESSION_LEVEL),
    )


def _sort_spec(table: Table) -> SortSpec | None:
    """The table's sort order for the rewrite; None when unsorted or a field cannot be applied."""
    order = table.sort_order()
    schema = table.schema()
    fields = tuple(
        SortField(f.source_id, str(f.transform), f.direction.value == "desc", f.null_order.value == "nulls-first")
        for f in order.fields
        # A void transform orders nothing.
        if str(f.transform) != "void"
    )
    if not fields:
        return None
    if not all(sortable(schema, f) for f in fields):
        # Sorting by a part of the order would be a lie if the files then claimed the order's id.
        logger.warning("compaction does not sort: sort order %s has a field it cannot apply", order.order_id)
        return None
    return SortSpec(order.order_id, fields)


def _rewrite(
    spark: SparkSession,
    table: Table,
    spec: WriterSpec,
    the_plan: CompactionPlan,
    sort: SortSpec | None,
    progress: Progress | None,
) -> dict[int, WriteResult]:
    groups = the_plan.groups
    row_ids = vectors = None
    if table.metadata.format_version >= ROW_LINEAGE_FORMAT_VERSION:
        # PyIceberg's manifest reads (the plan's) drop first row ids and where DVs are: read them here.
        read = table.metadata.snapshot_by_id(the_plan.snapshot_id)
        assert read is not None
        row_ids = first_row_ids(table.io, read, {f.manifest_path for g in groups for f in g.data_files})
        vectors = live_vectors(table.io, read)
    payloads = [(i, encode_group(g, sort, the_plan.rules, row_ids, vectors)) for i, g in enumerate(groups)]
    chunk = max(2, spark.sparkContext.defaultParallelism * 2)
    results: dict[int, WriteResult] = {}
    try:
        with shipped(spark.sparkContext, spec) as load_spec:
            for start in range(0, len(payloads), chunk):
                part = payloads[start : start + chunk]
                rdd = spark.sparkContext.parallelize(part, numSlices=len(part))
                for index, encoded in rdd.mapPartitions(spark_rewrite(load_spec)).collect():
                    results[index] = WriteResult.decode(encoded)
                if progress is not None:
                    progress("rewrite", len(results), len(groups))
    except BaseException:
        # Failed tasks delete their own files; the chunks that finished before must go too.
        delete_quietly(table.io, [f.path for r in results.values() for f in r.data_files])
        raise
    return results


def compact(
    spark: SparkSession,
    load_table: Callable[[], Table],
    config: CompactionConfig | None = None,
    branch: str = "main",
    partition_filter: Callable[[int, tuple[Any, ...]], bool] | None = None,
    progress: Progress | None = None,
    write_options: Mapping[str, Any] | None = None,
    retry: RetryPolicy | None = None,
) -> CompactionResult:
    """Compact ``branch`` of the table once.

    Args:
        spark: the SparkSession whose tasks rewrite the groups.
        load_table: returns the table as the catalog has it now (called again before each commit attempt).
        config: thresholds (see CompactionConfig); defaults apply when None.
        partition_filter: ``(spec_id, partition values) -> bool`` to compact only some partitions.
        progress: called with (phase, done, total) as groups are rewritten and committed.
        write_options: option overrides (see docs/options.md) for the new files.
        retry: backoff when the branch head moves under the commit.

    Groups dropped on conflict make it plan again on the new head, at most ``config.max_replans``
    times; the result sums the plans (``replans`` counts the extra ones). A result whose ``noop``
    is true rewrote nothing.
    """
    config = config or CompactionConfig()
    retry = retry or RetryPolicy()
    last = result = _compact_once(spark, load_table, config, branch, partition_filter, progress, write_options, retry)
    while last.dropped_groups and result.replans < config.max_replans:
        logger.info("compaction plans again: %s of its groups were dropped", last.dropped_groups)
        last = _compact_once(spark, load_table, config, branch, partition_filter, progress, write_options, retry)
        result = result.then(last)
    if result.noop:
        logger.warning(
            "compaction rewrote nothing: all %s planned groups were dropped (%s plans); the table changed under them",
            result.planned_groups,
            result.replans + 1,
        )
    return result


def _compact_once(
    spark: SparkSession,
    load_table: Callable[[], Table],
    config: CompactionConfig,
    branch: str,
    partition_filter: Callable[[int, tuple[Any, ...]], bool] | None,
    progress: Progress | None,
    write_options: Mapping[str, Any] | None,
    retry: RetryPolicy,
) -> CompactionResult:
    """Plan, rewrite, validate and commit once (see :func:`compact`)."""
    started = time.monotonic()
    table = load_table()
    resolved = options.resolve(dict(write_options or {}), table.properties)
    # Manifests never change: the plan, every attempt's validation and its rewrite read each once.
    entries = ManifestEntries()
    the_plan = plan(table, branch, config, resolved.get(options.TARGET_FILE_SIZE_BYTES), partition_filter, entries)
    if the_plan is None:
        return CompactionResult(duration_ms=(time.monotonic() - started) * 1000)
    if progress is not None:
        progress("plan", len(the_plan.groups), len(the_plan.groups))
    spec = _writer_spec(table, config, write_options or {})
    results = _rewrite(spark, table, spec, the_plan, _sort_spec(table), progress)
    # Groups whose new files may still be committed; the files of every other group are deleted,
    # unless an attempt of unknown outcome may have committed them (CommitAttempt.discard decides).
    pending = set(results)
    attempt = CommitAttempt(f"compaction of {table.name()}", load_table, retry)

    def discard(indices: set[int], current: Table | None = None) -> None:
        attempt.discard(table.io, [f.path for i in sorted(indices) for f in results[i].data_files], current)
        pending.difference_update(indices)

    kept: list[int] = []
    replaced: list[LiveFile] = []
    removed_deletes: frozenset[str] = frozenset()

    def prepare(current: Table) -> producer.PreparedCommit | None:
        nonlocal kept, replaced, removed_deletes
        # Validated again on every attempt: the branch head may have moved under the plan. Only
        # manifests committed since an earlier read are read.
        head = branch_head(current, branch)
        head_files = live_files(current, head, entries)
        kept = _validate(head_files, the_plan, pending, spec.partition_spec.spec_id)
        discard(pending - set(kept), current)
        if not kept:
            return None
        replaced = [f for i in kept for f in the_plan.groups[i].data_files]
        removed_deletes = _still_removable(head_files, the_plan, {f.meta.path for f in replaced})
        return rewrites.RewriteFiles(
            current,
            branch,
            [f for i in kept for f in results[i].data_files],
            frozenset({f.meta.path for f in replaced} | removed_deletes),
            the_plan.sequence_number,
            {
                summary_keys.OPERATION_KEY: summary_keys.OPERATION_COMPACTION,
                summary_keys.COMPACTION_READ_SNAPSHOT_KEY: str(the_plan.snapshot_id),
            },
            entries,
        ).prepare()

    try:
        outcome = attempt.run(prepare)
    except BaseException:
        # After an attempt of unknown outcome the files stay unless the table proves them absent.
        discard(set(pending))
        raise
    if outcome.snapshot is None:
        logger.info("compaction plan dropped every group: the table changed under all of them")
        return CompactionResult(
            planned_groups=len(the_plan.groups),
            dropped_groups=len(the_plan.groups),
            duration_ms=(time.monotonic() - started) * 1000,
        )
    if progress is not None:
        progress("commit", len(kept), len(the_plan.groups))
    added = [f for i in kept for f in results[i].data_files]
    return CompactionResult(
        snapshot_id=outcome.snapshot.snapshot_id,
        planned_groups=len(the_plan.groups),
        committed_groups=len(kept),
        dropped_groups=len(the_plan.groups) - len(kept),
        rewritten_data_files=len(replaced),
        added_data_files=len(added),
        removed_delete_files=len(removed_deletes),
        rewritten_bytes=sum(f.meta.file_size_in_bytes for f in replaced),
        added_bytes=sum(f.file_size_in_bytes for f in added),
        duration_ms=(time.monotonic() - started) * 1000,
    )


def _validate(
    head_files: tuple[list[LiveFile], list[LiveFile]],
    the_plan: CompactionPlan,
    candidates: set[int],
    output_spec_id: int,
) -> list[int]:
    """The groups among ``candidates`` still valid at the branch head, given its live (data, delete)
    files (the others are in conflict).

    Checked per rewritten data file, as Iceberg Java's ``validateNoNewDeletesForDataFiles`` does
    with a ``DeleteFileIndex`` of the deletes committed since the plan: a group conflicts when one
    of its input files is no longer live, or when a delete committed after the plan's snapshot
    applies (``DeleteRules.applies``, the one rule) to one of its input files but not to its new
    files:

    - a position delete that can name an input file: a file-scoped one (a deletion vector's
      ``referenced_data_file``, or equal ``file_path`` bounds) naming it, or a partition-scoped one
      of its spec and partition. A file-scoped delete of another data file of the same partition
      (what the equality-delete conversion commits, a DV of another file, even in the same Puffin
      file) is no conflict;
    - a partition-scoped equality delete of an input file's spec and partition, when the group's
      files are rewritten into another spec (``output_spec_id``): it would not apply to the new files;

    Other equality deletes committed since need no check: they have higher sequence numbers than
    the new files and apply to them (global ones everywhere; scoped ones to the new files of the
    same spec and partition, which hold the same rows), as in Java's rewrite with
    ``use-starting-sequence-number``.
    """
    rules = the_plan.rules
    data, deletes = head_files
    live = {f.meta.path for f in data}
    # New deletes indexed by what can make them apply (a pre-filter; ``rules.applies`` decides):
    # file-scoped position deletes by the file they name, the others by spec and partition.
    by_file: dict[str, list[LiveFile]] = {}
    by_partition: dict[tuple[int, tuple[Any, ...]], list[LiveFile]] = {}
    for d in deletes:
        if d.data_sequence_number <= the_plan.sequence_number:
            continue
        if d.meta.content == FileContent.POSITION_DELETES:
            named = referenced_data_file(d.meta)
            if named is not None:
                by_file.setdefault(named, []).append(d)
            else:
                by_partition.setdefault((d.meta.spec_id, d.meta.partition), []).append(d)
        elif not rules.is_global(d) and d.meta.spec_id != output_spec_id:
            by_partition.setdefault((d.meta.spec_id, d.meta.partition), []).append(d)

    def conflict(f: LiveFile) -> str | None:
        if f.meta.path not in live:
            return f"input file {f.meta.path} no longer live"
        for d in by_file.get(f.meta.path, []) + by_partition.get((f.meta.spec_id, f.meta.partition), []):
            if rules.applies(d, f):
                kind = (
                    "position delete"
                    if d.meta.content == FileContent.POSITION_DELETES
                    else "equality delete of a spec the new files do not have"
                )
                return f"new {kind} {d.meta.path} applies to input file {f.meta.path}"
        return None

    kept = []
    for i in sorted(candidates):
        reason = next((r for r in map(conflict, the_plan.groups[i].data_files) if r is not None), None)
        if reason is not None:
            logger.info("compaction group %s dropped: %s", i, reason)
        else:
            kept.append(i)
    return kept


def _still_removable(
    head_files: tuple[list[LiveFile], list[LiveFile]], the_plan: CompactionPlan, replaced: set[str]
) -> frozenset[str]:
    """Delete files that no live data file at the head (``head_files``) needs once ``replaced`` are
    rewritten.

    Only delete files at or below the plan's sequence number qualify: the new files carry that
    sequence number, so such a delete cannot apply to them (equality deletes need a higher one,
    position deletes name other files). Every other live data file that a delete applies to, in
    its partition or, for a global equality delete, anywhere in the table, keeps it.
    """
    rules: DeleteRules = the_plan.rules
    data, deletes = head_files
    remaining: dict[tuple[int, tuple[Any, ...]], list[LiveFile]] = {}
    everywhere: list[LiveFile] = []
    for f in data:
        if f.meta.path not in replaced:
            remaining.setdefault((f.meta.spec_id, f.meta.partition), []).append(f)
            everywhere.append(f)
    result = set()
    for d in deletes:
        # A deletion vector goes with its data file (RewriteFiles), never by its Puffin path, which
        # may hold the DVs of other data files too.
        if d.data_sequence_number > the_plan.sequence_number or d.meta.file_format.upper() == "PUFFIN":
            continue
        candidates = everywhere if rules.is_global(d) else remaining.get((d.meta.spec_id, d.meta.partition), [])
        if not any(rules.applies(d, f) for f in candidates):
            result.add(d.meta.path)
    return frozenset(result)
