"""Settings of the equality-delete conversion: triggers and where it runs, validated once."""

from __future__ import annotations

import attrs

from iceberg_sink.errors import InvalidSinkConfigError


def _positive_or_none(name: str, value: object) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
        raise InvalidSinkConfigError(
            f"convert_equality_deletes({name}): expected a positive integer or None, received {value!r}"
        )


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
        for name in ("every_n_commits", "equality_delete_records", "delete_files"):
            _positive_or_none(name, getattr(self, name))
        if not isinstance(self.background, bool):
            raise InvalidSinkConfigError(
                f"convert_equality_deletes(background): expected True or False, received {self.background!r}"
            )
        if not isinstance(self.max_replans, int) or isinstance(self.max_replans, bool) or self.max_replans < 0:
            raise InvalidSinkConfigError(
                f"convert_equality_deletes(max_replans): expected an integer >= 0, received {self.max_replans!r}"
            )

    @property
    def has_trigger(self) -> bool:
        return any(v is not None for v in (self.every_n_commits, self.equality_delete_records, self.delete_files))
