"""Run one conversion of equality deletes into position deletes (v2) or DVs (v3): plan, look up,
validate, commit.

Plan, on the branch head S (sequence number s): every live equality delete file E of S (data
sequence number e) and, for each, the live data files D it applies to by the one rule
(_iceberg/deletes.py: d < e, same spec and partition or E global), pruned by the key columns'
bounds and null counts. Each such D is read once, key columns only, by field id (renamed, added and
widened columns line up, _iceberg/projection.py); the positions of its rows whose key equals a key
of one of its deletes (a null matching a null) are merged with the positions of D's existing
file-scoped position deletes and written as ONE file-scoped position delete file for D. With a key
index (index.py; the post-commit trigger keeps one) D's keys and its old positions come from memory
and only files committed since the last run are read, manifests included. The commit
is a ``replace`` snapshot removing every planned E and the merged old position delete files, and
adding the new ones: no row changes, so readers see the same table.

Sequence numbers: the new position delete files inherit the new snapshot's sequence number c. A
position delete applies to the data file it names when its data sequence number is at least the
file's; every target has d < e <= s < c, so each new file applies to its data file (and, named by
path and bounds, to no other). c is also above the sequence number any concurrent compaction read,
so a compaction that planned before this commit sees the new position deletes as committed after
its plan and drops the group rewriting D (topology/compaction/job.py ``_validate``) instead of
committing D's rows again at a sequence number the removed E no longer covers.

Validation, against the branch head H of every commit attempt (commit_with_retry prepares again on
each): the commit is in conflict, and planned again from H (at most ``max_replans`` times), when

1. a file it removes (an E, a merged position delete file) is no longer live: another conversion or
   a compaction removed it;
2. a data file it adds position deletes for is no longer live: a compaction rewrote it;
3. a data file live in H but not in S is one a removed E applies to: a compaction committed new
   files at a sequence number below e (it read a snapshot older than E), and E's rows in them would
   come back once E is gone.

Stream commits in between add data files with higher sequence numbers (E does not apply to them)
and new equality deletes (kept): they only make the attempt prepare again on the new head.

Format v3 forbids adding position delete files: each D gets one deletion vector instead, holding the
positions found, its live DV's and those of every position delete file that applies to it (a v2-era
file naming D only is removed, as a merged one is on v2; one naming other files too stays: a reader
that finds a DV ignores it), written and merged by the rule the v3 checkpoint commit follows
(committer/vectors.py ``write_vectors``, which also lays them out in Puffin files). The commit removes every planned
E, those position delete files and the DVs the new ones replace, entry by entry
(_iceberg/delete_rewrite.py), and carries the data manifests over with their first row ids: it adds
no row and assigns no row id. The DV names exact positions of D, so the sequence number c it gets
is right as above. Validation adds:

4. a data file it adds a DV for has another live DV than the one merged (another writer's DV, or
   a DV where there was none): committing would lose that DV's positions or leave two DVs.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable

import attrs
import numpy as np
import pyarrow as pa
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from iceberg_sink import options
from iceberg_sink._iceberg import producer
from iceberg_sink._iceberg.delete_rewrite import RewriteDeletes
from iceberg_sink._iceberg.deletes import DeleteRules, keys_may_match
from iceberg_sink._iceberg.entries import ManifestEntries, live_files
from iceberg_sink._iceberg.files import LiveFile, PartitionPath, branch_head, delete_quietly
from iceberg_sink._iceberg.lineage import ROW_LINEAGE_FORMAT_VERSION
from iceberg_sink._iceberg.live_rows import key_columns
from iceberg_sink._iceberg.position_deletes import referenced_data_file, sorted_positions, write_position_deletes
from iceberg_sink._iceberg.projection import key_schema, name_mapping_of, read_projected
from iceberg_sink._iceberg.retry import CommitAttempt, RetryPolicy
from iceberg_sink.committer import vectors
from iceberg_sink.keyindex import fetch
from iceberg_sink.keyindex.index import KeyIndex
from iceberg_sink.topology import arguments
from iceberg_sink.vocab import summary_keys
from iceberg_sink.vocab.files import DataFileMeta, FileContent

logger = logging.getLogger(__name__)


@attrs.frozen
class ConversionTarget:
    """One data file that receives a position delete file, and the delete files that feed it.

    Attributes:
        data: the data file.
        equality_deletes: the planned equality deletes that apply to it (after bounds pruning).
        position_deletes: its live file-scoped position delete files, merged into the new file.
    """

    data: LiveFile
    equality_deletes: tuple[LiveFile, ...]
    position_deletes: tuple[LiveFile, ...]


@attrs.frozen
class ConversionPlan:
    """What one conversion reads, planned on snapshot ``snapshot_id`` (sequence ``sequence_number``).

    Attributes:
        equality_deletes: the equality delete files the commit removes.
        data_paths: every live data file of the snapshot (to see files committed after it).
        delete_paths: every live delete file of the snapshot.
        targets: the data files whose rows the equality deletes may remove.
        pruned: (equality delete, data file) pairs that the rule matched but key bounds excluded.
    """

    snapshot_id: int
    sequence_number: int
    equality_deletes: tuple[LiveFile, ...]
    data_paths: frozenset[str]
    delete_paths: frozenset[str]
    targets: tuple[ConversionTarget, ...]
    pruned: int


@attrs.frozen
class ConversionResult:
    """What one conversion did.

    Attributes:
        snapshot_id: the ``replace`` snapshot, or None when nothing was committed.
        removed_equality_delete_files / removed_equality_deletes: equality delete files (rows) removed.
        added_position_delete_files / added_position_deletes: position delete files (rows) added.
        removed_position_delete_files: older file-scoped position delete files merged into new ones.
        added_dvs / replaced_dvs / dv_positions: format v3: deletion vectors added, live ones they
            replaced, and the positions the added ones hold (old positions merged in included).
        data_files_read: data files whose key columns were read.
        pruned_pairs: (equality delete, data file) pairs skipped by key bounds.
        replans: plans discarded because a concurrent commit invalidated them.
        duration_ms: wall time.
    """

    snapshot_id: int | None = None
    removed_equality_delete_files: int = 0
    removed_equality_deletes: int = 0
    added_position_delete_files: int = 0
    added_position_deletes: int = 0
    removed_position_delete_files: int = 0
    added_dvs: int = 0
    replaced_dvs: int = 0
    dv_positions: int = 0
    data_files_read: int = 0
    pruned_pairs: int = 0
    replans: int = 0
    duration_ms: float = 0.0


class _PlanInvalidated(Exception):
    """A concurrent commit made the plan wrong (see the module docstring): plan again."""


def _has_field(schema: Schema, field_id: int) -> bool:
    try:
        schema.find_field(field_id)
    except ValueError:
        return False
    return True


def plan_conversion(table: Table, branch: str, entries: ManifestEntries | None = None) -> ConversionPlan | None:
    """Plan a conversion of ``branch``; None when it has no equality deletes to convert.
    ``entries``: manifests already read in this run."""
    snapshot = branch_head(table, branch)
    if snapshot is None or table.metadata.format_version < 2:
        return None
    schema = table.schema()
    rules = DeleteRules.from_specs(table.specs())
    data, deletes = live_files(table, snapshot, entries)
    # An equality delete on a field the current schema dropped cannot be looked up: it stays.
    equality = [
        d
        for d in deletes
        if d.meta.content == FileContent.EQUALITY_DELETES
        and d.meta.equality_ids
        and all(_has_field(schema, i) for i in d.meta.equality_ids)
    ]
    if not equality:
        return None
    by_partition: dict[tuple[int, tuple[object, ...]], list[LiveFile]] = defaultdict(list)
    for f in data:
        by_partition[(f.meta.spec_id, f.meta.partition)].append(f)
    scoped: dict[str, list[LiveFile]] = defaultdict(list)
    for d in deletes:
        named = referenced_data_file(d.meta)
        if named is not None:
            scoped[named].append(d)
    applying: dict[str, list[LiveFile]] = defaultdict(list)
    files = {f.meta.path: f for f in data}
    pruned = 0
    for e in equality:
        candidates = data if rules.is_global(e) else by_partition.get((e.meta.spec_id, e.meta.partition), [])
        for f in candidates:
            if not rules.applies(e, f):
                continue
            if keys_may_match(e.meta, f.meta, schema):
                applying[f.meta.path].append(e)
            else:
                pruned += 1
    targets = tuple(
        ConversionTarget(
            files[path],
            tuple(es),
            tuple(p for p in scoped.get(path, []) if rules.applies(p, files[path])),
        )
        for path, es in sorted(applying.items())
    )
    return ConversionPlan(
        snapshot_id=snapshot.snapshot_id,
        sequence_number=snapshot.sequence_number or 0,
        equality_deletes=tuple(equality),
        data_paths=frozenset(files),
        delete_paths=frozenset(d.meta.path for d in deletes),
        targets=targets,
        pruned=pruned,
    )


def _new_path(table: Table, data: DataFileMeta, name: str) -> str:
    """Where the position delete file of ``data`` goes: the table's data location of its partition."""
    spec = table.specs()[data.spec_id]
    key = PartitionPath(spec, table.schema(), data.partition) if spec.fields else None
    try:
        return table.location_provider().new_data_location(data_file_name=name, partition_key=key)  # type: ignore[arg-type]
    except Exception:  # an old spec whose source column is gone: beside the data file
        return data.path.rsplit("/", 1)[0] + "/" + name


