"""The command line, ``iceberg-sink``: the operator's face of the library.

main.py parses the commands and maps errors to exit codes; commands.py registers the subcommands
(``@command``) and holds ``run``, ``inspect`` and ``compact``; maintenance_commands.py holds the
table-maintenance commands (``convert-equality-deletes``, ``expire-snapshots``, ``remove-orphans``,
``rewrite-manifests``, ``upgrade-format-version``); where.py finds a command's table (and never
creates a catalog by looking); output.py prints every line (and stops quietly when stdout's reader
is gone); runconfig.py reads and validates a YAML pipeline (``iceberg-sink run``, its YAML read by
safeyaml.py, its values checked with checks.py) and runner.py builds and runs it; inspection.py
reads a table's and a checkpoint location's state (``inspect``); demo.py is the generated CDC
pipeline of ``iceberg-sink demo``. Nothing outside this package imports it: the library works
without the command line.
"""

from iceberg_sink.cli.main import (
    EXIT_CODES,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_STDOUT_CLOSED,
    EXIT_USAGE,
    main,
    parser,
)

__all__ = [
    "EXIT_CODES",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_STDOUT_CLOSED",
    "EXIT_USAGE",
    "main",
    "parser",
]
