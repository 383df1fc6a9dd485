"""Where a command's table is: ``TABLE`` or ``--table``, in ``--embedded DIR`` or ``--catalog NAME``.

One rule for every command: none creates a catalog by looking for a table. Without ``--embedded``
or ``--catalog`` the commands look in ``./iceberg-sink-data``; a folder holding no embedded catalog
is "not found" (exit code 3), naming the folder, and a missing table names the catalog looked in.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table

from iceberg_sink.errors import IcebergSinkError
from iceberg_sink.table.catalog import (
    DEFAULT_EMBEDDED_ROOT,
    CatalogConfig,
    CatalogLoadError,
    commits_atomically,
    scrub,
)
from iceberg_sink.table.catalog import load_table as load_from_catalog
from iceberg_sink.table.names import table_name_problem


class NotFoundError(IcebergSinkError):
    """A table, catalog, file or checkpoint location that the command needs is missing or unreachable."""


class UsageError(IcebergSinkError):
    """The command line is inconsistent in a way argparse cannot see."""


def table_options(p: argparse.ArgumentParser) -> None:
    """The table and where to find it: --embedded DIR or --catalog NAME (+ properties), --branch."""
    where = p.add_mutually_exclusive_group()
    where.add_argument("--embedded", metavar="DIR", help="the embedded default catalog under DIR")
    where.add_argument("--catalog", metavar="NAME", help="a PyIceberg catalog name (with --catalog-property)")
    p.add_argument("--catalog-property", action="append", default=[], metavar="KEY=VALUE", help="repeatable")
    p.add_argument("table_arg", nargs="?", metavar="TABLE", help="namespace.name")
    p.add_argument("--table", help="namespace.name (same as the positional TABLE)")
    p.add_argument("--branch", default="main", help="the branch to read or change (default: main)")


def table_name(args: argparse.Namespace) -> str:
    if args.table and args.table_arg and args.table != args.table_arg:
        raise UsageError(f"TABLE: expected one table, received {args.table_arg!r} and --table {args.table!r}")
    name = args.table or args.table_arg
    if not name:
        raise UsageError("TABLE: required (positional, or --table namespace.name)")
    problem = table_name_problem(name)
    if problem is not None:
        raise UsageError(f"TABLE: {problem}")
    return str(name)


def catalog_config(args: argparse.Namespace) -> CatalogConfig:
    if args.catalog:
        props = {}
        for item in args.catalog_property:
            key, sep, value = item.partition("=")
            if not sep:
                # Never the item itself: a typo of "header.Authorization=Bearer ..." holds the token.
                raise UsageError(
                    f"--catalog-property: expected KEY=VALUE, received {len(item)} characters without '=' (not "
                    "shown: a catalog property may hold a secret)"
                )
            props[key] = value
        return CatalogConfig(args.catalog, props)
    if args.catalog_property:
        raise UsageError("--catalog-property: only with --catalog NAME")
    if args.embedded is not None and not os.path.isdir(args.embedded):
        raise NotFoundError(f"--embedded: {args.embedded} does not exist (expected the folder of an embedded catalog)")
    # Every command works on existing tables: none creates a catalog (or ./iceberg-sink-data) by looking.
    try:
        return CatalogConfig.embedded(args.embedded, create=False)
    except FileNotFoundError as e:
        raise NotFoundError(f"{e}; {_catalog_hint(args)}") from None


def _catalog_hint(args: argparse.Namespace) -> str:
    if args.embedded is not None:
        return "expected the folder a sink's .embedded(DIR) (or a config's sink.embedded) wrote"
    return (
        "without --embedded DIR or --catalog NAME the command looks in ./iceberg-sink-data; give the folder "
        "the pipeline uses with --embedded DIR, or --catalog NAME"
    )


def catalog_label(args: argparse.Namespace) -> str:
    """Which catalog the command looks in, for messages: its name, or the embedded catalog's folder."""
    if args.catalog:
        return f"catalog {args.catalog!r}"
    root = Path(args.embedded if args.embedded is not None else DEFAULT_EMBEDDED_ROOT).absolute()
    default = "" if args.embedded is not None else ", the default without --embedded DIR or --catalog NAME"
    return f"the embedded catalog at {root}{default}"


def catalog_commits_atomically(args: argparse.Namespace) -> bool | None:
    """Whether the command's catalog commits several tables in one transaction (job/together.py);
    None when it cannot be loaded."""
    try:
        return commits_atomically(catalog_config(args).load())
    except CatalogLoadError:
        return None


def catalog_lookup(args: argparse.Namespace) -> Callable[[str], Table | None]:
    """Loads tables by name from the command's catalog as it has them now; None for a missing table.

    Raises:
        NotFoundError: the catalog cannot be loaded (at once) or reached (when loading a table).
    """
    config = catalog_config(args)
    secrets = dict(config.properties)
    try:
        catalog = config.load()
    except CatalogLoadError as e:
        raise NotFoundError(str(e)) from None  # its message shows no secret (table/catalog.py)

    def lookup(identifier: str) -> Table | None:
        try:
            return load_from_catalog(catalog, identifier)
        except NoSuchTableError:
            return None
        except Exception as e:
            raise NotFoundError(
                f"table {identifier}: catalog {config.name!r} could not be reached: {type(e).__name__}: "
                f"{scrub(str(e), secrets)}"
            ) from None

    return lookup


def table_loader(args: argparse.Namespace) -> Callable[[], Table]:
    """Loads the command's table as the catalog has it now (called again before each commit attempt).

    Raises:
        NotFoundError: the catalog cannot be loaded or reached, or the table does not exist.
    """
    identifier = table_name(args)
    lookup = catalog_lookup(args)
    where = catalog_label(args)

    def load() -> Table:
        table = lookup(identifier)
        if table is None:
            raise NotFoundError(f"table {identifier} does not exist in {where}")
        return table

    load()  # fail before any work when the table is missing
    return load