@attrs.frozen
class ConversionFiles:
    """What :func:`write_conversion` wrote for one plan.

    Attributes:
        added: the new delete files: file-scoped position delete files (v2), or deletion vectors, all
            in one Puffin file (v3).
        merged: the old file-scoped position delete files merged into them, which the commit removes
            (v2; on v3 those of an upgraded v2 table whose data file gets a DV).
        replaced_dvs: (Puffin path, data file) of the live DVs the new ones replace (v3).
        data_files_read: data files whose key columns had to be read (not in the index).
    """

    added: tuple[DataFileMeta, ...] = ()
    merged: tuple[str, ...] = ()
    replaced_dvs: frozenset[tuple[str, str]] = frozenset()
    data_files_read: int = 0

    @property
    def written(self) -> list[str]:
        """The files written (each once: a Puffin file may hold several DVs)."""
        return sorted({f.path for f in self.added})


def _found_positions(
    table: Table, the_plan: ConversionPlan, index: KeyIndex
) -> tuple[dict[str, list[np.ndarray]], int]:
    """The rows of each target that its planned equality deletes remove (path -> positions), and the
    number of data files read."""
    io, schema, mapping = table.io, table.schema(), name_mapping_of(table.properties)
    keys: dict[tuple[tuple[int, ...], tuple[str, ...]], pa.Table] = {}
    found: dict[str, list[np.ndarray]] = {}

    def delete_keys(ids: tuple[int, ...], deletes: list[LiveFile]) -> pa.Table:
        """The keys ``ids`` of the equality delete files ``deletes``, read once per run."""
        key = (ids, tuple(sorted(d.meta.path for d in deletes)))
        if key not in keys:
            wanted = key_schema(schema, ids)
            tables = [
                key_columns(
                    read_projected(io, d.meta.path, wanted, only_needed_columns=True, mapping=mapping), wanted, ids
                )
                for d in deletes
            ]
            keys[key] = pa.concat_tables(tables).combine_chunks()
        return keys[key]

    requests: dict[tuple[int, ...], list[tuple[DataFileMeta, pa.Table]]] = defaultdict(list)
    for target in the_plan.targets:
        by_ids: dict[tuple[int, ...], list[LiveFile]] = defaultdict(list)
        for e in target.equality_deletes:
            by_ids[tuple(e.meta.equality_ids or ())].append(e)
        for ids, es in by_ids.items():
            requests[ids].append((target.data.meta, delete_keys(ids, es)))
        found[target.data.meta.path] = []
    positions, read = index.match(io, schema, requests, mapping)
    for path, arrays in positions.items():
        found[path].extend(arrays)
    return found, read


