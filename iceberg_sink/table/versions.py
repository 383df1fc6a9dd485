"""Which work each Iceberg format version takes from the sink, checked when the sink is built.

Format versions 1 and 2 take what they always took (upserts, CDC and equality-delete conversion need
2). Format version 3 takes appends and compaction (which carries row lineage into the rewritten
files), but no upserts or conversions yet: its deletes are deletion vectors, which the sink does not
commit yet (docs/format-v3.md). Each refusal says what was expected, what was received and what to do.
"""

from __future__ import annotations

from iceberg_sink._iceberg import V3_CHANGES_REFUSAL, V3_CONVERSION_REFUSAL
from iceberg_sink.errors import InvalidSinkConfigError

NO_DELETES_FORMAT_VERSIONS = (3,)
"""Format versions the sink takes no delete-writing work for (upserts, CDC, conversion)."""


def version_problems(where: str, format_version: int, changes: object, conversion: object) -> list[str]:
    """The configured work a table of ``format_version`` cannot take. ``where`` names where the
    version comes from: ``"create_if_missing"`` or a table name. Empty for versions 1 and 2 (their
    own checks stay in the builder)."""
    if format_version not in NO_DELETES_FORMAT_VERSIONS:
        return []
    if where == "create_if_missing":
        received = f"create_if_missing(format_version) received {format_version}"
    else:
        received = f"table {where} has format version {format_version}"
    problems = []
    if changes is not None:
        problems.append(f"upsert/CDC: expected format version 2, {received} ({V3_CHANGES_REFUSAL})")
    if conversion is not None:
        problems.append(f"convert_equality_deletes: expected format version 2, {received} ({V3_CONVERSION_REFUSAL})")
    return problems


def refuse_format_version(table: str, format_version: int, changes: object, conversion: object) -> None:
    """Raise :class:`InvalidSinkConfigError` naming every configured work existing ``table`` cannot take."""
    problems = version_problems(table, format_version, changes, conversion)
    if problems:
        raise InvalidSinkConfigError("invalid sink configuration: " + "; ".join(problems))
