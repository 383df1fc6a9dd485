"""The names the stages agree on: the columns the sink adds to a batch (never stored in a table),
the operation codes, the marker of refusals raised inside Spark, and the column metadata that lets an
op column carry truncates.

Every layer reads these (sources mark refusals and truncates, the change reduction writes the op
column, writer tasks read it, the driver recognises refusals by the marker); they live here, below
all of them.
"""

from __future__ import annotations

INSERT_CODES = ("I", "insert", "c", "r", "+I")
UPDATE_CODES = ("U", "update", "u", "+U")
UPDATE_BEFORE_CODES = ("UB", "update_before", "-U")
DELETE_CODES = ("D", "delete", "d", "-D")
TRUNCATE_CODES = ("t", "truncate")

#: The normalised operation column the writers receive: "I", "U", "D" or "T" (a truncate marker).
OP_COLUMN = "__iceberg_sink_op"
#: The operation of a truncate marker row (:data:`OP_COLUMN`).
TRUNCATE_OP = "T"
#: Metadata key of an op column that may hold truncates: set by the Debezium reader under
#: ``truncate="apply"`` (:func:`carries_truncates`). Elsewhere ``t`` is an unknown code (refused), and
#: a batch pays no search for truncates.
TRUNCATES_METADATA = "iceberg_sink.truncates"
#: Marks errors raised inside Spark so the driver can report them as InvalidInputError.
ERROR_MARKER = "iceberg_sink invalid input:"

#: The column that carries a row's refusal (null for a good row; sources/rejects.py).
REJECT_COLUMN = "__iceberg_sink_reject"
#: Columns of a row still holding a TOAST placeholder and the event it was read from (null when none;
#: sources/toast.py ``MARKER_TYPE``).
UNAVAILABLE_COLUMN = "__iceberg_sink_unavailable"
#: The column holding each row's (namespace-qualified) table name between routing and the writers.
ROUTE_COLUMN = "__iceberg_sink_table"
#: The source table of a Debezium event (``db.schema.table``; sources/source_names.py), kept beside a
#: routed row so the routed job can hold each table to one source (job/routing.py). Never stored.
SOURCE_COLUMN = "__iceberg_sink_source"
#: The columns the sink adds to a batch for its own use: never stored in a table.
MARK_COLUMNS = (REJECT_COLUMN, UNAVAILABLE_COLUMN, SOURCE_COLUMN)

#: A batch whose changes its writer tasks reduce (writer/key_runs.py) carries, sorted within each Spark
#: partition by them: a copy of each key column (``RUN_KEY_PREFIX`` and its position in the key), the
#: arrival number of a row that is a group of its own (:data:`RUN_ALONE_COLUMN`: a refused row or a
#: truncate marker; null for a change) and a 64-bit hash of the key (:data:`RUN_HASH_COLUMN`). The
#: writer tasks drop them (the batch plan's ``reduced_in_writers`` tells the other stages).
RUN_KEY_PREFIX = "__iceberg_sink_run_key_"
RUN_ALONE_COLUMN = "__iceberg_sink_run_alone"
RUN_HASH_COLUMN = "__iceberg_sink_run_hash"
