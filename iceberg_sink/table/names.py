"""One rule for identifiers from outside (table names, column names) and for where a table may live.

Every path that creates or resolves a table goes through :func:`check_table_name` (the builder's
``.table()``, the CLI's table arguments, the catalog helpers that create or load a table) or its
Spark twin :func:`table_name_refusal` (a routed row's table name, refused per row through
``sources/rejects.py``). Both are built from the same constants, so they accept the same names.

**Table names.** ``namespace.table``; dots separate namespace levels. Each part is 1 or more of
``A-Z a-z 0-9 _ -`` and does not start with ``-``. Everything else is refused, not encoded: a control
character (newline, tab, CR, NUL) or a URL-special character (``# ? % / \\ :``, space, quotes, ...)
makes the table's location string differ from the folder its files land in (URL parsing drops
``\\n\\t\\r``, cuts at ``#`` and ``?``, decodes ``%``), so two tables could share one folder, or a
table's metadata could land at a cut path. Refusing keeps one spelling per table everywhere (catalog,
location, checkpoint folder, logs); percent-encoding would give each name two.

**Lengths.** The namespace (with its dots) is at most :data:`MAX_NAMESPACE_CHARS` characters and the
table part at most :data:`MAX_TABLE_CHARS`: a routed table's checkpoint folder is named by the whole
name (``<checkpoint>/iceberg_sink/tables/<namespace>.<table>``, committer/store.py), and its bytes
(ASCII only) then stay below the 255-byte limit of a file name on common file systems.

**Locations** (:func:`check_location`, when the sink creates a table): the location the catalog
resolves must be a plain URL or path (no query, fragment or control character), inside its
namespace's location when the catalog says where that is, and neither equal to, inside, nor a parent
of another table's location in the catalog (compared as one spelling each, :func:`normalise_location`,
which orphan removal uses too, and case-insensitively, as case-insensitive file systems would). The
other tables looked at are those of the namespace, its parent namespaces and its child namespaces;
their locations are cached per catalog object, so creating many routed tables loads each existing
table once. A table the sink loads (:func:`iceberg_sink.table.catalog.load_table`) must have such a
plain location too.

**Columns** (:func:`column_problems`, on the input of every write before anything is created or
committed): a column or nested field name holding ``.`` or a backtick is refused (Spark reads ``a.b``
as field ``b`` of ``a``, so such a column cannot be written on every path), and so are top-level names
of Iceberg's metadata columns (:data:`METADATA_COLUMNS`, in any case).
"""

from __future__ import annotations

import contextlib
import logging
import re
import weakref
from collections.abc import Callable, Iterable, Sequence
from urllib.parse import unquote, urlsplit

from pyiceberg.catalog import Catalog, MetastoreCatalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

from iceberg_sink.errors import InvalidSinkConfigError, SchemaMismatchError

logger = logging.getLogger("iceberg_sink")

#: The characters of one part of a table name (a namespace level or the table), as a regex class.
PART_CHARS = "A-Za-z0-9_-"
#: One part: not empty, not starting with '-'. The same text is a Python and a Java regex.
PART_PATTERN = f"[A-Za-z0-9_][{PART_CHARS}]*"
#: A whole table name: at least a namespace and a table. \A and \z: Java's and Python's '$' would
#: also match before a trailing newline, Python's re has no \z but \Z means the same there.
_NAME_BODY = f"{PART_PATTERN}(?:\\.{PART_PATTERN})+"
_JAVA_NAME = f"\\A{_NAME_BODY}\\z"
_PY_NAME = re.compile(f"{_NAME_BODY}")
_PY_NAMESPACE = re.compile(f"{PART_PATTERN}(?:\\.{PART_PATTERN})*")

#: Longest namespace (all levels, with their dots) and table part, in characters (= bytes: ASCII).
MAX_NAMESPACE_CHARS = 100
MAX_TABLE_CHARS = 150

#: Top-level column names Iceberg reserves for metadata columns (compared case-insensitively).
METADATA_COLUMNS = frozenset(
    {"_file", "_pos", "_spec_id", "_row_id", "_deleted", "_partition", "_last_updated_sequence_number"}
)