def write_conversion(
    table: Table, the_plan: ConversionPlan, index: KeyIndex | None = None, entries: ManifestEntries | None = None
) -> ConversionFiles:
    """Look the planned keys up and write the new delete files.

    ``index`` keeps data files' keys and position delete files' positions between runs (a trigger
    keeps one; see index.py); without one every planned data file is read. On format v2 each target
    gets one file-scoped position delete file, merged with its file-scoped position delete files; on
    v3 one DV, merged with its live DV and every position delete file that applies
    (committer/vectors.py ``write_vectors``, the rule the v3 checkpoint commit follows too, which also
    lays them out in Puffin files). ``entries``: the manifests already read for the plan. Files written are deleted
    again if this fails.
    """
    io, schema = table.io, table.schema()
    index = index if index is not None else KeyIndex(max_bytes=0)
    index.bind(table)
    index.retain(the_plan.data_paths, the_plan.delete_paths, schema.schema_id)
    found, read = _found_positions(table, the_plan, index)
    if table.metadata.format_version >= ROW_LINEAGE_FORMAT_VERSION:
        data, deletes = live_files(table, table.snapshot_by_id(the_plan.snapshot_id), entries)
        resolved = vectors.write_vectors(table, data, deletes, found, {f.meta.path: f.meta for f in data}, index)
        # The file-scoped position delete files the new DVs took over go as merged ones do on v2.
        retired = tuple(sorted(path for path, _ in resolved.retired))
        return ConversionFiles(resolved.vectors, retired, resolved.replaced, read)
    compression = options.resolve({}, table.properties).get(options.PARQUET_COMPRESSION)
    codec = options.parquet_codec(compression)
    run = uuid.uuid4().hex[:16]
    news = [(t, new) for t in the_plan.targets if len(new := sorted_positions(found[t.data.meta.path]))]
    pairs = [(p.meta.path, t.data.meta.path) for t, _ in news for p in t.position_deletes]
    earlier = dict(zip(pairs, index.positions_of(io, pairs), strict=True))  # at once on object storage
    todo: list[tuple[ConversionTarget, np.ndarray, str]] = []
    for target, new in news:
        data_file = target.data.meta
        before = sorted_positions(earlier[(p.meta.path, data_file.path)] for p in target.position_deletes)
        positions = sorted_positions([before, new])
        if len(positions) == len(before):
            continue  # every row found is already deleted by position
        todo.append((target, positions, _new_path(table, data_file, f"{run}-{len(todo):05d}-pos-deletes.parquet")))

    # A file a data file, written by the read pool's threads on object storage (a request's latency
    # each), one after another locally: the rule of the v3 Puffin files (committer/vectors.py).
    # fetch.each raises once every write has ended, so every file that was written is deleted again.
    try:
        written = fetch.each(
            lambda item: write_position_deletes(io, item[2], item[0].data.meta, [item[1]], codec),
            todo,
            fetch.overlapped(path for _, _, path in todo),
        )
    except BaseException:
        delete_quietly(io, [path for _, _, path in todo])
        raise
    for (target, positions, path), _ in zip(todo, written, strict=True):
        index.remember_positions(path, target.data.meta.path, positions)
    merged = [p.meta.path for target, _, _ in todo for p in target.position_deletes]
    return ConversionFiles(tuple(written), tuple(merged), frozenset(), read)


