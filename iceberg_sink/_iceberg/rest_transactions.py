"""Several tables' commits in one request to a REST catalog: the REST specification's
``POST /v1/{prefix}/transactions/commit``, which PyIceberg 0.12 does not call.

The catalog applies every table's requirements and updates together or refuses them all (HTTP 409).
Servers do not reliably advertise the endpoint in ``/v1/config`` (SeaweedFS 4.48 and Nessie 0.99
implement it without listing it), so :func:`supports_transactions` asks the server once per catalog
object with an empty transaction: an answer other than "not found" / "not allowed" / "not
implemented" means the route exists. The request carries an ``Idempotency-Key`` (the REST
specification's header, Iceberg 1.11+), a digest of the request itself: a server that honours it
answers a retried identical request without applying it twice; the sink never relies on it (a
member whose outcome is unknown looks for its own snapshot, ``_iceberg/retry.py``).
"""

from __future__ import annotations

import hashlib
import json
import threading
import weakref
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.catalog.rest.response import _handle_non_200_response
from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException
from pyiceberg.table import CommitTableRequest, CommitTableResponse, Table, TableIdentifier
from requests import HTTPError

from iceberg_sink import _faults

_ENDPOINT = "transactions/commit"
#: Answers to an empty transaction that say the server has no such route.
_NO_ROUTE = frozenset({404, 405, 501})
_known: weakref.WeakKeyDictionary[Catalog, bool] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def supports_transactions(catalog: Catalog) -> bool:
    """Whether ``catalog`` is a REST catalog that serves ``transactions/commit`` (asked once per
    catalog object; an unreachable server is asked again next time)."""
    if not isinstance(catalog, RestCatalog):
        return False
    with _lock:
        known = _known.get(catalog)
    if known is not None:
        return known
    try:
        response = catalog._session.post(catalog.url(_ENDPOINT, prefixed=True), data=b'{"table-changes": []}')
    except Exception:
        return False
    answer = response.status_code not in _NO_ROUTE
    with _lock:
        _known[catalog] = answer
    return answer


def commit_together(commits: list[tuple[Table, tuple[Any, ...], tuple[Any, ...]]]) -> list[CommitTableResponse]:
    """Send each ``(table, requirements, updates)`` of one REST catalog in one transaction; returns
    each table as the catalog has it afterwards (the endpoint answers 204 without metadata).

    Raises:
        CommitFailedException: a table's requirements failed (HTTP 409); nothing was committed.
        CommitStateUnknownException: the server failed (HTTP 500, 502, 503, 504): it may have landed.
        Other REST errors as PyIceberg raises them (a refused request, a missing table).
    """
    catalog = commits[0][0].catalog
    if not isinstance(catalog, RestCatalog) or any(t.catalog is not catalog for t, _, _ in commits):
        raise ValueError("rest_transactions.commit_together: every table must be of one REST catalog")
    changes = [
        json.loads(
            CommitTableRequest(
                identifier=TableIdentifier(namespace=t.name()[:-1], name=t.name()[-1]),  # type: ignore[arg-type]
                requirements=requirements,
                updates=updates,
            ).model_dump_json()
        )
        for t, requirements, updates in commits
    ]
    body = json.dumps({"table-changes": changes}, sort_keys=True).encode()
    headers = {**catalog._session.headers, "Idempotency-Key": hashlib.sha256(body).hexdigest()[:32]}
    response = catalog._session.post(catalog.url(_ENDPOINT, prefixed=True), data=body, headers=headers)
    try:
        response.raise_for_status()
    except HTTPError as exc:
        _handle_non_200_response(
            exc,
            {
                409: CommitFailedException,
                500: CommitStateUnknownException,
                502: CommitStateUnknownException,
                503: CommitStateUnknownException,
                504: CommitStateUnknownException,
            },
        )
    if len(commits) > 1:
        _faults.hit(_faults.TRANSACTION_COMMITTED, -1)
    responses = []
    for table, _, _ in commits:
        now = catalog.load_table(table.name())
        responses.append(CommitTableResponse(metadata=now.metadata, metadata_location=now.metadata_location))  # type: ignore[call-arg]
    return responses
