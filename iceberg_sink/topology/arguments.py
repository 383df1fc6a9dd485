"""The numeric arguments of every maintenance job and CLI command, checked in one place.

Each argument is declared once, as a :class:`Number`: its API name, its CLI option, whether it is
an integer, and its bounds. The maintenance APIs (topology/maintenance.py, compaction and conversion
configs) call :meth:`Number.check`, which raises :class:`InvalidSinkConfigError` naming the argument;
the CLI parses the option with :meth:`Number.parse` (argparse ``type=``), which makes argparse exit
with code 2 naming the option. Booleans, NaN, infinities, numbers below the minimum (zero where zero
means nothing) and above the maximum are refused, never passed on to fail later with a raw error (or,
worse, to commit something: ``entries_per_manifest=-3`` once wrote a snapshot without manifests).
"""

from __future__ import annotations

import argparse
import math

import attrs

from iceberg_sink.errors import InvalidSinkConfigError

HOURS_MAX = 24 * 365 * 100
"""The largest age in hours (100 years): beyond it, ``now - age`` leaves the range of a datetime."""


@attrs.frozen
class Number:
    """One numeric argument.

    Attributes:
        name: the API argument (``entries_per_manifest``).
        option: the CLI option (``--entries-per-manifest``).
        integer: whether only integers are accepted.
        minimum: the smallest value accepted.
        maximum: the largest value accepted (None: no bound besides being finite).
        meaning: what the value is, for messages (``entries per manifest``).
    """

    name: str
    option: str
    integer: bool
    minimum: float
    maximum: float | None = None
    meaning: str = ""

    def expected(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        bound = f"at least {_show(self.minimum)}"
        if self.maximum is not None:
            bound = f"from {_show(self.minimum)} to {_show(self.maximum)}"
        return f"{kind} {bound}" + (f" ({self.meaning})" if self.meaning else "")

    def problem(self, value: object) -> str | None:
        """Why ``value`` is refused, or None when it is accepted."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"expected {self.expected()}, received {value!r}"
        if self.integer and not isinstance(value, int):
            return f"expected {self.expected()}, received {value!r}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"expected {self.expected()}, received {value!r}"
        if value < self.minimum or (self.maximum is not None and value > self.maximum):
            return f"expected {self.expected()}, received {value!r}"
        return None

    def check(self, value: object, what: str = "") -> None:
        """Refuse ``value`` for the API.

        Raises:
            InvalidSinkConfigError: naming the argument (``what(name)`` when ``what`` is given), what
                was expected and what was received.
        """
        problem = self.problem(value)
        if problem is not None:
            label = f"{what}({self.name})" if what else self.name
            raise InvalidSinkConfigError(f"{label}: {problem}")

    def check_optional(self, value: object, what: str = "") -> None:
        """:meth:`check`, with None accepted (the default applies)."""
        if value is not None:
            self.check(value, what)

    def parse(self, text: str) -> int | float:
        """The CLI's parser of the option (argparse ``type=``); argparse names the option in its error
        and exits with code 2."""
        try:
            value: int | float = int(text) if self.integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {self.expected()}, received {text!r}") from None
        problem = self.problem(value)
        if problem is not None:
            raise argparse.ArgumentTypeError(problem.replace(f"received {value!r}", f"received {text!r}"))
        return value


def _show(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


# ---- the maintenance jobs' arguments ------------------------------------------------------------

ENTRIES_PER_MANIFEST = Number(
    "entries_per_manifest", "--entries-per-manifest", integer=True, minimum=1, meaning="entries per merged manifest"
)
RETAIN_LAST = Number("retain_last", "--retain-last", integer=True, minimum=1, meaning="snapshots kept per branch")
EXPIRE_OLDER_THAN_HOURS = Number(
    "older_than_hours", "--older-than-hours", integer=False, minimum=0, maximum=HOURS_MAX, meaning="hours"
)
ORPHAN_OLDER_THAN_HOURS = Number(
    "older_than_hours",
    "--older-than-hours",
    integer=False,
    minimum=1,
    maximum=HOURS_MAX,
    meaning="hours; files of writes in flight are not referenced yet",
)
MAX_REPLANS = Number("max_replans", "--max-replans", integer=True, minimum=0, meaning="plans redone on conflict")
MIN_INPUT_FILES = Number("min_input_files", "--min-input-files", integer=True, minimum=1, meaning="files per group")
TARGET_FILE_SIZE_BYTES = Number(
    "target_file_size_bytes", "--target-file-size-bytes", integer=True, minimum=1, meaning="bytes"
)
LIMIT = Number("limit", "--limit", integer=True, minimum=0, meaning="snapshots shown; 0: all")
TIMEOUT = Number("timeout", "--timeout", integer=False, minimum=0.001, meaning="seconds")
MAX_BATCHES = Number("max_batches", "--max-batches", integer=True, minimum=1, meaning="micro-batches")
