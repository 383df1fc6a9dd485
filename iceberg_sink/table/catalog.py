"""Catalog access on the driver: the configured PyIceberg catalog or the embedded default.

The embedded default is a SQLite catalog file and a local warehouse folder under one root directory
(``./iceberg-sink-data`` unless set with ``IcebergSink.builder().embedded(root)``).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote, unquote

import attrs
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table

from iceberg_sink._iceberg.v3_metadata import v3_metadata_writes
from iceberg_sink.errors import InvalidSinkConfigError
from iceberg_sink.table import names
from iceberg_sink.vocab.locations import is_uri

logger = logging.getLogger("iceberg_sink")

DEFAULT_EMBEDDED_ROOT = "iceberg-sink-data"
EMBEDDED_CATALOG_FILE = "catalog.db"

# Catalog property values are secrets unless known to be harmless: a REST catalog takes any HTTP
# header as ``header.<name>`` (``header.Authorization=Bearer ...``), Azure a whole connection string
# (``adls.connection-string=...;AccountKey=...``), a SQL catalog a URI whose query may hold the
# password (``postgresql://host/db?user=u&password=...``). No key name tells them apart, so messages
# show only these keys' values; the others are shown as ``***``.
SHOWN_PROPERTIES = ("type", "warehouse", "uri")
"""The catalog properties whose values messages show; a URI's user info, query and fragment are cut."""

_MASK = "***"

# The user info of a URL such as postgresql://user:password@host/db, anywhere in a text.
_URL_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")
# Parts of a value that may be secrets on their own: ``k=v`` pairs (connection strings, URL queries),
# ``user:password``, ``Bearer <token>``.
_PARTS = re.compile(r"[;&,\s?#]+")


def _mask_url_userinfo(text: str) -> str:
    return _URL_USERINFO.sub(lambda m: m["head"] + _MASK + "@", text)


def shown_value(key: str, value: object) -> str:
    """What a message may show of catalog property ``key``: the value of a harmless key (a URL's
    user info, query and fragment cut), ``***`` for any other."""
    if key not in SHOWN_PROPERTIES:
        return _MASK
    text = str(value)
    if key == "type":
        return text if re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", text) else _MASK
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*:)(//[^/?#]*)?([^?#]*)", text)
    if match is None:
        return _MASK
    scheme, authority, path = match.group(1), match.group(2) or "", match.group(3)
    if "@" in authority:
        authority = "//" + _MASK + "@" + authority.rpartition("@")[2]
    cut = " (query cut)" if len(text) > len(match.group(0)) else ""
    return scheme + authority + path + cut


def redact(properties: Mapping[str, str]) -> dict[str, str]:
    """A copy of catalog properties safe to show: only :data:`SHOWN_PROPERTIES` keep (a safe part of)
    their values; every other value is ``***``."""
    return {k: shown_value(k, v) for k, v in properties.items()}


def _secrets(properties: Mapping[str, str]) -> list[str]:
    """Every text of ``properties`` a message must not show: each value, and the parts of it that
    could be shown alone (a connection string's ``AccountKey=...`` value, a URL's password or query
    values, a bearer token), as is and URL-decoded."""
    found: set[str] = set()
    for key, value in properties.items():
        text = str(value)
        if key not in SHOWN_PROPERTIES:
            found.add(text)
        for part in _PARTS.split(text):
            pieces = [part, part.partition("=")[2]]
            userinfo = re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://([^/@]*)@", part)
            if userinfo:
                pieces += [userinfo.group(1), userinfo.group(1).partition(":")[2]]
            elif key not in SHOWN_PROPERTIES:
                pieces += [part.partition(":")[2]]
            for piece in pieces:
                if key in SHOWN_PROPERTIES and piece == part:
                    continue  # the harmless part of a shown value (its scheme, host, path)
                found.add(piece)
    found |= {unquote(s) for s in found} | {quote(s, safe="") for s in found}
    # Too short to be a secret, and masking them would garble every message.
    return sorted((s for s in found if len(s) >= 4 and s.lower() not in ("true", "false")), key=len, reverse=True)


def scrub(text: str, properties: Mapping[str, str]) -> str:
    """``text`` (an error message from a catalog or FileIO) with every catalog property value that
    :func:`redact` would not show, each part of one that could be shown alone, and every URL's user
    info replaced by ``***``."""
    for secret in _secrets(properties):
        text = text.replace(secret, _MASK)
    return _mask_url_userinfo(text)


def describe_catalog(name: str, properties: Mapping[str, str]) -> str:
    """How every message names a catalog: its name and its properties as :func:`redact` shows them."""
    return f"catalog {name!r} with properties {redact(properties)}"


class CatalogLoadError(InvalidSinkConfigError):
    """A catalog could not be loaded from its properties (message safe to show: see :func:`scrub`)."""


def _sorted_items(value: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), str(v)) for k, v in dict(value).items()))


