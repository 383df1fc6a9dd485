"""Catalog property values in messages: only type, warehouse and a uri without user info and query
are shown (table/catalog.py); every other value, and each part of it that could be shown alone, is
masked wherever a catalog's own error text repeats it."""

from __future__ import annotations

from urllib.parse import quote

from iceberg_sink.table.catalog import CatalogConfig, redact, scrub

BEARER_TOKEN = "eyJhbGciOiJIUzI1NiJ9.dG9rZW4tc2VjcmV0.c2lnbmF0dXJl"
ACCOUNT_KEY = "QUNDT1VOVEtFWS1zZWNyZXQtdmFsdWU="
QUERY_PASSWORD = "Query-Pass-4711"
USER_PASSWORD = "User:Pass-0815"
PROPS = {
    "type": "rest",
    "uri": f"https://sink:{quote(USER_PASSWORD, safe='')}@rest.example:8181/api?token={QUERY_PASSWORD}",
    "warehouse": "s3://lake/wh",
    "header.Authorization": f"Bearer {BEARER_TOKEN}",
    "adls.connection-string": f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={ACCOUNT_KEY};x=y",
    "s3.endpoint": "http://minio.internal:9000",
}
SECRETS = [BEARER_TOKEN, ACCOUNT_KEY, QUERY_PASSWORD, USER_PASSWORD, quote(USER_PASSWORD, safe="")]


def test_redact_shows_only_the_allow_listed_keys() -> None:
    shown = redact(PROPS)
    assert shown == {
        "type": "rest",
        "uri": "https://***@rest.example:8181/api (query cut)",
        "warehouse": "s3://lake/wh",
        "header.Authorization": "***",
        "adls.connection-string": "***",
        "s3.endpoint": "***",
    }
    text = repr(CatalogConfig("c", PROPS))
    assert not [s for s in SECRETS if s in text], text


def test_scrub_masks_every_value_and_each_part_of_one_in_a_catalogs_error() -> None:
    error = (
        f"GET {PROPS['uri']} failed: 401 for Authorization: Bearer {BEARER_TOKEN}; "
        f"the account key {ACCOUNT_KEY} (url-encoded {quote(ACCOUNT_KEY, safe='')}) was refused; "
        f"user password {USER_PASSWORD}; endpoint {PROPS['s3.endpoint']}"
    )
    scrubbed = scrub(error, PROPS)
    assert not [s for s in [*SECRETS, quote(ACCOUNT_KEY, safe=""), "minio.internal"] if s in scrubbed], scrubbed
    assert "rest.example:8181/api" in scrubbed and "failed: 401" in scrubbed
