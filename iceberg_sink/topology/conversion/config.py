"""Settings of the equality-delete conversion: triggers and where it runs, validated once."""

from __future__ import annotations

import attrs

from iceberg_sink.errors import InvalidSinkConfigError
from iceberg_sink.topology import arguments

# Checked where every maintenance argument is (topology/arguments.py).
_POSITIVE = {
    name: arguments.Number(name, "", integer=True, minimum=1)
    for name in ("every_n_commits", "equality_delete_records", "delete_files")
}


@attrs.frozen
class ConversionConfig:
    """When to convert equality deletes into position deletes.

    Triggers (any one starts a conversion after a commit; read from the committed snapshot's
    summary, so checking them costs nothing):
        every_n_commits: after this many commits since the last conversion started.
        equality_delete_records: when the branch holds more than this many live equality-delete rows
            (summary ``total-equality-deletes``).
        delete_files: when the branch holds more than this many live delete files of any kind
            (summary ``total-delete-files``; converted tables keep about one per data file with deletes).

    Running:
        background: run on a background thread of the driver (default), so the stream's commits are
            never blocked; False runs it between micro-batches.
        max_replans: how often a conversion whose plan was invalidated by a concurrent commit
            (compaction removed a file it converts) plans again before giving up for this run.
    """

    every_n_commits: int | None = None
    equality_delete_records: int | None = None
    delete_files: int | None = None
    background: bool = True
    max_replans: int = 3

    def __attrs_post_init__(self) -> None:
        for name, number in _POSITIVE.items():
            number.check_optional(getattr(self, name), "convert_equality_deletes")
        if not isinstance(self.background, bool):
            raise InvalidSinkConfigError(
                f"convert_equality_deletes(background): expected True or False, received {self.background!r}"
            )
        arguments.MAX_REPLANS.check(self.max_replans, "convert_equality_deletes")

    @property
    def has_trigger(self) -> bool:
        return any(v is not None for v in (self.every_n_commits, self.equality_delete_records, self.delete_files))