# Characters an embedded root may not hold: a table location cuts at '?' and '#' (URL parsing), and
# control characters are refused in every name (table/names.py).
_EMBEDDED_ROOT_REFUSED = re.compile(r"[?#\x00-\x1f\x7f]")


def embedded_catalog_uri(base: Path) -> str:
    """The SQLAlchemy URL of the embedded catalog file under ``base``. SQLAlchemy decodes
    percent-escapes in the path (and cuts it at ``?``), so the path is escaped: a folder named
    ``50%41`` holds the catalog, not a file ``50A`` beside it."""
    return "sqlite:///" + quote(str(base / EMBEDDED_CATALOG_FILE), safe="/")


def embedded_warehouse(base: Path) -> str:
    """The embedded warehouse under ``base``: ``file://`` and the path as it is, not escaped
    (``Path.as_uri()`` escapes). PyIceberg's and Hadoop's file IO read a location's path literally,
    so an escaped ``My%20Lake`` put every table in a sibling folder named ``My%20Lake``, not in
    ``My Lake``. Roots holding '?' or '#' are refused (:meth:`CatalogConfig.embedded`)."""
    return "file://" + (base / "warehouse").as_posix()


@attrs.frozen(repr=False)
class CatalogConfig:
    """Name and properties of a PyIceberg catalog. Its repr never shows secrets."""

    name: str
    properties: tuple[tuple[str, str], ...] = attrs.field(converter=_sorted_items)

    @classmethod
    def embedded(cls, root: str | os.PathLike[str] | None = None, create: bool = True) -> CatalogConfig:
        """The embedded catalog under ``root`` (default ``./iceberg-sink-data``).

        Args:
            create: make the folders when missing (a sink writing); ``False`` (a command that only
                reads or changes existing tables) creates nothing and raises when there is no catalog.

        Raises:
            FileNotFoundError: ``create=False`` and ``root`` holds no embedded catalog (naming the folder).
        """
        given = os.fspath(root if root is not None else DEFAULT_EMBEDDED_ROOT)
        if is_uri(given):  # the root is a local folder
            raise InvalidSinkConfigError(
                f"embedded(root): expected a local folder (the embedded catalog is a SQLite file there), received the "
                f"URI {given!r}; give the folder's path"
            )
        base = Path(given).absolute()
        problem = _EMBEDDED_ROOT_REFUSED.search(str(base))
        if problem is not None:
            raise InvalidSinkConfigError(
                f"embedded(root): expected a folder whose path holds no {problem.group()!r} (a table's location is a "
                f"URL, which cuts at '?' and '#'; control characters are refused in every name); received {str(base)!r}"
            )
        if not create and not (base / EMBEDDED_CATALOG_FILE).is_file():
            raise FileNotFoundError(f"no embedded catalog at {base} (expected its {EMBEDDED_CATALOG_FILE} there)")
        if create:
            (base / "warehouse").mkdir(parents=True, exist_ok=True)
        return cls(
            "iceberg_sink", {"type": "sql", "uri": embedded_catalog_uri(base), "warehouse": embedded_warehouse(base)}
        )

    def __repr__(self) -> str:
        return f"CatalogConfig(name={self.name!r}, properties={redact(dict(self.properties))!r})"

    def load(self) -> Catalog:
        """The catalog, loaded from its properties.

        Raises:
            CatalogLoadError: it cannot be loaded; the message names the catalog, shows only the
                properties :func:`redact` shows and the cause's text scrubbed of every property value
                (not chained: the cause's text, from a driver's URL parser or an HTTP client, may hold
                secrets).
        """
        from iceberg_sink._iceberg import metadata_cache  # imports PyIceberg's SQL catalog (SQLAlchemy)

        properties = dict(self.properties)
        try:
            # A SQL catalog parses a table's metadata file only when its location moved (_iceberg/metadata_cache.py).
            return metadata_cache.caching(load_catalog(self.name, **properties))
        except Exception as e:
            raise CatalogLoadError(
                f"{describe_catalog(self.name, properties)} could not be loaded: "
                f"{type(e).__name__}: {scrub(str(e), properties)}"
            ) from None


def commits_atomically(catalog: Catalog) -> bool:
    """Whether ``catalog`` can commit several tables in one transaction (job/together.py): a SQL
    catalog (SQLite, PostgreSQL, MySQL) or a REST catalog serving ``transactions/commit``. Glue, Hive
    and REST catalogs without that endpoint commit one table at a time."""
    from iceberg_sink._iceberg.commit import commits_together

    return commits_together(catalog)


