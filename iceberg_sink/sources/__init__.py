"""Sources: turning what arrives (JSON strings, Debezium envelopes) into rows the sink can write.

readers.py parses JSON values against a schema (with inference for schemaless input);
debezium.py turns Debezium change events into rows with an op column for ``.cdc``; rejects.py is the
one column a refused row carries until the job fails the batch or dead-letters it; toast.py marks
the columns holding Debezium's unavailable-value placeholder; bare_types.py settles the types of
events without a schema part (on the table's, while the sink reads a batch for it) and refuses the
values that do not fit. They run before
the pre-write topology and never touch the table.
"""