def _conflict(
    current: Table,
    branch: str,
    the_plan: ConversionPlan,
    files: ConversionFiles,
    removed: frozenset[str],
    entries: ManifestEntries,
) -> str | None:
    """Why the plan no longer holds at ``branch``'s head of ``current`` (module docstring), or None."""
    data, deletes = live_files(current, branch_head(current, branch), entries)
    live_deletes = {d.meta.path for d in deletes}
    gone = sorted(p for p in removed if p not in live_deletes)
    if gone:
        return f"{len(gone)} delete files it removes are no longer live (e.g. {gone[0]})"
    live_data = {f.meta.path for f in data}
    named = [referenced_data_file(f) for f in files.added]
    rewritten = sorted(p for p in named if p is not None and p not in live_data)
    if rewritten:
        return f"{len(rewritten)} data files it adds position deletes for are no longer live (e.g. {rewritten[0]})"
    # v3: a data file's new DV replaces exactly the DV it merged (or none): another writer's DV
    # committed since would be lost (at most one DV per data file).
    live_dvs = {
        d.meta.referenced_data_file: (d.meta.path, d.meta.referenced_data_file) for d in deletes if d.meta.is_dv
    }
    merged_dvs = {key[1]: key for key in files.replaced_dvs}
    for dv in files.added:
        target = dv.referenced_data_file
        if target is not None and live_dvs.get(target) != merged_dvs.get(target):
            return f"data file {target} has another deletion vector than the one merged into its new one"
    rules = DeleteRules.from_specs(current.specs())
    newer = [f for f in data if f.meta.path not in the_plan.data_paths]
    for e in the_plan.equality_deletes:
        for f in newer:
            if rules.applies(e, f):
                return f"data file {f.meta.path}, committed after the plan, needs equality delete {e.meta.path}"
    return None


