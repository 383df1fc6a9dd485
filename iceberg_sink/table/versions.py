"""Upgrading a table's Iceberg format version: v2 to v3 (``_iceberg/v3_metadata.py``).

Format versions 1 and 2 take what they always took (upserts, CDC and equality-delete conversion need
2). Format version 3 takes all of it: appends, upserts/CDC (their deletes are committed as deletion
vectors, committer/vectors.py), equality-delete conversion (into deletion vectors) and compaction
(which carries row lineage into the rewritten files); see docs/format-v3.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from pyiceberg.table.update import AssertTableUUID

from iceberg_sink._iceberg.producer import commit_metadata
from iceberg_sink._iceberg.v3_metadata import UPGRADABLE_FORMAT_VERSIONS, UpgradeToV3
from iceberg_sink.errors import InvalidSinkConfigError, UnsupportedTableError

logger = logging.getLogger(__name__)

UPGRADE_ATTEMPTS = 5


def upgrade_format_version(load_table: Callable[[], Table], format_version: int) -> Table:
    """Upgrade the table to ``format_version`` (3, from 2) in one metadata-only commit; returns the
    table as of that commit (unchanged when it already has that version).

    As Iceberg Java's ``upgradeFormatVersion``: only the format version changes, ``next-row-id``
    starts at 0, and existing rows get row ids from the next snapshot on. Delete files stay: v3
    keeps equality deletes and reads v2 position delete files (Java does not refuse either), and a
    compaction applies and removes them; an equality-delete conversion turns the equality deletes
    into deletion vectors.

    Raises:
        InvalidSinkConfigError: ``format_version`` is not 3.
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
        try:
            return commit_metadata(table, (AssertTableUUID(uuid=table.metadata.table_uuid),), (UpgradeToV3(),))
        except CommitFailedException:
            # Another writer committed first: the upgrade commutes with any commit, so load and retry.
            logger.info("upgrade of table %s lost a race with another commit (attempt %s)", name, attempt + 1)
    raise CommitFailedException(
        f"upgrade of table {'.'.join(load_table().name())}: other commits won {UPGRADE_ATTEMPTS} races; try again"
    )