# The FileIO settings tasks need to read and write files. Everything else a catalog hands its FileIO
# (the catalog's own credential, its auth manager, ...) stays on the driver.
_FILE_IO_PREFIXES = ("s3.", "gcs.", "gs.", "adls.", "hdfs.", "oss.", "hf.", "client.", "py-io-impl")


def file_io_properties(properties: Mapping[str, object]) -> dict[str, str]:
    """The subset of a FileIO's properties that may travel to Spark tasks."""
    return {k: v for k, v in properties.items() if isinstance(v, str) and k.startswith(_FILE_IO_PREFIXES)}


def load_table(catalog: Catalog, identifier: str) -> Table | None:
    """The table, or None when it does not exist.

    Raises:
        InvalidSinkConfigError: ``identifier`` breaks the table-name rule, or the table's location is
            not one whose string names the folder its files land in (table/names.py).
    """
    names.check_table_name(identifier)
    try:
        table = catalog.load_table(identifier)
    except NoSuchTableError:
        return None
    problem = names.location_problem(table.location())
    if problem is not None:
        # Created by another tool: the sink's file IO (PyIceberg's) would not write where it says.
        raise InvalidSinkConfigError(
            f"table {identifier}: {problem}, so its files would not land in the folder it names (PyIceberg's file "
            "IO cuts a path at '?' and '#' and reads a file URI's host as a folder); refused. Give the table a "
            "location without them"
        )
    return table


def create_table(
    catalog: Catalog,
    identifier: str,
    schema: Schema,
    spec: PartitionSpec,
    properties: Mapping[str, str],
) -> Table:
    """Create the table (and its namespace), or load it if another process created it first.

    Two streams starting together race here; some catalogs report the loser with their own error
    (PyIceberg's SQL catalog lets SQLite's IntegrityError through), so any failure is followed by a
    check whether the other side's creation succeeded.

    The name and the location the catalog resolves for it are checked first (table/names.py): the
    creation is staged (nothing is written or registered), its location checked, then committed.

    A format v3 table is created directly (create, check, drop if refused): PyIceberg 0.12's staged
    creation refuses format version 3, and only the sink's own scope writes v3 metadata
    (``_iceberg/v3_metadata.py``, which also gives the new table its ``next-row-id`` of 0).

    Raises:
        InvalidSinkConfigError: the name or the resolved location breaks the rule; nothing was created.
    """
    names.check_table_name(identifier)
    namespace = Catalog.identifier_to_tuple(identifier)[:-1]
    if namespace:
        try:
            catalog.create_namespace(namespace)
        except NamespaceAlreadyExistsError:
            pass
        except Exception:
            if not catalog.namespace_exists(namespace):
                raise
    if str(properties.get("format-version", "")) == "3":
        with v3_metadata_writes():
            return _create_then_check(catalog, identifier, schema, spec, properties)
    try:
        staged = catalog.create_table_transaction(
            identifier, schema=schema, partition_spec=spec, properties=dict(properties)
        )
    except TableAlreadyExistsError:
        return catalog.load_table(identifier)
    except Exception as e:
        # A catalog without staged creation (some REST servers): create, check, and drop a refused table.
        logger.debug("staged creation of %s failed (%s: %s); creating directly", identifier, type(e).__name__, e)
        return _create_then_check(catalog, identifier, schema, spec, properties)
    names.check_location(catalog, identifier, staged.table_metadata.location)
    try:
        staged.commit_transaction()
    except Exception:
        # Lost a creation race (AssertCreate failed, or the catalog's own error): use the winner's table.
        existing = load_table(catalog, identifier)
        if existing is None:
            raise
        return existing
    table = catalog.load_table(identifier)
    names.remember_location(catalog, identifier, table.location())
    return table


def _create_then_check(
    catalog: Catalog, identifier: str, schema: Schema, spec: PartitionSpec, properties: Mapping[str, str]
) -> Table:
    try:
        table = catalog.create_table(identifier, schema=schema, partition_spec=spec, properties=dict(properties))
    except TableAlreadyExistsError:
        return catalog.load_table(identifier)
    except Exception:
        existing = load_table(catalog, identifier)
        if existing is None:
            raise
        return existing
    try:
        names.check_location(catalog, identifier, table.location())
    except Exception:
        catalog.drop_table(identifier)  # just created, empty: nothing of anyone's is lost
        raise
    names.remember_location(catalog, identifier, table.location())
    return table
