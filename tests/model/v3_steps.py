"""The model check's format v3 tables (issue 22): deletion vectors, other writers' DVs, upgrades.

Kept out of harness.py (as debezium_steps.py is). Two tables of their own, each with a CDC sink
(``.cdc(op_column="op", key=["id"], order_by="lsn")``) and a ``dict id -> row`` model:

- ``db.v3``: created by its sink with ``create_if_missing(format_version=3, partition_by=["bucket(2, id)"])``,
  with the table property ``iceberg-sink.deletion-vectors.files`` drawn per seed: unset (the default,
  ``one-per-commit-spaced``: a commit's DVs in one Puffin file, spaced apart), ``one-per-vector`` or
  ``one-per-commit`` (side by side; DuckDB reads it with its file cache off).
  Its deletes must be deletion vectors only: main never holds an equality or position delete file,
  at most one DV per data file, each naming a live data file; with ``one-per-vector`` each Puffin
  file of the sink holds one DV, spaced each DV of a shared file is followed by more zero bytes than
  its own size.
- ``db.v2up``: created on format v2 (``create_if_missing(format_version=2)``: its updates write
  equality deletes), upgraded to v3 mid-run with
  ``sink.upgrade_format_version(3)``, then it keeps taking checkpoints: its old equality deletes stay
  (as Iceberg Java keeps them) and every delete committed after the upgrade is a DV.

Operations (weighted into harness.OPERATIONS; every choice inside them is drawn from a generator of
their own, so a seed's other draws do not depend on them):

- ``v3_cdc``: a CDC checkpoint of ``db.v3`` (or of ``db.v2up``), over 12 keys so checkpoints update and
  delete rows of the same data files again and again (the sink merges its new positions into the
  file's DV); 30% of them die at one of FAULT_POINTS (points.py), or with the partitioned key index
  also at one of INDEX_FAULT_POINTS (inside its save), and a restarted sink replays the checkpoint.
- ``v3_java_delete``: the newest Iceberg Java deletes 1-3 live rows of ``db.v3`` with a Spark SQL
  ``DELETE`` (merge-on-read: its own DV, merged with the sink's), committed into the model's catalog
  (a compare-and-swap of the catalog row, as a JDBC catalog sharing the database would do). The
  sink's next checkpoint must merge that DV, never lose it.
  A quarter of these steps instead add an int column with a default value to ``db.v3`` through Java's
  ``UpdateSchema`` (sometimes changing its write-default after): rows already there read the
  initial-default; the sink's later checkpoints (the same sink object), whose batches never supply the
  column, must write the write-default (at most two such columns).
- ``v3_compaction``: ``sink.compact()`` of ``db.v3`` or ``db.v2up`` (DVs applied, row lineage carried).
- ``v3_upgrade``: ``upgrade_format_version(3)`` of ``db.v2up`` once it has equality deletes (before:
  a checkpoint of it; after: a checkpoint too).
- ``v3_convert``: ``sink.convert_equality_deletes()`` of ``db.v2up`` once upgraded (before: the
  upgrade step): the equality deletes it kept become DVs, merged with the DVs there; no row's lineage
  moves, and no equality delete is left.
- ``v3_lane``: a stream of ``db.v3`` whose commits run on the commit lane (job/lane.py: each
  checkpoint's commit beside the next micro-batch, as a Kafka stream with records waiting does), 2-3
  micro-batches that also insert keys above every key so far. One checkpoint's commit on the lane
  (drawn) waits there until the next micro-batch has planned and started writing, then meets one of
  LANE_WINDOWS: another writer appending rows of the keys this and the next checkpoint insert as new,
  an expiry of every snapshot but the last, a compaction of db.v3, or a driver death at one of
  LANE_CRASH_POINTS on the lane's thread (the next micro-batch raises it; a restarted sink replays it).

After every step each v3 table that changed is read by Iceberg Java 1.9.2, the newest Iceberg Java,
DuckDB and PyIceberg (when no equality delete is live) and must equal its model; its deletes are
checked as above; every DV that stays on a live data file keeps at least its positions; the newest
Java's ``_row_id`` / ``_last_updated_sequence_number`` are set, unique, and unchanged for every row
no step touched (a compaction or another row's delete moves none); every sink checkpoint is one
snapshot. ``stats`` counts the DV merges seen (a file's DV replaced by a larger one: the sink's over
its own, ``dv_merges``; the sink's over Java's, ``java_dv_merges``; Java's over one there,
``java_merged_a_dv``), crashes, upgrades, conversions and compactions, for test_model.py::test_model_v3_tables.
"""

from __future__ import annotations

import collections
import itertools
import random
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
from pyiceberg.table import Table

from iceberg_sink import IcebergSink, _faults
from iceberg_sink._iceberg import position_deletes
from iceberg_sink.topology.compaction import CompactionConfig
from tests.integration.test_v3_cdc import delete_files
from tests.interop.readers import assert_readers_agree, normalize, pyiceberg_read
from tests.model.points import FAULT_POINTS, INDEX_FAULT_POINTS, Crash

