"""The model check's Debezium job (issue 18): events drawn from a generator of hostile values.

Kept out of harness.py (other engineers edit it): the harness calls :func:`maybe_step` between steps,
with a generator of its own (so every seed's sequence of the other operations is kept); skip it with
``ICEBERG_SINK_MODEL_SKIP=debezium_cdc``.

Each step writes one batch of Debezium envelopes (with or without the ``schema`` part) to ``db.dbz``
through ``.debezium(table_column=None, truncate="fail" | "skip" | "apply")``: creates, updates and deletes,
key-only deletes whose ``before`` holds JSON nulls, a NUMERIC(10,2) as Connect's Decimal and a
Debezium Date, message events and the connector's schema changes, transaction boundaries and
heartbeats (skipped), truncates (under ``"apply"`` the model table is emptied at
that point of the batch's change order; under ``"skip"`` ignored), updates whose note is Debezium's
unavailable-value placeholder without a before value (an unchanged TOASTed column: the key keeps its
note, from an earlier change of the batch or the table), and sometimes one hostile event: a value that does not fit
its declared type (int32 3000000000, boolean "yes", bad base64 for a decimal, float32 1e40), a
truncate under ``truncate="fail"``, an update without ``after``, a value that is not JSON, an order
value that is not a long. Some jobs order by binlog position as MariaDB's and MySQL's connectors do
(``source.file``, ``pos``, ``row`` with ``order_type=["binlog", "long", "long"]``): every batch's file
number passes a power of ten after its third event (``mysql-bin.999999`` -> ``mysql-bin.1000000``, which
sorts first as text); their hostile order value is a file name without a number. A batch with a hostile event must fail with InvalidInputError naming the
reason and change nothing; any other batch must leave the table equal to the model, read back by
Iceberg Java and DuckDB. Most steps write through the sink of the step before, so a batch is often
planned on the statistics of the last one and read again when one of its events differs.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import random
from decimal import Decimal
from pathlib import Path
from typing import Any

from iceberg_sink import IcebergSink, InvalidInputError
from iceberg_sink.sources.debezium import UNAVAILABLE_VALUE
from tests.interop.readers import duckdb_read, normalize

DEBEZIUM = "debezium_cdc"
DEBEZIUM_EVERY = 0.15
TABLE = "db.dbz"
KEYS = 12
TOAST_SHARE = 0.3  # of updates: the note is an unchanged TOASTed value (docs/cdc.md)
# A name Spark would substitute in SQL text (``${x}`` reads as ""), and a decoy named as that reads.
NOTE, DECOY = "note ${x}'", "note '"
COLUMNS = ["id", "qty", "price", "day", "ok", "ratio", NOTE, DECOY, "lsn"]
# The events' column is named with a dot, beside a struct whose field that name would select as a
# path: the decoy holds a value that is no event (read, it fails the batch as "value is not JSON").
VALUE = "kafka.value"
FRAME_DDL = "`kafka.value` string, kafka struct<value: string>"

_ROW = [
    {"type": "int64", "optional": False, "field": "id"},
    {"type": "int32", "optional": True, "field": "qty"},
    {
        "type": "bytes",
        "optional": True,
        "field": "price",
        "name": "org.apache.kafka.connect.data.Decimal",
        "parameters": {"scale": "2", "connect.decimal.precision": "10"},
    },
    {"type": "int32", "optional": True, "field": "day", "name": "io.debezium.time.Date"},
    {"type": "boolean", "optional": True, "field": "ok"},
    {"type": "float", "optional": True, "field": "ratio"},
    {"type": "string", "optional": True, "field": NOTE},
    {"type": "string", "optional": True, "field": DECOY},
]

# (what the hostile event is, the refusal's text)
HOSTILE = [
    ("qty", "which does not fit its declared type int32"),
    ("ok", "which does not fit its declared type boolean"),
    ("price", "which does not fit its declared type bytes org.apache.kafka.connect.data.Decimal"),
    ("ratio", "which does not fit its declared type float"),
    ("truncate", "truncate event (op 't') refused"),
    ("no_after", "update without after"),
    ("not_json", "value is not JSON"),
    # The whole value is checked to be JSON only for an event whose payload is no object
    # (sources/envelope.py): JSON that is no object, and a value whose payload is whole but whose text
    # is cut short after it, are refused all the same.
    ("not_object", "value is not a JSON object"),
    ("cut_after_payload", "value is not JSON"),
    ("order", "order value 'abc' at source.lsn is not a long"),
]
BINLOG_HOSTILE = "order value 'abc' at source.file is not a binlog file name"


def _decimal(value: Decimal) -> str:
    unscaled = int(value.scaleb(2))
    size = max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(size, "big", signed=True)).decode()


class DebeziumJob:
    """The job's generator, model and sink; one per World."""

    def __init__(self, seed: int, catalog_props: dict[str, str], root: Path, created_format: int = 3) -> None:
        self.rng = random.Random(f"debezium-{seed}")
        self.created_format = created_format  # db.dbz's format (World.created_format: v2 or v3, per seed)
        self.catalog_props = catalog_props
        self.checkpoint = str(root / "ckpt-debezium")
        self.model: dict[int, dict[str, Any]] = {}
        self.lsn = 0
        self.truncate = self.rng.choice(["fail", "skip", "apply"])
        self.truncate_every = 0.1  # under "apply": the chance of a truncate after each change
        # Per job, as per connector: with the schema part (types declared, logical types mapped) or
        # without it (schemas.enable=false: types inferred, a key-only delete's nulls say nothing).
        self.schema = self.rng.random() < 0.6
        # Per job, as per connector: PostgreSQL's lsn or a binlog position (MariaDB, MySQL). From a
        # generator of its own, so that seeds keep their sequences.
        self.binlog = random.Random(f"debezium-binlog-{seed}").random() < 0.5
        self.batches = 0
        self.batch_start = 0  # the lsn before the batch's first event
        # Per step: the same sink as the step before (its reader plans a batch on the last batch's
        # statistics when those were plain, and reads it again when an event differs) or a new one
        # (a restarted job: the batch is counted). From a generator of its own, so seeds keep their sequences.
        self.reuse = random.Random(f"debezium-reuse-{seed}")
        self.fresh_share = 0.3
        self._sink: IcebergSink | None = None
        self.toast_share, self.hostile_share = TOAST_SHARE, 0.35

    def sink(self) -> IcebergSink:
        if self._sink is None or self.reuse.random() < self.fresh_share:
            self._sink = self.build()
        return self._sink

    def build(self) -> IcebergSink:
        return (
            IcebergSink.builder()
            .catalog("model", **self.catalog_props)
            .table(TABLE)
            .create_if_missing(format_version=self.created_format)
            .debezium(value_column=VALUE, table_column=None, truncate=self.truncate, **self.order())
            .cdc(op_column="op", key=["id"], order_by="lsn")
            .schema_evolution("add-columns")
            .build()
        )

    def order(self) -> dict[str, Any]:
        """The reader's order arguments: the lsn, or the binlog position, into the column ``lsn``."""
        if not self.binlog:
            return {}
        return {"order_by": ["source.file", "source.pos", "source.row"], "order_type": ["binlog", "long", "long"]}

    def binlog_position(self) -> tuple[int, int, int]:
        """The current event's binlog file number, position and row: in batch b the file number goes
        from 10**d - 1 to 10**d after the third event (d = 6 + b, up to 17; later batches keep 18
        digits), so it grows over the stream and every batch of four events or more crosses a power
        of ten; two rows per position."""
        offset = self.lsn - self.batch_start - 1
        digits = 6 + self.batches
        low = 10**digits - 1 if digits < 18 else 10**17 + 2 * self.batches
        return low + (offset >= 3), 4 + 100 * (offset // 2), offset % 2

    def source(self) -> dict[str, Any]:
        """The event's source position: the lsn, or a binlog position (:meth:`binlog_position`)."""
        if not self.binlog:
            return {"lsn": self.lsn}
        file, pos, row = self.binlog_position()
        return {"file": f"mysql-bin.{file:06d}", "pos": pos, "row": row}

    def stored_order(self) -> Any:
        """What the table's order column holds for the current event."""
        if not self.binlog:
            return self.lsn
        return dict(zip(("source_file", "source_pos", "source_row"), self.binlog_position(), strict=True))

    def row(self, key: int) -> dict[str, Any]:
        rng = self.rng
        return {
            "id": key,
            "qty": None if rng.random() < 0.2 else rng.randrange(-(2**31), 2**31),
            "price": None if rng.random() < 0.2 else Decimal(rng.randrange(-(10**10) + 1, 10**10)).scaleb(-2),
            "day": None if rng.random() < 0.2 else dt.date(2024, 1, 1) + dt.timedelta(days=rng.randrange(-800, 800)),
            "ok": None if rng.random() < 0.2 else rng.random() < 0.5,
            "ratio": None if rng.random() < 0.2 else rng.randrange(-400, 400) / 4,
            NOTE: None if rng.random() < 0.2 else rng.choice(["a", "b_c", "日本", "x" * 40, "${env:HOME}"]),
            DECOY: f"decoy {key}",
        }

    def envelope(self, op: str, before: dict[str, Any] | None, after: dict[str, Any] | None, schema: bool) -> str:
        def wire(image: dict[str, Any] | None) -> dict[str, Any] | None:
            if image is None:
                return None
            out = dict(image)
            if isinstance(out.get("price"), Decimal):
                out["price"] = _decimal(out["price"])
            if isinstance(out.get("day"), dt.date):
                out["day"] = (out["day"] - dt.date(1970, 1, 1)).days
            return out

        self.lsn += 1
        payload = {
            "before": wire(before),
            "after": wire(after),
            "op": op,
            "source": {"db": "shop", "schema": "public", "table": "items", **self.source()},
        }
        if not schema:
            return json.dumps(payload)
        row = {"type": "struct", "fields": _ROW, "optional": True}
        envelope = {"type": "struct", "fields": [{**row, "field": "before"}, {**row, "field": "after"}]}
        return json.dumps({"schema": envelope, "payload": payload})

    def skipped_event(self, schema: bool) -> str:
        """An event the sink skips: a message event, or one the connector sends on topics of its own
        that a subscription to its prefix reads too (a schema change, a transaction boundary, a
        heartbeat). Picked from the lsn, not the generator, so that seeds keep their sequences."""
        kind = (self.lsn + 1) % 4
        if kind == 0:
            return self.envelope("m", None, None, schema)  # a message event
        self.lsn += 1
        if kind == 1:
            name = "io.debezium.connector.mariadb.SchemaChangeValue"
            source = {"db": "shop", "table": "items", **self.source()}
            payload: dict[str, Any] = {"source": source, "ts_ms": self.lsn, "databaseName": "shop", "ddl": "ALTER"}
            payload["tableChanges"] = [{"type": "ALTER", "id": '"shop"."items"'}]
        elif kind == 2:
            name = "io.debezium.connector.common.TransactionMetadataValue"
            payload = {"status": "BEGIN" if self.lsn % 8 < 4 else "END", "id": str(self.lsn), "ts_ms": self.lsn}
        else:
            name, payload = "io.debezium.connector.common.Heartbeat", {"ts_ms": self.lsn}
        if not schema:
            return json.dumps(payload)
        return json.dumps({"schema": {"type": "struct", "fields": [], "name": name}, "payload": payload})

    @staticmethod
    def inferred(row: dict[str, Any]) -> dict[str, Any]:
        """A row as a table created from schemaless events holds it: the wire values, types inferred
        (the decimal's base64 text, the date's day number)."""
        out = dict(row)
        if isinstance(out.get("price"), Decimal):
            out["price"] = _decimal(out["price"])
        if isinstance(out.get("day"), dt.date):
            out["day"] = (out["day"] - dt.date(1970, 1, 1)).days
        return out

    def hostile(self, kind: str) -> str:
        key = self.rng.randrange(KEYS)
        good = self.row(key)
        wrong: dict[str, Any] = {"qty": 3_000_000_000, "ok": "yes", "price": "!!not base64", "ratio": 1e40}
        if kind in wrong:
            text = self.envelope("c", None, good, schema=True)
            doc = json.loads(text)
            doc["payload"]["after"][kind] = wrong[kind]
            return json.dumps(doc)
        if kind == "truncate":
            return self.envelope("t", None, None, schema=self.schema)
        if kind == "no_after":
            return self.envelope("u", {"id": key}, None, schema=self.schema)
        if kind == "not_json":
            return '{"payload": {"op": "c", "after": {"id": 1'
        if kind == "not_object":  # an envelope inside an array
            return json.dumps([json.loads(self.envelope("c", None, good, schema=self.schema))])
        if kind == "cut_after_payload":
            return self.envelope("c", None, good, schema=self.schema)[:-1] + ', "tail": }'
        doc = json.loads(self.envelope("c", None, good, schema=False))
        doc["source"]["file" if self.binlog else "lsn"] = "abc"
        return json.dumps(doc)

    def step(self, world: Any) -> None:
        """One batch; checks the outcome against the model (raises world.fail(...) on a mismatch)."""
        rng = self.rng
        schema = self.schema
        live = dict(self.model)
        self.batches += 1
        self.batch_start = self.lsn
        values: list[str | None] = []
        for _ in range(rng.randrange(1, 10)):
            key = rng.randrange(KEYS)
            r = rng.random()
            if r < 0.3 and key in live:
                # A key-only delete (PostgreSQL's default replica identity): JSON nulls beside the key.
                before = {c: None for c in COLUMNS if c != "lsn"} | {"id": key} if rng.random() < 0.5 else {"id": key}
                values.append(self.envelope("d", before, None, schema))
                live.pop(key)
            elif r < 0.35:
                values.append(self.skipped_event(schema))
            else:
                row = self.row(key)
                # The before image is the source row: without the sink's order column (lsn).
                before = {c: v for c, v in live[key].items() if c != "lsn"} if key in live else None
                # An unchanged TOASTed note under REPLICA IDENTITY DEFAULT: the placeholder, no before
                # value; the key keeps its note (from this batch or the table).
                toasted = key in live and rng.random() < self.toast_share
                if toasted:
                    row[NOTE], before = UNAVAILABLE_VALUE, {"id": key}
                values.append(self.envelope("u" if key in live else "c", before, row, schema))
                kept = live[key].get(NOTE) if toasted else None
                live[key] = {**(row if schema else self.inferred(row)), "lsn": self.stored_order()}
                if toasted:
                    live[key][NOTE] = kept
            if rng.random() < 0.2:
                values.append(None)  # a tombstone
            if self.truncate == "apply" and rng.random() < self.truncate_every:
                # TRUNCATE on the source: every change before it (earlier lsn) is gone, those after stay.
                values.append(self.envelope("t", None, None, schema))
                live.clear()
        if self.truncate == "skip" and rng.random() < 0.3:
            values.insert(rng.randrange(len(values) + 1), self.envelope("t", None, None, schema))
        bad = None
        if rng.random() < self.hostile_share:
            typed = ("qty", "ok", "price", "ratio")  # declared types exist only with the schema part
            bad = rng.choice(
                [
                    h
                    for h in HOSTILE
                    if not (h[0] == "truncate" and self.truncate != "fail") and (schema or h[0] not in typed)
                ]
            )
            values.insert(rng.randrange(len(values) + 1), self.hostile(bad[0]))
            if bad[0] == "order" and self.binlog:
                bad = (bad[0], BINLOG_HOSTILE)
        world.log(
            f"debezium_cdc: {len(values)} events, schema part {schema}, truncate={self.truncate}, "
            f"{'binlog' if self.binlog else 'lsn'} order, hostile {bad}"
        )
        decoy = ("decoy: not an event",)
        df = world.spark.createDataFrame([(v, decoy) for v in values], FRAME_DDL).repartition(rng.choice([1, 2]))
        sink = self.sink()
        if bad is not None:
            try:
                sink.write(df, checkpoint_location=self.checkpoint)
            except InvalidInputError as e:
                if bad[1] not in str(e):
                    raise world.fail(f"debezium_cdc: refusal {bad} expected, received: {e}") from e
            else:
                raise world.fail(f"debezium_cdc: hostile event {bad} was written")
        else:
            sink.write(df, checkpoint_location=self.checkpoint)
            self.model = live
        self.verify(world)

    def verify(self, world: Any) -> None:
        if not world.catalog.table_exists(TABLE):
            if self.model:
                raise world.fail(f"debezium_cdc: {TABLE} missing, model holds {sorted(self.model)}")
            return
        location = world.catalog.load_table(TABLE).metadata_location
        columns = [c for c in COLUMNS if c in world.catalog.load_table(TABLE).schema().column_names]
        want = sorted(({c: row.get(c) for c in columns} for row in self.model.values()), key=lambda r: r["id"])
        for reader, read in (("Iceberg Java", world.java.read), ("DuckDB", duckdb_read)):
            got = normalize(read(location).select(columns), ["id"])
            if got != want:
                raise world.fail(f"debezium_cdc: {TABLE} read by {reader}:\n  got  {got}\n  want {want}")


def maybe_step(world: Any) -> None:
    """Called by the harness between steps: run the Debezium job with probability DEBEZIUM_EVERY."""
    job = getattr(world, "_debezium_job", None)
    if job is None:
        job = DebeziumJob(world.seed, world.catalog_props, Path(world.root), world.created_format)
        world._debezium_job = job
    if job.rng.random() < DEBEZIUM_EVERY:
        job.step(world)