def _prepare(
    branch: str,
    the_plan: ConversionPlan,
    files: ConversionFiles,
    removed: frozenset[str],
    entries: ManifestEntries,
) -> Callable[[Table], producer.PreparedCommit]:
    """The commit attempt on a freshly loaded table: validate against its branch head, then build.
    The head's manifests are read once (``entries``), for the check and for the rewrite."""

    def prepare(current: Table) -> producer.PreparedCommit:
        problem = _conflict(current, branch, the_plan, files, removed, entries)
        if problem is not None:
            raise _PlanInvalidated(problem)
        return RewriteDeletes(
            current,
            branch,
            files.added,
            removed,
            {
                summary_keys.OPERATION_KEY: summary_keys.OPERATION_CONVERT_EQUALITY_DELETES,
                summary_keys.CONVERSION_READ_SNAPSHOT_KEY: str(the_plan.snapshot_id),
            },
            entries,
            files.replaced_dvs,
        ).prepare()

    return prepare


def convert_equality_deletes(
    load_table: Callable[[], Table],
    branch: str = "main",
    retry: RetryPolicy | None = None,
    max_replans: int = 3,
    index: KeyIndex | None = None,
) -> ConversionResult:
    """Convert the live equality deletes of ``branch`` into file-scoped position deletes (format v2)
    or deletion vectors (format v3), once.

    Args:
        load_table: returns the table as the catalog has it now (called before each plan and each
            commit attempt).
        branch: the branch to convert.
        retry: backoff when the branch head moves under the commit.
        max_replans: plans discarded on conflict (see the module docstring) before giving up; giving
            up commits nothing and is not an error (the equality deletes stay and stay correct).
        index: data files' keys kept from earlier runs (a post-commit trigger keeps one; index.py),
            or None to read every data file the equality deletes apply to.
    """
    arguments.MAX_REPLANS.check(max_replans)
    started = time.monotonic()
    retry = retry or RetryPolicy()
    replans = 0
    while True:
        table = load_table()
        # Manifests never change: each is read once for the plan and its commit attempts, and with
        # an index once for as long as the branch lists it.
        entries = ManifestEntries() if index is None else index.manifests
        if index is not None:
            head = branch_head(table, branch)
            index.retain_manifests(m.manifest_path for m in (head.manifests(table.io) if head else []))
        the_plan = plan_conversion(table, branch, entries)
        if the_plan is None:
            return ConversionResult(replans=replans, duration_ms=(time.monotonic() - started) * 1000)
        files = write_conversion(table, the_plan, index, entries)
        removed = frozenset({e.meta.path for e in the_plan.equality_deletes} | set(files.merged))
        attempt = CommitAttempt(
            f"equality-delete conversion of {table.name()}",
            load_table,
            retry,
            on_give_up="; the equality deletes stay (nothing was converted)",
        )
        try:
            outcome = attempt.run(_prepare(branch, the_plan, files, removed, entries))
        except _PlanInvalidated as e:
            if not attempt.discard(table.io, files.written):
                raise attempt.unknown_error(e) from e
            replans += 1
            if replans > max_replans:
                logger.warning("equality-delete conversion gave up after %s plans: %s", replans, e)
                return ConversionResult(replans=replans, duration_ms=(time.monotonic() - started) * 1000)
            logger.info("equality-delete conversion planned again: %s", e)
            continue
        except BaseException:
            # After an attempt of unknown outcome the files stay unless the table proves them absent.
            attempt.discard(table.io, files.written)
            raise
        assert outcome.snapshot is not None
        dvs = tuple(f for f in files.added if f.is_dv)
        positional = tuple(f for f in files.added if not f.is_dv)
        return ConversionResult(
            snapshot_id=outcome.snapshot.snapshot_id,
            removed_equality_delete_files=len(the_plan.equality_deletes),
            removed_equality_deletes=sum(e.meta.record_count for e in the_plan.equality_deletes),
            added_position_delete_files=len(positional),
            added_position_deletes=sum(f.record_count for f in positional),
            removed_position_delete_files=len(files.merged),
            added_dvs=len(dvs),
            replaced_dvs=len(files.replaced_dvs),
            dv_positions=sum(f.record_count for f in dvs),
            data_files_read=files.data_files_read,
            pruned_pairs=the_plan.pruned,
            replans=replans,
            duration_ms=(time.monotonic() - started) * 1000,
        )
