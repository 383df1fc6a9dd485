"""DuckDB 1.5.5 as a writer: its iceberg extension ATTACHes an Iceberg REST catalog and runs SQL
(INSERT, UPDATE, DELETE) against its tables, committing through the catalog as any engine does.

The extensions (iceberg, avro, parquet, httpfs) come from the PyPI duckdb-extension-* packages, as
for the readers (``readers.duckdb_connect``), never downloaded. The catalog's OAuth2 client
credential (``credential = id:secret``) becomes an ``iceberg`` secret, the S3 FileIO keys an ``s3``
secret for every bucket. On a format v3 table DuckDB's DELETE and UPDATE write deletion vectors
(one Puffin file per statement, ``<uuid>-deletes.puffin``, under the table's data location).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tests.interop.readers import duckdb_connect, httpfs_extension

CATALOG_ALIAS = "rest_cat"
"""The name the attached catalog has in DuckDB SQL: ``rest_cat.<namespace>.<table>``."""


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def duckdb_rest_connect(props: Mapping[str, str]) -> Any:
    """A DuckDB connection with the REST catalog of PyIceberg properties ``props`` (``uri``,
    ``warehouse``, ``credential``, ``oauth2-server-uri`` and the ``s3.*`` keys) attached as
    ``CATALOG_ALIAS``."""
    con = duckdb_connect()
    try:
        con.load_extension(str(httpfs_extension()))
        con.execute(
            "CREATE SECRET rest_s3 (TYPE s3, KEY_ID ?, SECRET ?, REGION ?, ENDPOINT ?, URL_STYLE 'path', USE_SSL false)",
            [
                props["s3.access-key-id"],
                props["s3.secret-access-key"],
                props.get("s3.region", "us-east-1"),
                props["s3.endpoint"].removeprefix("http://"),
            ],
        )
        client_id, client_secret = props["credential"].split(":", 1)
        # CREATE SECRET and ATTACH take no prepared parameters: the values are quoted literals.
        con.execute(
            f"CREATE SECRET rest_oauth (TYPE iceberg, CLIENT_ID {_quote(client_id)}, "
            f"CLIENT_SECRET {_quote(client_secret)}, OAUTH2_SERVER_URI {_quote(props['oauth2-server-uri'])})"
        )
        warehouse = props["warehouse"].removeprefix("s3://")
        con.execute(
            f"ATTACH {_quote(warehouse)} AS {CATALOG_ALIAS} "
            f"(TYPE iceberg, ENDPOINT {_quote(props['uri'])}, SECRET rest_oauth)"
        )
    except BaseException:
        con.close()
        raise
    return con


def duckdb_rest_execute(props: Mapping[str, str], statements: Sequence[str]) -> list[list[tuple[Any, ...]]]:
    """Run ``statements`` in order on a fresh connection to the REST catalog (each in its own
    transaction, so each commits before the next runs); returns each one's rows."""
    con = duckdb_rest_connect(props)
    try:
        return [con.execute(statement).fetchall() for statement in statements]
    finally:
        con.close()
