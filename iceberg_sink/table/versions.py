"""Which work each Iceberg format version takes from the sink, checked when the sink is built.

Format versions 1 and 2 take what they always took (upserts, CDC and equality-delete conversion need
2). Format version 3 takes appends, upserts/CDC (their deletes are committed as deletion vectors,
committer/vectors.py) and compaction (which carries row lineage into the rewritten files); it refuses
equality-delete conversion, since v3 forbids position delete files (docs/format-v3.md). Each refusal
says what was expected, what was received and what to do.

:func:`upgrade_format_version` upgrades a v2 table to v3 (``_iceberg/v3_metadata.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from pyiceberg.table.update import AssertTableUUID

from iceberg_sink._iceberg import V3_CONVERSION_REFUSAL
from iceberg_sink._iceberg.producer import commit_metadata
from iceberg_sink._iceberg.v3_metadata import UPGRADABLE_FORMAT_VERSIONS, UpgradeToV3
from iceberg_sink.errors import InvalidSinkConfigError, UnsupportedTableError

logger = logging.getLogger(__name__)

UPGRADE_ATTEMPTS = 5

NO_DELETES_FORMAT_VERSIONS = (3,)
"""Format versions that take no equality-delete conversion (it writes position delete files)."""


def version_problems(where: str, format_version: int, changes: object, conversion: object) -> list[str]:
    """The configured work a table of ``format_version`` cannot take (``changes``, upsert/CDC, is
    taken by every version from 2 and kept in the signature for the builder's checks). ``where`` names where the
    version comes from: ``"create_if_missing"`` or a table name. Empty for versions 1 and 2 (their
    own checks stay in the builder)."""
    if format_version not in NO_DELETES_FORMAT_VERSIONS:
        return []
    if where == "create_if_missing":
        received = f"create_if_missing(format_version) received {format_version}"
    else:
        received = f"table {where} has format version {format_version}"
    problems = []
    if conversion is not None:
        problems.append(f"convert_equality_deletes: expected format version 2, {received} ({V3_CONVERSION_REFUSAL})")
    return problems


def refuse_format_version(table: str, format_version: int, changes: object, conversion: object) -> None:
    """Raise :class:`InvalidSinkConfigError` naming every configured work existing ``table`` cannot take."""
    problems = version_problems(table, format_version, changes, conversion)
    if problems:
        raise InvalidSinkConfigError("invalid sink configuration: " + "; ".join(problems))


def upgrade_format_version(
    load_table: Callable[[], Table], format_version: int, changes: object = None, conversion: object = None
) -> Table:
    """Upgrade the table to ``format_version`` (3, from 2) in one metadata-only commit; returns the
    table as of that commit (unchanged when it already has that version).

    As Iceberg Java's ``upgradeFormatVersion``: only the format version changes, ``next-row-id``
    starts at 0, and existing rows get row ids from the next snapshot on. Delete files stay: v3
    keeps equality deletes and reads v2 position delete files (Java does not refuse either), and a
    compaction applies and removes them. ``changes`` and ``conversion`` are the sink's configured
    work: work a v3 table cannot take yet refuses the upgrade rather than the next commit.

    Raises:
        InvalidSinkConfigError: ``format_version`` is not 3, or the sink is configured for work v3 refuses.
        UnsupportedTableError: the table's format version cannot be upgraded (v1; or newer than asked).
        CommitFailedException: other writers kept committing through every attempt; try again.
    """
    if format_version != 3:
        raise InvalidSinkConfigError(f"upgrade_format_version: expected format version 3, received {format_version}")
    for attempt in range(UPGRADE_ATTEMPTS):
        table = load_table()
        name = ".".join(table.name())
        current = table.metadata.format_version
        if current == format_version:
            return table
        if current not in UPGRADABLE_FORMAT_VERSIONS:
            raise UnsupportedTableError(
                f"upgrade of table {name} to format version {format_version}: expected format version "
                f"{' or '.join(map(str, UPGRADABLE_FORMAT_VERSIONS))}, received {current}"
                + (" (upgrade it to 2 first)" if current < 2 else "")
            )
        problems = version_problems(f"{name} after the upgrade", format_version, changes, conversion)
        if problems:
            raise InvalidSinkConfigError(
                f"upgrade of table {name} to format version {format_version} refused, this sink is configured for "
                "work a v3 table refuses: " + "; ".join(problems)
            )
        try:
            return commit_metadata(table, (AssertTableUUID(uuid=table.metadata.table_uuid),), (UpgradeToV3(),))
        except CommitFailedException:
            # Another writer committed first: the upgrade commutes with any commit, so load and retry.
            logger.info("upgrade of table %s lost a race with another commit (attempt %s)", name, attempt + 1)
    raise CommitFailedException(
        f"upgrade of table {'.'.join(load_table().name())}: other commits won {UPGRADE_ATTEMPTS} races; try again"
    )