Row = dict[str, Any]

OPERATIONS: dict[str, int] = {
    "v3_cdc": 3,
    "v3_java_delete": 1,
    "v3_compaction": 1,
    "v3_upgrade": 1,
    "v3_convert": 1,
    "v3_lane": 1,
}
V3, V2UP = "db.v3", "db.v2up"
KEYS = 12  # few keys: checkpoints keep deleting rows of the same data files (DV merges)
NEW_KEYS = 1000  # the lane's streams insert keys from here up, each above every key before it
LANE_WINDOWS = ("none", "other_writer", "expire", "compaction", "crash")
LANE_CRASH_POINTS = (_faults.BEFORE_COMMIT_SEND, _faults.COMMIT_SENT, _faults.AFTER_COMMIT)
LANE_BESIDE_S = 30.0  # how long a lane's commit waits for the next micro-batch to start writing
CRASH_SHARE = 0.3
OTHER_WRITER_SHARE = 0.3
JAVA_DEFAULT_SHARE = 0.25
DDL = "id bigint, v string, n bigint, lsn bigint, op string"
SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), ("n", pa.int64()), ("lsn", pa.int64())])
PREFIX = "iceberg-sink"


class V3Tables:
    """The v3 tables' sinks, models, generator and what the checks remember between steps."""

    def __init__(self, world: Any) -> None:
        self.world = world
        self.rng = random.Random(f"v3-{world.seed}")
        self.lane_rng = random.Random(f"v3-lane-{world.seed}")  # the lane's draws: other sequences kept
        self.new_key = NEW_KEYS
        self.other_rng = random.Random(f"v3-other-{world.seed}")  # other writers in a commit's window
        # db.v3's Puffin layout (table property, None: the default, spaced), drawn per seed; db.v2up
        # always has the default.
        self.layout: str | None = random.Random(f"v3-layout-{world.seed}").choice(
            [None, "one-per-vector", "one-per-commit"]
        )
        self.lsn = 0
        self.models: dict[str, dict[int, Row]] = {V3: {}, V2UP: {}}
        self.next_checkpoint = {V3: 0, V2UP: 0}
        self.sinks: dict[str, IcebergSink] = {}
        self.upgraded_at: int | None = None  # db.v2up's last sequence number when it was upgraded
        # table -> data file -> (DV location, positions, written by Java)
        self.dvs: dict[str, dict[str, tuple[tuple[str, int | None], int, bool]]] = {V3: {}, V2UP: {}}
        self.java_dvs: set[tuple[str, int | None]] = set()
        self.file_scoped: dict[str, dict[str, str]] = {}  # table -> v2 position delete file -> data file
        self.lineage: dict[str, dict[int, tuple[int, int]] | None] = {V3: None, V2UP: None}
        self.touched: dict[str, set[int]] = {V3: set(), V2UP: set()}
        self.checkpoints: dict[tuple[str, str, str], set[int]] = collections.defaultdict(set)
        self.stats: collections.Counter[str] = collections.Counter()
        self.seconds: collections.Counter[str] = collections.Counter()  # time spent checking
        self.java_catalog: str | None = None  # declared on first use (the Java session is shared)
        self.java_tables = 0
        # db.v3's columns added by Iceberg Java with default values: name -> (initial-default, write-default)
        self.defaults: dict[str, tuple[int, int]] = {}

    # -- sinks and batches --------------------------------------------------------------------------

    def sink(self, table: str, restart: bool = False) -> IcebergSink:
        if restart or table not in self.sinks:
            w = self.world
            # db.v2up starts on v2 (explicitly: a CDC table's default is v3).
            create: dict[str, Any] = {"format_version": 2}
            if table == V3:
                create = {"format_version": 3, "partition_by": ["bucket(2, id)"]}
                if self.layout is not None:
                    create["properties"] = {"iceberg-sink.deletion-vectors.files": self.layout}
            self.sinks[table] = w.key_index(
                IcebergSink.builder()
                .catalog("model", **w.catalog_props)
                .table(table)
                .create_if_missing(**create)
                .cdc(op_column="op", key=["id"], order_by="lsn")
                .write_option("iceberg-sink.writer.max-open-files", w.max_open_files)
                .write_option("iceberg-sink.writer.buffer-bytes", w.buffer_bytes)
            ).build()
        return self.sinks[table]

    def batch(self, table: str) -> list[Row]:
        """Inserts, updates (sometimes with their update-before image) and deletes of live and absent
        keys, repeated keys included (the highest lsn wins); arrival order shuffled."""
        rng, live, out = self.rng, dict(self.models[table]), []
        # An empty table first takes most keys in one checkpoint: files of several rows, which later
        # checkpoints delete from one by one.
        for _ in range(rng.randrange(1, 9) if live else KEYS):
            key = rng.randrange(KEYS)
            self.lsn += 1
            if rng.random() < 0.3:
                out.append({**live.pop(key, {"id": key, "v": None, "n": None}), "lsn": self.lsn, "op": "D"})
                continue
            if key in live and rng.random() < 0.3:
                out.append({**live[key], "lsn": self.lsn, "op": "UB"})
                self.lsn += 1
            row = {
                "id": key,
                "v": None if rng.random() < 0.1 else f"v{self.lsn}" + rng.choice(["", "ü", "日本"]),
                "n": None if rng.random() < 0.2 else rng.randrange(-(2**40), 2**40),
                "lsn": self.lsn,
            }
            out.append({**row, "op": "U" if key in live else "I"})
            live[key] = row
        rng.shuffle(out)
        return out

    # -- operations -----------------------------------------------------------------------------------

    def op_cdc(
        self,
        table: str | None = None,
        crash_at: str | None = None,
        changes: list[Row] | None = None,
        theirs: list[Row] | None = None,
    ) -> None:
        """A CDC checkpoint of ``table``: drawn, or ``changes``; ``theirs``: rows another writer
        commits between its plan and its commit (drawn by :meth:`other_rows` when not given)."""
        table = table or (V3 if self.rng.random() < 0.7 else V2UP)
        if crash_at is None and changes is None and self.rng.random() < CRASH_SHARE:
            points = FAULT_POINTS + (INDEX_FAULT_POINTS if self.world.key_index_options else ())
            crash_at = self.rng.choice(points)
        changes = changes if changes is not None else self.batch(table)
        checkpoint = self.next_checkpoint[table]
        desc = ", ".join(f"{c['op']}({c['id']})" for c in sorted(changes, key=lambda c: c["lsn"]))
        self.world.log(
            f"v3: {table} cdc checkpoint {checkpoint}: {desc}" + (f" [crash at {crash_at}]" if crash_at else "")
        )
        rows = [tuple(c.get(k) for k in ("id", "v", "n", "lsn", "op")) for c in changes]
        frame = self.world.spark.createDataFrame(rows, DDL).repartition(self.rng.choice([1, 2]))
        location = str(Path(self.world.root) / f"ckpt-{table}")
        if theirs is None:
            theirs = self.other_rows(table, changes) if crash_at is None else []
        if theirs:
            self.other_writer_in_the_window(table, checkpoint, theirs)
            try:
                self.sink(table).write(frame, checkpoint_location=location, checkpoint_id=checkpoint)
            finally:
                _faults.clear()
            for row in theirs:
                self.models[table][row["id"]] = dict(row)
        elif crash_at is not None:

            def handler(point: str, cp: int) -> None:
                if point == crash_at and (cp == checkpoint or point in INDEX_FAULT_POINTS):
                    raise Crash(f"simulated driver death at {point} of checkpoint {checkpoint}")

            _faults.install(handler)
            try:
                self.sink(table).write(frame, checkpoint_location=location, checkpoint_id=checkpoint)
                crashed = False
            except Crash:
                crashed = True
            finally:
                _faults.clear()
            if crashed:
                self.world.trace[-1] += " -> crashed, restarted, replayed"
                self.stats["crashes"] += 1
                self.remember_checkpoints(table)
                self.sink(table, restart=True).write(frame, checkpoint_location=location, checkpoint_id=checkpoint)
            else:
                self.world.trace[-1] += " -> no crash (fault point not reached)"
        else:
            self.sink(table).write(frame, checkpoint_location=location, checkpoint_id=checkpoint)
        self.next_checkpoint[table] += 1
        self.world.apply_cdc(self.models[table], changes)
        if table == V3:
            # The batch does not supply the columns Java added with defaults: its rows take the write-default.
            for row in self.models[V3].values():
                for column, (_, write) in self.defaults.items():
                    row.setdefault(column, write)
        self.touched[table] |= {c["id"] for c in changes}
        self.check(table)

    def other_rows(self, table: str, changes: list[Row]) -> list[Row]:
        """Rows another writer commits between this checkpoint's plan and its commit (issue 42 item
        6), drawn on a generator of their own (every seed keeps its sequence of operations): in a
        share of db.v3's checkpoints, rows of keys the model lacks, among them every key the
        checkpoint deletes without the model holding it (a checkpoint of only such deletes found
        "nothing to commit" on the table loaded at its start)."""
        rng = self.other_rng
        if table != V3 or rng.random() >= OTHER_WRITER_SHARE or not self.world.catalog.table_exists(V3):
            return []
        absent = sorted(k for k in range(KEYS) if k not in self.models[table])
        keys = {c["id"] for c in changes if c["op"] == "D" and c["id"] in absent}
        keys |= set(rng.sample(absent, min(len(absent), rng.randrange(0, 3))))
        return [{"id": k, "v": f"other-{k}", "n": None, "lsn": None} for k in sorted(keys)]

    def op_deletes_beside_another_writer(self) -> None:
        """A checkpoint of db.v3 that only deletes keys the table lacks when it starts, while another
        writer commits rows of those keys before its commit: the deletes must remove them."""
        absent = [k for k in range(KEYS) if k not in self.models[V3]][:2]
        if not absent or not self.world.catalog.table_exists(V3):
            self.op_cdc(V3)
            return
        changes = []
        for key in absent:
            self.lsn += 1
            changes.append({"id": key, "v": None, "n": None, "lsn": self.lsn, "op": "D"})
        theirs = [{"id": k, "v": f"other-{k}", "n": None, "lsn": None} for k in absent]
        self.op_cdc(V3, changes=changes, theirs=theirs)
        if any(k in self.models[V3] for k in absent):
            raise self.world.fail(f"v3: the model kept deleted keys {absent}")

    def other_writer_in_the_window(self, table: str, checkpoint: int, theirs: list[Row]) -> None:
        """Install a fault hook by which an appending sink (another job) commits ``theirs`` once the
        checkpoint's committable is stored and before its commit; the caller clears it."""
        w = self.world
        self.world.trace[-1] += f" [another writer appends ids {[r['id'] for r in theirs]} before its commit]"
        self.stats["other_writer_windows"] += 1
        done: list[int] = []

        def append(point: str, cp: int) -> None:
            if point != _faults.AFTER_MANIFESTS or cp != checkpoint or done:
                return
            done.append(cp)
            other = IcebergSink.builder().catalog("model", **w.catalog_props).table(table).build()
            rows = [tuple(r[k] for k in ("id", "v", "n", "lsn")) for r in theirs]
            other.write(w.spark.createDataFrame(rows, "id bigint not null, v string, n bigint, lsn bigint"))

        _faults.install(append)

    def op_lane(self, window: str | None = None, crash_at: str | None = None) -> None:
        """A stream of db.v3 with its commits on the commit lane (module docstring, ``v3_lane``)."""
        w = self.world
        if not w.catalog.table_exists(V3):
            self.op_cdc(V3)
            return
        rng = self.lane_rng
        window = window or rng.choice(LANE_WINDOWS)
        if window == "crash":
            crash_at = crash_at or rng.choice(LANE_CRASH_POINTS)
        count = rng.randrange(2, 4)
        at = rng.randrange(count - 1) if window != "crash" else rng.randrange(count)
        first = self.next_checkpoint[V3]
        target = first + at
        # Each micro-batch inserts 1-2 keys above every key so far (a new-key proof can hold for them);
        # the other writer appends rows of the keys checkpoint `target` and the next one insert.
        batches: list[list[Row]] = []
        inserted: list[list[int]] = []
        for _ in range(count):
            keys = [self.new_key + i for i in range(rng.randrange(1, 3))]
            self.new_key += len(keys)
            inserted.append(keys)
        theirs = (
            [{"id": k, "v": f"other-{k}", "n": None, "lsn": None} for k in inserted[at] + inserted[at + 1]]
            if window == "other_writer"
            else []
        )
        for i in range(count):
            if i == at:
                for row in theirs:  # committed before checkpoint `target`, after the ones before it
                    self.models[V3][row["id"]] = dict(row)
            changes = self.batch(V3)
            for key in inserted[i]:
                self.lsn += 1
                changes.append({"id": key, "v": f"new{key}", "n": key, "lsn": self.lsn, "op": "I"})
            batches.append(changes)
            w.apply_cdc(self.models[V3], changes)
        for row in self.models[V3].values():
            for column, (_, write) in self.defaults.items():
                row.setdefault(column, write)
        w.log(
            f"v3: {V3} stream of {count} micro-batches on the commit lane (checkpoints {first}-{first + count - 1}, "
            f"new keys {inserted}); checkpoint {target}'s commit meets: {window}"
            + (f" at {crash_at}" if crash_at else "")
            + (f" (ids {[r['id'] for r in theirs]})" if theirs else "")
        )
        location = str(Path(w.root) / f"ckpt-{V3}")
        frames = [
            w.spark.createDataFrame(
                [tuple(c.get(k) for k in ("id", "v", "n", "lsn", "op")) for c in changes], DDL
            ).repartition(rng.choice([1, 2]))
            for changes in batches
        ]
        lanes: list[int] = []  # commits handed to the lane, per sink object (a restart makes a new one)

        def stream(restart: bool = False) -> Any:
            if restart:
                lanes.append(self.sinks[V3].metrics().overlapped_commits)
                self.remember_checkpoints(V3)
            sink = self.sink(V3, restart=restart)
            lanes.append(-sink.metrics().overlapped_commits)
            job = sink._job(location, ephemeral=False, streaming=True)
            job.backlog = lambda: True  # a source with records waiting: every commit goes on the lane
            return job

        beside, notes = self._lane_window(window, crash_at, target, last=first + count - 1, theirs=theirs)
        try:
            job, i = stream(), 0
            while i < count:
                try:
                    job.process(frames[i], first + i)
                    i += 1
                except Crash:  # the lane's commit died; the next commit (this micro-batch's) raised it
                    notes.append(f"died, micro-batch {first + i} replayed by a restarted sink")
                    job = stream(restart=True)
            try:
                job.commits.drain()  # what the stopped query's idle thread does (job/idle.py)
            except Crash:
                notes.append("died, the restarted sink committed what was stored")
                stream(restart=True).commit_pending()
        finally:
            _faults.clear()
        handed = sum(lanes) + self.sinks[V3].metrics().overlapped_commits
        if window == "crash" and not any("died" in n for n in notes):
            raise w.fail(f"v3: the lane's commit of checkpoint {target} did not die at {crash_at}: {notes}")
        self.stats["lane_commits"] += handed
        self.stats["lane_beside"] += bool(beside)
        self.stats[f"lane_{window}"] += 1
        self.next_checkpoint[V3] = first + count
        self.touched[V3] |= {c["id"] for changes in batches for c in changes} | {r["id"] for r in theirs}
        w.trace[-1] += f" -> {handed} commits on the lane; " + "; ".join(notes)
        self.check(V3)

    def _lane_window(
        self, window: str, crash_at: str | None, target: int, last: int, theirs: list[Row]
    ) -> tuple[list[int], list[str]]:
        """Install the fault handler by which checkpoint ``target``'s commit on the lane meets
        ``window``: on its first attempt it waits until the next micro-batch begins writing (when
        there is one), then acts. Returns the list it marks when the next micro-batch did write beside
        that commit, and the notes of what happened; the caller clears the handler."""
        w = self.world
        writing, beside, notes, done = threading.Event(), [], [], []

        def handler(point: str, cp: int) -> None:
            if point == _faults.BEFORE_WRITE and cp == target + 1:
                writing.set()
                return
            on_lane = threading.current_thread().name.startswith("iceberg-sink-commit")
            if cp != target or done or not on_lane or point != (crash_at or _faults.BEFORE_COMMIT_SEND):
                return
            done.append(cp)
            if target < last and writing.wait(LANE_BESIDE_S):
                beside.append(cp)
            if window == "crash":
                raise Crash(f"simulated driver death at {point} of checkpoint {cp}, on the commit lane")
            if window == "other_writer":
                other = IcebergSink.builder().catalog("model", **w.catalog_props).table(V3).build()
                rows = [tuple(r[k] for k in ("id", "v", "n", "lsn")) for r in theirs]
                other.write(w.spark.createDataFrame(rows, "id bigint not null, v string, n bigint, lsn bigint"))
                notes.append(f"another writer appended ids {[r['id'] for r in theirs]}")
            elif window == "expire":
                notes.append(w._expire(V3, retain_last=1))
            elif window == "compaction":
                maintenance = IcebergSink.builder().catalog("model", **w.catalog_props).table(V3).build()
                result = maintenance.compact(w.spark, CompactionConfig(min_input_files=1, delete_file_threshold=1))
                notes.append(f"compaction committed {result.committed_groups} groups")

        _faults.install(handler)
        return beside, notes

    def op_java_delete(self) -> None:
        """The newest Iceberg Java deletes live rows of db.v3 (merge-on-read: a DV of its own)."""
        live = sorted(self.models[V3])
        if not live or not self.world.catalog.table_exists(V3):
            self.op_cdc(V3)
            return
        keys = self.rng.sample(live, min(len(live), self.rng.randrange(1, 4)))
        self.world.log(f"v3: Iceberg Java deletes ids {sorted(keys)} of {V3} (merge-on-read)")
        table = self.world.table(V3)
        before = {dv.path for dv, _ in delete_files(table)}
        statements = []
        if table.properties.get("write.delete.mode") != "merge-on-read":
            statements.append("ALTER TABLE {t} SET TBLPROPERTIES ('write.delete.mode'='merge-on-read')")
        statements.append(f"DELETE FROM {{t}} WHERE id IN ({', '.join(map(str, keys))})")

        def delete(name: str) -> None:
            for statement in statements:
                self.world.java_newest.sql(statement.format(t=name))

        self.java_commit(delete)
        java_dvs = [dv for dv, _ in delete_files(self.world.table(V3)) if dv.path not in before]
        self.java_dvs |= {(dv.path, dv.content_offset) for dv in java_dvs}
        for key in keys:
            del self.models[V3][key]
        self.touched[V3] |= set(keys)
        # No DV when every row of the files it matched goes: Java then drops the files.
        self.world.trace[-1] += f" -> {len(java_dvs)} DV(s) of Java"
        self.stats["java_deletes"] += 1
        self.check(V3)

    def java_commit(self, change: Callable[[str], None]) -> None:
        """The newest Iceberg Java changes db.v3: its current metadata is registered in Java's JDBC
        catalog under a new name, ``change(name)`` commits there, and Java's commit lands in the
        model's catalog by a compare-and-swap of the table's catalog row (as a JDBC catalog sharing
        the database would commit)."""
        root = Path(self.world.root)
        java = self.world.java_newest
        if self.java_catalog is None:
            # A SQLite URI filename: its path is percent-decoded, so it is escaped (the world's folder
            # holds a literal %41 and a space: harness.WORLD_FOLDER).
            self.java_catalog = java.catalog(
                f"{root}/java-warehouse", jdbc_uri=f"jdbc:sqlite:file:{quote(f'{root}/java-catalog.db')}"
            )
        cat = self.java_catalog
        table = self.world.table(V3)
        if self.java_tables == 0:
            java.sql(f"CREATE NAMESPACE IF NOT EXISTS {cat}.db")
        self.java_tables += 1
        java.sql(
            f"CALL {cat}.system.register_table(table => 'db.t{self.java_tables}', metadata_file => '{table.metadata_location}')"
        )
        change(f"{cat}.db.t{self.java_tables}")
        with sqlite3.connect(root / "java-catalog.db") as con:
            [(written,)] = con.execute(
                "select metadata_location from iceberg_tables where table_name = ?", (f"t{self.java_tables}",)
            ).fetchall()
        with sqlite3.connect(root / "catalog.db") as con:
            swapped = con.execute(
                "update iceberg_tables set metadata_location = ?, previous_metadata_location = ? "
                "where table_namespace = 'db' and table_name = 'v3' and metadata_location = ?",
                (written, table.metadata_location, table.metadata_location),
            ).rowcount
        if swapped != 1:
            raise self.world.fail(f"v3: Java's commit of {V3} could not be swapped into the catalog")

    def op_java_default(self) -> None:
        """The newest Iceberg Java adds an int column with a default value to db.v3 (its
        ``UpdateSchema``; sometimes the write-default is then changed): the rows already there read
        the initial-default, and the sink's later checkpoints, whose batches never supply the column,
        write the write-default (writer/conform.py): the sink object that wrote before the change
        goes on writing after it. At most two such columns."""
        if not self.world.catalog.table_exists(V3) or len(self.defaults) >= 2:
            self.op_cdc(V3)
            return
        column = f"d{len(self.defaults)}"
        initial = self.rng.randrange(-(2**31), 2**31)
        write = initial if self.rng.random() < 0.5 else self.rng.randrange(-(2**31), 2**31)
        self.world.log(f"v3: Iceberg Java adds {column} int to {V3}, initial-default {initial}, write-default {write}")
        java = self.world.java_newest

        def add(name: str) -> None:
            java.column_default(name, column, "int", initial)
            if write != initial:
                java.column_default(name, column, "int", write, change=True)

        self.java_commit(add)
        self.defaults[column] = (initial, write)
        for row in self.models[V3].values():
            row[column] = initial
        self.stats["java_defaults"] += 1
        self.check(V3)

    def op_compaction(self) -> None:
        table = self.rng.choice([t for t in (V3, V2UP) if self.world.catalog.table_exists(t)] or [V3])
        if not self.world.catalog.table_exists(table):
            self.op_cdc(table)
            return
        config = CompactionConfig(min_input_files=self.rng.choice([1, 2]), delete_file_threshold=1)
        self.world.log(f"v3: compact {table} ({config.min_input_files=})")
        result = self.sink(table).compact(self.world.spark, config)
        self.world.trace[-1] += f" -> {result!r}"[:200]
        if result.committed_groups:
            self.stats["compactions"] += 1
        self.check(table)

    def op_upgrade(self) -> None:
        if self.upgraded_at is not None or not self.world.catalog.table_exists(V2UP):
            self.op_cdc(V2UP)
            return
        head = self.world.table(V2UP).current_snapshot()
        if head is None or int(head.summary.get("total-equality-deletes", "0") if head.summary else 0) == 0:
            self.op_cdc(V2UP)  # upgrade a table that holds equality deletes
            return
        self.world.log(f"v3: upgrade {V2UP} to format v3")
        upgraded = self.sink(V2UP).upgrade_format_version(3)
        if upgraded.metadata.format_version != 3:
            raise self.world.fail(f"v3: {V2UP} is format {upgraded.metadata.format_version} after the upgrade")
        self.upgraded_at = upgraded.metadata.last_sequence_number
        self.stats["upgrades"] += 1
        self.check(V2UP)

    def op_v2_conversion(self) -> None:
        """Convert db.v2up's equality deletes while it is still v2: file-scoped position delete files,
        which a later DV on their data file takes over and removes (check_deletes)."""
        if self.upgraded_at is not None or not self.world.catalog.table_exists(V2UP):
            return
        self.world.log(f"v3: convert the equality deletes of {V2UP} on v2")
        result = self.sink(V2UP).convert_equality_deletes()
        self.world.trace[-1] += f" -> {result!r}"[:200]
        self.stats["v2_position_files"] += result.added_position_delete_files
        self.check(V2UP)

    def op_conversion(self) -> None:
        if self.upgraded_at is None:
            self.op_upgrade()
            return
        self.world.log(f"v3: convert the equality deletes of {V2UP}")
        result = self.sink(V2UP).convert_equality_deletes()
        self.world.trace[-1] += f" -> {result!r}"[:200]
        head = self.world.table(V2UP).current_snapshot()
        left = head.summary.get("total-equality-deletes", "0") if head is not None and head.summary else "0"
        if left != "0":
            raise self.world.fail(f"v3: {V2UP} holds {left} equality deletes after its conversion: {result!r}")
        if result.snapshot_id is not None:
            self.stats["conversions"] += 1
        self.check(V2UP)

    # -- checks -----------------------------------------------------------------------------------------

    def remember_checkpoints(self, name: str) -> None:
        """Every sink checkpoint of the table is one snapshot, over the whole run."""
        for snap in self.world.table(name).metadata.snapshots:
            summary = snap.summary.additional_properties if snap.summary is not None else {}
            job, cp = summary.get(f"{PREFIX}.job-id"), summary.get(f"{PREFIX}.checkpoint-id")
            if job is not None and cp is not None:
                self.checkpoints[(name, job, cp)].add(snap.snapshot_id)
        doubled = {k: v for k, v in self.checkpoints.items() if len(v) > 1}
        if doubled:
            raise self.world.fail(f"v3: sink checkpoints committed as more than one snapshot: {doubled}")

    def check_all(self) -> None:
        for name in (V3, V2UP):
            if self.world.catalog.table_exists(name):
                self.check(name)

    def check(self, name: str) -> None:
        started = time.monotonic()
        self._check(name)
        self.seconds["checks"] += time.monotonic() - started

    def _check(self, name: str) -> None:
        w = self.world
        table = w.table(name)
        location = table.metadata_location
        if w.verified.get(name) == location:
            return
        self.remember_checkpoints(name)
        model = [dict(r) for r in self.models[name].values()]
        schema = SCHEMA
        if name == V3:
            for column in self.defaults:
                schema = schema.append(pa.field(column, pa.int32()))
        want = normalize(pa.Table.from_pylist(model, schema=schema), ["id"])
        head = table.current_snapshot()
        equality_live = (
            head is not None and head.summary is not None and head.summary.get("total-equality-deletes", "0") != "0"
        )
        # The newest Java's read with the lineage columns, once rows have them (one request for both).
        lineage = None
        if table.metadata.format_version == 3 and head is not None and head.first_row_id is not None:
            lineage = w.java_newest.row_lineage(location)
        try:
            javas = (w.java,) if lineage is not None else (w.java, w.java_newest)
            # DuckDB 1.5.5's file cache misreads a small DV packed after a larger one (docs/format-v3.md).
            assert_readers_agree(
                javas, location, want, ["id"], duckdb_file_cache=self.layout_of(name) != "one-per-commit"
            )
            if lineage is not None:
                got = normalize(lineage.select(schema.names), ["id"])
                assert got == want, f"the newest Iceberg Java read {got}"
            if not equality_live:  # PyIceberg reads DVs and position deletes, not equality deletes
                got = normalize(pyiceberg_read(location).select(schema.names), ["id"])
                assert got == want, f"PyIceberg read {len(got)} rows, the model has {len(want)}"
        except AssertionError as exc:
            raise w.fail(f"v3: {name} differs from its model: {exc}") from exc
        if table.metadata.format_version == 3:
            self.check_deletes(name, table)
        if lineage is not None:
            self.check_lineage(name, table, lineage)
        elif name == V3:
            raise w.fail(f"v3: {V3} is format {table.metadata.format_version}")
        w.verified[name] = location

    def layout_of(self, name: str) -> str:
        """The Puffin layout of table ``name``'s DVs (db.v2up: always the default)."""
        return (self.layout if name == V3 else None) or "one-per-commit-spaced"

    def check_deletes(self, name: str, table: Table) -> None:
        """DVs only (on db.v2up: those committed after the upgrade), at most one per live data file,
        and a DV that stays on a data file keeps every position it had (merged, never lost)."""
        w = self.world
        for snap in table.metadata.snapshots:
            if name == V3 and snap.summary is not None and snap.summary.get("total-equality-deletes", "0") != "0":
                raise w.fail(f"v3: {V3} snapshot {snap.snapshot_id} holds equality deletes")
        live = set(table.inspect.files()["file_path"].to_pylist())
        dvs: dict[str, tuple[tuple[str, int | None], int, bool]] = {}
        sizes: dict[tuple[str, int | None], int] = {}  # each DV's length, by (Puffin file, offset)
        file_scoped: dict[str, str] = {}  # v2 position delete file -> the one data file it names
        for meta, sequence in delete_files(table):
            if meta.file_format != "PUFFIN" or meta.referenced_data_file is None:
                if name == V2UP and self.upgraded_at is not None and sequence <= self.upgraded_at:
                    # A v2 delete file from before the upgrade: it stays, as in Iceberg Java, unless it
                    # is a file-scoped position delete file whose data file has a DV (below).
                    target = position_deletes.referenced_data_file(meta)
                    if target is not None:
                        file_scoped[meta.path] = target
                    continue
                raise w.fail(f"v3: {name} holds a delete file that is not a DV: {meta.path} ({meta.content!r})")
            target = meta.referenced_data_file
            if target in dvs:
                raise w.fail(f"v3: {name} holds two DVs of data file {target}")
            if target not in live:
                raise w.fail(f"v3: {name} holds a DV of data file {target}, which is not live")
            at = (meta.path, meta.content_offset)
            dvs[target] = (at, meta.record_count, at in self.java_dvs)
            sizes[at] = meta.content_size_in_bytes or 0
        sharing = collections.Counter(at[0] for at, _, java in dvs.values() if not java)
        shared = sum(1 for n in sharing.values() if n > 1)
        if shared and self.layout_of(name) == "one-per-vector":
            raise w.fail(f"v3: {name} holds a Puffin file of the sink with several DVs: {sharing.most_common(1)}")
        if self.layout_of(name) == "one-per-commit-spaced":
            by_file: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
            for at, _, java in dvs.values():
                if not java:
                    by_file[at[0]].append((at[1] or 0, sizes[at]))
            for path, blobs in by_file.items():
                for (offset, size), (after, _) in itertools.pairwise(sorted(blobs)):
                    if after - (offset + size) <= size:
                        raise w.fail(
                            f"v3: {name}'s Puffin file {path} holds a DV of {size} bytes at {offset} followed "
                            f"by another at {after}: expected more than {size} zero bytes between them"
                        )
        self.stats["shared_puffins"] = max(self.stats["shared_puffins"], shared)
        for path, target in file_scoped.items():
            if target in dvs:
                raise w.fail(f"v3: {name}'s position delete file {path} stays beside the DV of its data file {target}")
        gone = {p: t for p, t in self.file_scoped.get(name, {}).items() if p not in file_scoped}
        self.stats["position_files_retired"] += sum(1 for t in gone.values() if t in dvs)
        self.file_scoped[name] = file_scoped
        for target, (at, count, _) in dvs.items():
            old = self.dvs[name].get(target)
            if old is None or old[0] == at:
                continue
            if count < old[1]:
                raise w.fail(f"v3: the DV of {target} in {name} went from {old[1]} positions to {count}")
            if dvs[target][2]:
                self.stats["java_merged_a_dv"] += 1  # Java's DELETE merged a DV already there
            elif old[2]:
                self.stats["java_dv_merges"] += 1  # the sink merged Java's DV
            else:
                self.stats["dv_merges"] += 1  # the sink merged its own
        self.dvs[name] = dvs

    def check_lineage(self, name: str, table: Table, read: pa.Table) -> None:
        """Row lineage as the newest Iceberg Java reads it (from the first commit on v3: an upgraded
        table's rows get their ids from the next commit): every row has a row id, ids are unique,
        and rows no step touched keep their id and sequence number."""
        w = self.world
        lineage = {
            r["id"]: (r["_row_id"], r["_last_updated_sequence_number"])
            for r in read.select(["id", "_row_id", "_last_updated_sequence_number"]).to_pylist()
        }
        ids = [row_id for row_id, _ in lineage.values()]
        if None in ids or any(s is None for _, s in lineage.values()) or len(set(ids)) != len(ids):
            raise w.fail(f"v3: {name} row lineage has missing or repeated row ids: {lineage}")
        if max(ids, default=-1) >= table.metadata.next_row_id:
            raise w.fail(f"v3: {name} has a row id at or above next-row-id {table.metadata.next_row_id}")
        before = self.lineage[name]
        if before is not None:
            moved = {
                k: (before[k], v)
                for k, v in lineage.items()
                if k in before and k not in self.touched[name] and before[k] != v
            }
            if moved:
                raise w.fail(f"v3: {name} rows no step touched changed lineage (before, after): {moved}")
        self.lineage[name] = lineage
        self.touched[name] = set()


def tables(world: Any) -> V3Tables:
    found = getattr(world, "_v3_tables", None)
    if found is None:
        found = world._v3_tables = V3Tables(world)
    return found  # type: ignore[no-any-return]


def step(world: Any, kind: str) -> None:
    """Run one of OPERATIONS (called by the harness for these kinds)."""
    job = tables(world)
    {
        "v3_cdc": job.op_cdc,
        # A quarter of Java's steps add a column with a default instead (a draw of the v3 generator:
        # every seed keeps its sequence of operations).
        "v3_java_delete": job.op_java_default if job.rng.random() < JAVA_DEFAULT_SHARE else job.op_java_delete,
        "v3_compaction": job.op_compaction,
        "v3_upgrade": job.op_upgrade,
        "v3_convert": job.op_conversion,
        "v3_lane": job.op_lane,
    }[kind]()


def check(world: Any) -> None:
    """After any step: the v3 tables that changed (they change only in their own steps)."""
    job = getattr(world, "_v3_tables", None)
    if job is not None:
        job.check_all()
