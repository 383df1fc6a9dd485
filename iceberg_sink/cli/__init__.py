"""The command line, ``iceberg-sink``: the operator's face of the library.

main.py parses the commands and maps errors to exit codes; runconfig.py validates and runs a YAML
pipeline (``iceberg-sink run``); inspection.py reads a table's and a checkpoint location's state
(``inspect``); demo.py is the generated CDC pipeline of ``iceberg-sink demo``. Nothing outside this
package imports it: the library works without the command line.
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
