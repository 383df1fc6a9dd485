"""``iceberg-sink``: run a pipeline from a YAML file, inspect a table, and keep it in shape.

  iceberg-sink run pipeline.yaml [--available-now | --timeout SECONDS | --max-batches N]
  iceberg-sink inspect db.events [--checkpoint-location DIR] [--embedded DIR | --catalog NAME ...]
  iceberg-sink inspect --checkpoint-location DIR [--embedded DIR | --catalog NAME ...]   (the job's tables)
  iceberg-sink compact db.events [--partition region=eu] [--dry-run]
  iceberg-sink convert-equality-deletes db.users
  iceberg-sink expire-snapshots db.events --older-than-hours 24 --retain-last 10 [--dry-run]
  iceberg-sink remove-orphans db.events --older-than-hours 72 [--dry-run]
  iceberg-sink rewrite-manifests db.events
  iceberg-sink upgrade-format-version db.events --format-version 3
  iceberg-sink demo [--batches 10 --rows 2000]   (a streaming CDC pipeline with a live display; see demo.py)

Tables are found in the embedded default catalog (./iceberg-sink-data, or --embedded DIR) or in a
PyIceberg catalog (--catalog NAME --catalog-property uri=... ...). The table is the positional TABLE
or --table. Every command takes --json (one JSON document on stdout, nothing else there) and --debug
(stack traces on errors). See docs/cli.md.

Each subcommand is one block below: an arguments function and a run function registered with
``@command``; the run function returns the JSON document's fields and prints its human output with
``out.say``.
"""
# The docstring above is also `iceberg-sink --help`'s description (parser() below), kept word for
# word: the blocks it speaks of are in commands.py (run, inspect, compact) and maintenance_commands.py.

from __future__ import annotations

import argparse
import json
import re
import sys
import traceback
from collections.abc import Sequence
from typing import Any

# Imported for its @command registrations (it imports commands.py first, whose commands come first):
# COMMANDS lists the subcommands in the order of `iceberg-sink --help`.
from iceberg_sink.cli import maintenance_commands  # noqa: F401
from iceberg_sink.cli.commands import COMMANDS, command
from iceberg_sink.cli.output import Output, StdoutClosed, detach_stdout, emit
from iceberg_sink.cli.where import NotFoundError, UsageError
from iceberg_sink.errors import (
    CatalogUnavailableError,
    IcebergSinkError,
    InvalidInputError,
    InvalidSinkConfigError,
    MaintenanceRefusedError,
    SchemaMismatchError,
    UnsupportedTableError,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_REFUSED = 4
EXIT_INTERRUPTED = 130
EXIT_STDOUT_CLOSED = 141

EXIT_CODES = f"""\
exit codes:
  {EXIT_OK}    done
  {EXIT_FAILED}    the operation failed (a commit, a write, the streaming query, Spark)
  {EXIT_USAGE}    usage or configuration error (bad option, invalid config file or sink option)
  {EXIT_NOT_FOUND}    not found or unreachable: table, catalog, config file, checkpoint location
  {EXIT_REFUSED}    refused for safety, nothing deleted or committed (remove-orphans: listing and metadata
       disagree, a location shared with other tables; a rewrite that would change the live files)
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C)
  {EXIT_STDOUT_CLOSED}  stdout was closed by its reader (`... | head`): the command stopped quietly, as on SIGPIPE
"""


# ---- demo ----------------------------------------------------------------------------------------
# Listed here for --help; main() hands `iceberg-sink demo ...` to iceberg_sink/cli/demo.py, which parses
# its own options.


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("demo_args", nargs=argparse.REMAINDER, metavar="...", help="see iceberg-sink demo --help")


@command("demo", "stream generated changes into a local table with a live display, then check it", _demo_arguments)
def _demo(args: argparse.Namespace, out: Output) -> dict[str, Any]:
    raise UsageError("demo is run by main() directly")  # pragma: no cover - main() dispatches it first


# ---- main ----------------------------------------------------------------------------------------


def _global_options(p: argparse.ArgumentParser, top: bool) -> None:
    # On subcommands the defaults are suppressed so `iceberg-sink --json inspect t` and
    # `iceberg-sink inspect t --json` both work.
    default: Any = False if top else argparse.SUPPRESS
    p.add_argument("--json", action="store_true", default=default, help="one JSON document on stdout, nothing else")
    p.add_argument("--debug", action="store_true", default=default, help="stack traces on errors")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None if top else argparse.SUPPRESS,
        help="progress of long work (default: on when stdout is a terminal and without --json)",
    )


def parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    top = argparse.ArgumentParser(
        prog="iceberg-sink", description=__doc__, epilog=EXIT_CODES, formatter_class=formatter
    )
    _global_options(top, top=True)
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for c in COMMANDS.values():
        p = sub.add_parser(c.name, help=c.help, description=c.help, epilog=EXIT_CODES, formatter_class=formatter)
        c.arguments(p)
        _global_options(p, top=False)
    return top


def exit_code(error: BaseException) -> int:
    """The documented exit code of an error (see EXIT_CODES)."""
    from iceberg_sink.cli import runner

    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED
    if isinstance(error, NotFoundError | CatalogUnavailableError | FileNotFoundError):
        return EXIT_NOT_FOUND
    if isinstance(error, MaintenanceRefusedError):
        return EXIT_REFUSED
    if isinstance(error, runner.PipelineFailedError):
        return EXIT_FAILED
    if isinstance(
        error, UsageError | InvalidSinkConfigError | SchemaMismatchError | UnsupportedTableError | InvalidInputError
    ):
        return EXIT_USAGE
    return EXIT_FAILED


_SQLSTATE = re.compile(r"\s*SQLSTATE: \w+\s*$")


def describe(error: BaseException) -> tuple[str, str]:
    """``(type name, one line)`` of an error: our errors' message as it is; for others (Spark's carry
    JVM stack traces) the most telling line: the last ``module.XError: message`` of a Python error
    raised in a micro-batch, else the first line."""
    text = str(error).strip()
    if isinstance(error, IcebergSinkError) and "Traceback" not in text and "\tat " not in text:
        return type(error).__name__, " ".join(text.split())
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    python = [
        line
        for line in lines
        if not line.startswith(("at ", "File ", "Traceback", "...", "^"))
        and ": " in line
        and line.split(": ", 1)[0].rsplit(".", 1)[-1].endswith(("Error", "Exception"))
        and " " not in line.split(": ", 1)[0]
    ]
    if python:
        kind, message = python[-1].split(": ", 1)
        kind = kind.rsplit(".", 1)[-1]
        return kind, f"{kind}: {_SQLSTATE.sub('', message)}"
    first = _SQLSTATE.sub("", lines[0]) if lines else ""
    name = type(error).__name__
    return name, first if first.startswith(name) else f"{name}: {first}".rstrip(": ")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code (EXIT_CODES)."""
    try:
        try:
            return _main(argv)
        finally:
            _flush(sys.stdout)  # output still buffered (argparse's --help) meets a closed pipe here
    except (StdoutClosed, BrokenPipeError):
        detach_stdout()
        return EXIT_STDOUT_CLOSED


def _flush(stream: Any) -> None:
    flush = getattr(stream, "flush", None)
    if flush is not None:
        flush()


def _main(argv: Sequence[str] | None) -> int:
    # -- demo: its own options and output (iceberg_sink/cli/demo.py).
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["demo"]:
        from iceberg_sink.cli import demo

        return demo.main(arguments[1:], prog="iceberg-sink demo")
    # -- end demo
    args = parser().parse_args(argv)
    progress = args.progress if args.progress is not None else (not args.json and sys.stdout.isatty())
    out = Output(json=args.json, progress_on=progress)
    try:
        result = COMMANDS[args.command].run(args, out)
    except StdoutClosed:
        raise
    except (Exception, KeyboardInterrupt) as e:
        code = exit_code(e)
        kind, line = describe(e)
        if args.debug:
            traceback.print_exc()
        emit(f"iceberg-sink {args.command}: {line}\n", sys.stderr)
        if args.json:
            error = {"type": kind, "message": line}
            emit(json.dumps({"command": args.command, "ok": False, "exit_code": code, "error": error}) + "\n")
        return code
    if args.json:
        emit(json.dumps({"command": args.command, "ok": True, **result}, default=str) + "\n")
    return EXIT_OK