#: What a refusal says the rule is (shared by the Python and the Spark check, and the docs).
CHARS_RULE = (
    "each part of 'namespace.table' must be 1 or more of A-Z a-z 0-9 _ - (not starting with '-'), "
    "parts separated by single dots"
)
LENGTH_RULE = f"the namespace may have at most {MAX_NAMESPACE_CHARS} characters and the table at most {MAX_TABLE_CHARS}"

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def shown(name: str, limit: int = 80) -> str:
    """``name`` as a message shows it: quoted, control characters escaped, long names cut."""
    text = repr(name)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def table_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a table name (the rule of this module), or None when it can."""
    if not isinstance(name, str):
        return f"expected a table name 'namespace.table', received {name!r}"
    if not _PY_NAME.fullmatch(name):
        what = "a control character" if _CONTROL.search(name) else "other characters or empty parts"
        if "." not in name:
            what = "no namespace"
        return f"table name {shown(name)} holds {what}: {CHARS_RULE}"
    namespace, _, table = name.rpartition(".")
    if len(namespace) > MAX_NAMESPACE_CHARS or len(table) > MAX_TABLE_CHARS:
        return (
            f"table name {shown(name)} is too long (namespace {len(namespace)}, table {len(table)} characters): "
            f"{LENGTH_RULE}"
        )
    return None


def check_table_name(name: object, what: str = "table") -> str:
    """``name`` if it is a valid table name.

    Raises:
        InvalidSinkConfigError: naming the rule and what was received.
    """
    problem = table_name_problem(name)
    if problem is not None:
        raise InvalidSinkConfigError(f"{what}: {problem}")
    assert isinstance(name, str)
    return name


def namespace_problem(namespace: object) -> str | None:
    """Why ``namespace`` cannot be a namespace (dot-separated parts of the table-name rule), or None."""
    if not isinstance(namespace, str) or not _PY_NAMESPACE.fullmatch(namespace):
        return f"expected a namespace such as 'cdc' ({CHARS_RULE}), received {namespace!r}"
    if len(namespace) > MAX_NAMESPACE_CHARS:
        return f"namespace {shown(namespace)} is too long ({len(namespace)} characters): {LENGTH_RULE}"
    return None


# -- allow-lists of routed sinks ------------------------------------------------------------------


def allow_pattern(entry: str, namespace: str | None) -> str:
    """The regex (valid in Python and Java) of one ``.route(allow=...)`` entry: a table name or a glob
    where ``*`` matches any characters of one part (never a dot) and ``?`` one character. An entry
    without a dot gets the route's namespace, as a routed name does.

    Raises:
        InvalidSinkConfigError: the entry cannot match a valid table name.
    """
    if not isinstance(entry, str):
        raise InvalidSinkConfigError(f"route(allow): expected table names or glob patterns, received {entry!r}")
    full = entry if "." in entry else (f"{namespace}.{entry}" if namespace else entry)
    problem = table_name_problem(full.replace("*", "x").replace("?", "x"))
    if problem is not None:
        raise InvalidSinkConfigError(f"route(allow): entry {entry!r}: {problem}")
    out = []
    for ch in full:
        out.append(f"[{PART_CHARS}]*" if ch == "*" else f"[{PART_CHARS}]" if ch == "?" else re.escape(ch))
    return "".join(out)


def allowed(name: str, namespace: str | None, allow: Sequence[str]) -> bool:
    """Whether a routed sink with this namespace and allow-list may write table ``name`` (Python twin
    of the confinement part of :func:`table_name_refusal`)."""
    if allow:
        return any(re.fullmatch(allow_pattern(a, namespace), name) for a in allow)
    return namespace is not None and name.rpartition(".")[0] == namespace


# -- the same rule as a Spark expression, for a routed row ----------------------------------------


def _shown_column(name: Column) -> Column:
    """A routed name as a message shows it on one line (control characters escaped, cut at 80)."""
    text = name
    for raw, escaped in (("\n", "\\\\n"), ("\r", "\\\\r"), ("\t", "\\\\t"), ("\u0000", "\\\\0")):
        text = F.regexp_replace(text, raw, escaped)
    text = F.regexp_replace(text, "[\\x00-\\x1f\\x7f]", "?")
    cut = F.when(F.length(text) > 80, F.concat(F.substring(text, 1, 76), F.lit("..."))).otherwise(text)
    return F.concat(F.lit("'"), cut, F.lit("'"))


KNOWN_NAMES_MAX = 4096
"""At most this many known names are given to Spark as one set (the set travels in every batch's plan)."""


def table_name_refusal(name: Column, namespace: str | None, allow: Sequence[str], known: Iterable[str] = ()) -> Column:
    """Why a routed row's table ``name`` (a string Column, namespace already added) is refused, or
    null: the name rule of this module, then confinement (the route's namespace, or ``allow``).

    ``known``: names the driver already accepted for this route (:func:`known_names`); a row naming one
    is accepted by one set lookup instead of the rule's regex and string checks (~0.3 s of a 500,000-row
    routed checkpoint's planning job on 2 cores)."""
    label = F.concat(F.lit("routed table "), _shown_column(name))
    table = F.substring_index(name, ".", -1)
    namespace_length = F.length(name) - F.length(table) - 1
    if allow:
        permitted = F.lit(False)
        for entry in allow:
            permitted = permitted | name.rlike(f"\\A{allow_pattern(entry, namespace)}\\z")
        scope = f"allow={list(allow)!r}"
    else:
        assert namespace is not None, "a route without allow= has a namespace (checked by build())"
        permitted = F.substring(name, 1, len(namespace) + 1) == F.lit(namespace + ".")
        permitted = permitted & (namespace_length == len(namespace))
        scope = f"namespace {namespace!r}"
    # Most rows pass: one combined test first, the chain that builds the message (escaped and cut:
    # five regex replaces) only for a row that fails it. Measured on 500,000 rows routed to 100
    # tables: the chain alone cost 0.1-0.3 s more per batch than this (most of the rest is the regex).
    valid = name.rlike(_JAVA_NAME)
    short = (namespace_length <= MAX_NAMESPACE_CHARS) & (F.length(table) <= MAX_TABLE_CHARS)
    refusal = (
        F.when(name.isNull(), F.lit("a row names no table (the route gave null)"))
        .when(
            ~valid,
            F.concat(
                label,
                F.when(name.rlike("[\\x00-\\x1f\\x7f]"), F.lit(" holds a control character: "))
                .when(~name.contains("."), F.lit(" has no namespace: "))
                .otherwise(F.lit(" holds other characters or empty parts: ")),
                F.lit(CHARS_RULE),
            ),
        )
        .when(~short, F.concat(label, F.lit(f" is too long: {LENGTH_RULE}")))
        .when(
            ~permitted,
            F.concat(
                label,
                F.lit(f" is outside what this route may write ({scope}); give .route(allow=[...]) to permit it"),
            ),
        )
    )
    checked = F.when(valid & short & permitted, F.lit(None).cast("string")).otherwise(refusal)
    accepted = sorted(known)
    if not accepted:
        return checked
    return F.when(name.isin(*accepted), F.lit(None).cast("string")).otherwise(checked)


def known_names(names: Iterable[str], namespace: str | None, allow: Sequence[str]) -> frozenset[str]:
    """Those of ``names`` a route (``namespace``, ``allow``) may write under this module's rule (the
    Python twin of :func:`table_name_refusal`), at most :data:`KNOWN_NAMES_MAX` of them."""
    accepted = sorted(n for n in names if table_name_problem(n) is None and allowed(n, namespace, allow))
    return frozenset(accepted[:KNOWN_NAMES_MAX])


# -- locations of new tables ----------------------------------------------------------------------


_EQUAL_SCHEMES = {"s3a": "s3", "s3n": "s3"}
"""Schemes naming the same store (Iceberg Java's DeleteOrphanFiles default: s3a and s3n are s3)."""
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(.*)$", re.DOTALL)


def location_parts(location: str) -> tuple[str, str, str]:
    """``(scheme, authority, path)`` of a file location, normalised so that spellings of one file agree.

    ``s3a://`` and ``s3n://`` are ``s3://``; ``/x``, ``file:/x``, ``file:///x`` and
    ``file://localhost/x`` are all ``file`` with path ``/x``; percent-escapes in the path are decoded
    (``a%20b`` compares equal to ``a b``: PyIceberg and Hadoop read a path literally, but other tools
    decode, and an equality that merges two files only ever keeps or refuses more). ``?`` and ``#``
    stay part of the path: object keys may hold them. Checkpoint locations follow Spark's literal
    reading instead (``committer/store.checkpoint_parts``).
    """
    match = _SCHEME.match(location)
    if match is None:
        return "file", "", unquote(location)
    scheme, rest = match.group(1).lower(), match.group(2)
    scheme = _EQUAL_SCHEMES.get(scheme, scheme)
    authority = ""
    if rest.startswith("//"):
        authority, slash, path = rest[2:].partition("/")
        rest = slash + path
    if scheme == "file" and authority.lower() == "localhost":
        authority = ""
    return scheme, authority, unquote(rest)


def normalise_location(location: str) -> str:
    """One spelling per file location (see :func:`location_parts`), for comparing locations."""
    scheme, authority, path = location_parts(location)
    return f"{scheme}://{authority}{path}"


def _normal(location: str) -> str:
    """A location compared with others: one spelling per location (:func:`normalise_location`: a
    table that another tool created at ``file:/wh/cdc`` is the folder of ``file:///wh/cdc/x``), case
    ignored (as case-insensitive file systems do), without a final slash."""
    return normalise_location(location).rstrip("/").casefold()


def location_problem(location: str) -> str | None:
    """Why ``location`` is not a plain URL or path whose string names the folder files land in."""
    parts = urlsplit(location)
    if _CONTROL.search(location) or parts.query or parts.fragment or "?" in location or "#" in location:
        return f"location {shown(location, 200)} holds a control character, '?' or '#'"
    if parts.scheme.lower() == "file" and parts.netloc:
        # PyIceberg's file IO joins a file URI's host and path into a relative path (localhost/x).
        return f"location {shown(location, 200)} names a host ({parts.netloc!r}) in a file URI"
    return None


def _inside(child: str, parent: str) -> bool:
    return _normal(child).startswith(_normal(parent) + "/")


_known: weakref.WeakKeyDictionary[Catalog, dict[tuple[str, ...], str]] = weakref.WeakKeyDictionary()


def _namespace_location(catalog: Catalog, namespace: tuple[str, ...]) -> str | None:
    """Where the catalog puts the namespace's tables: its ``location`` property, else (PyIceberg's
    SQL, Glue, Hive catalogs) ``<warehouse>/<namespace>``; None when the catalog does not say."""
    try:
        props = catalog.load_namespace_properties(namespace)
    except NoSuchNamespaceError:
        props = {}
    if props.get("location"):
        return str(props["location"])
    warehouse = catalog.properties.get("warehouse")
    if isinstance(catalog, MetastoreCatalog) and warehouse:
        return f"{warehouse.rstrip('/')}/{Catalog.namespace_to_string(namespace)}"
    return None


def _neighbour_tables(catalog: Catalog, namespace: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Tables whose default locations could nest with one in ``namespace``: those of the namespace,
    of its parents and (recursively) of its children."""
    levels = [namespace[:i] for i in range(1, len(namespace) + 1)]
    return walk_tables(catalog, levels, descend=lambda ns: ns[: len(namespace)] == namespace, strict=False)


def walk_tables(
    catalog: Catalog,
    roots: Iterable[tuple[str, ...]] | None,
    *,
    descend: Callable[[tuple[str, ...]], bool] = lambda ns: True,
    strict: bool,
) -> list[tuple[str, ...]]:
    """Every table identifier of the namespaces ``roots`` (all top-level namespaces when None) and,
    for those where ``descend`` holds, of their child namespaces, recursively. The one walk over a
    catalog's tables (the location-overlap check here, orphan removal's shared-location check).

    A namespace that vanished meanwhile holds no table. A catalog that cannot answer (it cannot list
    tables or namespaces: ``NotImplementedError``, or another error): with ``strict`` the error is
    raised (the caller refuses, since its check cannot be made); else the namespace is passed over with
    a warning naming it (the check covers the namespaces that could be listed). A catalog without nested
    namespaces may refuse to list children: that is never an error.
    """
    todo = [tuple(ns) for ns in (catalog.list_namespaces() if roots is None else roots)]
    found: list[tuple[str, ...]] = []
    seen: set[tuple[str, ...]] = set()
    while todo:
        ns = todo.pop()
        if ns in seen:
            continue
        seen.add(ns)
        try:
            found.extend(tuple(t) for t in catalog.list_tables(ns))
        except NoSuchNamespaceError:
            continue
        except Exception as e:
            if strict:
                raise
            logger.warning(
                "namespace %s: its tables cannot be listed (%s: %s); not compared",
                ".".join(ns),
                type(e).__name__,
                e,
            )
            continue
        if descend(ns):
            with contextlib.suppress(Exception):  # catalogs without nested namespaces may refuse the question
                todo.extend(tuple(c) for c in catalog.list_namespaces(ns) if tuple(c) != ns)
    return found


def _locations(catalog: Catalog, identifiers: Iterable[tuple[str, ...]]) -> dict[tuple[str, ...], str]:
    known = _known.setdefault(catalog, {})
    out = {}
    for ident in identifiers:
        if ident not in known:
            try:
                known[ident] = catalog.load_table(ident).location()
            except NoSuchTableError:
                continue
            except Exception as e:  # a table whose metadata cannot be read: its location is unknown
                logger.warning(
                    "table %s: location unknown (%s: %s); not compared", ".".join(ident), type(e).__name__, e
                )
                continue
        out[ident] = known[ident]
    return out


def check_location(catalog: Catalog, identifier: str, location: str) -> None:
    """Refuse a new table's resolved ``location`` (see the module docstring).

    Raises:
        InvalidSinkConfigError: naming the table, its location and the rule it breaks.
    """
    ident = Catalog.identifier_to_tuple(identifier)
    what = f"table {identifier} would be created at {shown(location, 200)}"
    problem = location_problem(location)
    if problem is not None:
        raise InvalidSinkConfigError(f"{what}: {problem}; refused")
    ns_location = _namespace_location(catalog, ident[:-1])
    if ns_location is not None and not _inside(location, ns_location):
        raise InvalidSinkConfigError(
            f"{what}, outside its namespace's location {ns_location!r}: a table's location must be inside its "
            "namespace's; refused"
        )
    for other, other_location in sorted(_locations(catalog, _neighbour_tables(catalog, ident[:-1])).items()):
        if other == ident:
            continue
        if _normal(other_location) == _normal(location) or _inside(location, other_location):
            relation = "the same as or inside"
        elif _inside(other_location, location):
            relation = "a parent of"
        else:
            continue
        raise InvalidSinkConfigError(
            f"{what}, {relation} the location {other_location!r} of table {'.'.join(other)}: tables must not share "
            "or nest folders (maintenance of one would delete the other's files); refused"
        )


def remember_location(catalog: Catalog, identifier: str, location: str) -> None:
    """Record a table the sink just created, so later checks need not load it."""
    _known.setdefault(catalog, {})[Catalog.identifier_to_tuple(identifier)] = location


# -- column names ---------------------------------------------------------------------------------


def _field_problems(dt: T.DataType, path: str, problems: list[str]) -> None:
    if isinstance(dt, T.StructType):
        for f in dt.fields:
            where = f"{path}.{f.name}" if path else f.name
            if "." in f.name or "`" in f.name:
                problems.append(
                    f"{where!r}: a column or field name may not hold '.' or '`' (Spark reads 'a.b' as field b of "
                    "column a); rename it (for example with .withColumnRenamed or in map_batches)"
                )
            elif _CONTROL.search(f.name):
                problems.append(f"{shown(where)}: a column or field name may not hold a control character")
            _field_problems(f.dataType, where, problems)
    elif isinstance(dt, T.ArrayType):
        _field_problems(dt.elementType, path, problems)
    elif isinstance(dt, T.MapType):
        _field_problems(dt.keyType, path, problems)
        _field_problems(dt.valueType, path, problems)


def column_problems(struct: T.StructType) -> list[str]:
    """What is wrong with the column and nested field names of an input (empty: nothing)."""
    problems: list[str] = []
    for f in struct.fields:
        if f.name.lower() in METADATA_COLUMNS:
            problems.append(
                f"{f.name!r}: the name of an Iceberg metadata column ({', '.join(sorted(METADATA_COLUMNS))}); "
                "rename the column"
            )
    _field_problems(struct, "", problems)
    return problems


def check_columns(table: str, struct: T.StructType) -> None:
    """Refuse an input whose column names break the rule, before anything is created or committed.

    Raises:
        SchemaMismatchError: naming every bad column.
    """
    problems = column_problems(struct)
    if problems:
        raise SchemaMismatchError(table, problems)
