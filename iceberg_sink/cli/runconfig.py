"""``iceberg-sink run CONFIG.yaml``: the YAML file describing a streaming pipeline, read and validated.

The whole file is validated before Spark starts; every problem is reported at once, each naming its
key path (``sink.compaction.every_n_commits``), what was expected and what was received, with a
close-match suggestion for unknown keys. Relative paths (``source.path``, ``sink.embedded``,
``checkpoint_location``) are relative to the config file's folder; ``${NAME}`` in any string is
replaced by the environment variable NAME (keep credentials out of the file). See docs/cli.md.

The checks it is built from are in checks.py; runner.py builds the sink and the source from a
:class:`RunConfig` and runs the pipeline.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import attrs

from iceberg_sink.cli.checks import (
    BOOL,
    NON_NEGATIVE_INT,
    POSITIVE_INT,
    POSITIVE_NUMBER,
    STRING,
    _problem,
    bool_or,
    mapping,
    one_of,
    scalar_map,
    secret_map,
    string_list,
    string_or_list,
    typed,
)
from iceberg_sink.errors import InvalidSinkConfigError
from iceberg_sink.vocab.locations import is_uri


class ConfigError(InvalidSinkConfigError):
    """The config file is invalid: one problem per line, each naming its key path."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


_COMPACTION = mapping(
    {
        "every_n_commits": POSITIVE_INT,
        "small_files_per_partition": POSITIVE_INT,
        "small_files_bytes": POSITIVE_INT,
        "every_seconds": POSITIVE_NUMBER,
        "delete_files": POSITIVE_INT,
        "delete_records": POSITIVE_INT,
        "background": BOOL,
        "target_file_size_bytes": POSITIVE_INT,
        "min_file_size_bytes": POSITIVE_INT,
        "max_group_bytes": POSITIVE_INT,
        "min_input_files": POSITIVE_INT,
        "delete_file_threshold": POSITIVE_INT,
        "max_replans": NON_NEGATIVE_INT,
    }
)
_CONVERSION = mapping(
    {
        "every_n_commits": POSITIVE_INT,
        "equality_delete_records": POSITIVE_INT,
        "delete_files": POSITIVE_INT,
        "background": BOOL,
        "max_replans": NON_NEGATIVE_INT,
    }
)
_SINK = mapping(
    {
        "table": STRING,
        "embedded": STRING,
        "catalog": mapping({"name": STRING, "properties": secret_map}, required=("name",), secret=True),
        "create_if_missing": bool_or(
            mapping(
                {
                    "partition_by": string_list,
                    "properties": scalar_map,
                    "format_version": typed("1, 2 or 3", lambda v: v in (1, 2, 3) and not isinstance(v, bool)),
                    "identifier_fields": BOOL,
                }
            )
        ),
        "distribution_mode": one_of("none", "hash", "range"),
        "branch": STRING,
        "write_options": scalar_map,
        "max_pending_checkpoints": POSITIVE_INT,
        "upsert": mapping({"key": string_list, "key_column": STRING, "order_by": STRING}),
        "cdc": mapping(
            {"op_column": STRING, "key": string_list, "order_by": STRING, "key_column": STRING}, required=("op_column",)
        ),
        "compaction": _COMPACTION,
        "convert_equality_deletes": bool_or(_CONVERSION),
        "route": mapping(
            {"table_column": STRING, "namespace": STRING, "allow": string_list}, required=("table_column",)
        ),
        "schema_evolution": one_of("off", "add-columns", "add-and-widen"),
        "dead_letter": STRING,
        "atomic_commits": one_of("auto", "required", "off"),
        "debezium": bool_or(
            mapping(
                {
                    "value_column": STRING,
                    "op_column": STRING,
                    "order_by": string_or_list,
                    "order_column": STRING,
                    "order_type": string_or_list,
                    "table_column": STRING,
                    "table_fields": string_list,
                    "keep": string_list,
                    "key_from": STRING,
                    "key_column": STRING,
                    "truncate": one_of("apply", "skip", "fail"),
                    "unavailable_value": STRING,
                    "transactions": one_of("ignore", "consistent"),
                }
            )
        ),
    },
)
_FILES = {
    "type": one_of("files"),
    "path": STRING,
    "format": one_of("parquet", "json", "csv"),
    "schema": STRING,
    "options": scalar_map,
    "max_files_per_trigger": POSITIVE_INT,
}
_RATE = {
    "type": one_of("rate"),
    "rows_per_second": POSITIVE_INT,
    "num_partitions": POSITIVE_INT,
    "columns": scalar_map,
}
_KAFKA = {
    "type": one_of("kafka"),
    "bootstrap_servers": STRING,
    "topic": STRING,
    "topic_pattern": STRING,
    "starting_offsets": STRING,
    "value_format": one_of("json", "raw"),
    "schema": STRING,
    "options": scalar_map,
}
_SOURCES = {"files": _FILES, "rate": _RATE, "kafka": _KAFKA}


def _source(value: Any, path: str, problems: list[str]) -> Any:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in _SOURCES:
        if isinstance(value, dict):
            problems.append(_problem(f"{path}.type", "one of 'files', 'rate', 'kafka'", kind))
        else:
            problems.append(_problem(path, "a mapping with a type (files, rate or kafka)", value))
        return value
    required = {"files": ("path", "format"), "rate": (), "kafka": ("bootstrap_servers",)}[kind]
    checked: dict[str, Any] = mapping(_SOURCES[kind], required=required)(value, path, problems)
    if kind == "kafka" and isinstance(checked, dict) and ("topic" in checked) == ("topic_pattern" in checked):
        problems.append(
            f"{path}: expected one of topic (a topic name) or topic_pattern (a Java regular expression of topic "
            "names), received " + ("both" if "topic" in checked else "neither")
        )
    if kind == "kafka" and checked.get("value_format") == "json" and "schema" not in checked:
        problems.append(f"{path}.schema: required with value_format json (a DDL string such as 'id long, v string')")
    return checked


def _trigger(value: Any, path: str, problems: list[str]) -> Any:
    fields = {"processingTime": STRING, "availableNow": BOOL, "once": BOOL}
    checked = mapping(fields)(value, path, problems)
    if isinstance(checked, dict) and len(checked) > 1:
        problems.append(_problem(path, "one of processingTime, availableNow, once", value))
    return checked


_TOP = mapping(
    {
        "source": _source,
        "sink": _SINK,
        "checkpoint_location": STRING,
        "trigger": _trigger,
        "stop": mapping({"timeout_seconds": POSITIVE_NUMBER, "max_batches": POSITIVE_INT}),
        "query_name": STRING,
        "spark": mapping({"master": STRING, "app_name": STRING, "conf": secret_map}),
    },
    required=("source", "sink", "checkpoint_location"),
    what="a mapping (the pipeline)",
)

_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand(value: Any, path: str, problems: list[str]) -> Any:
    """``${NAME}`` in strings replaced by environment variables; unset ones are problems."""
    if isinstance(value, dict):
        return {k: _expand(v, f"{path}.{k}" if path else str(k), problems) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{path}[{i}]", problems) for i, v in enumerate(value)]
    if isinstance(value, str):

        def env(match: re.Match[str]) -> str:
            name = match[1]
            if name not in os.environ:
                problems.append(f"{path}: environment variable {name} is not set (used as ${{{name}}})")
                return ""
            return os.environ[name]

        return _ENV.sub(env, value)
    return value


@attrs.frozen
class RunConfig:
    """A validated pipeline config. ``data`` holds the checked mapping with paths made absolute."""

    data: dict[str, Any]
    source_file: str

    @property
    def source(self) -> dict[str, Any]:
        return dict(self.data["source"])

    @property
    def sink(self) -> dict[str, Any]:
        return dict(self.data["sink"])

    @property
    def checkpoint_location(self) -> str:
        return str(self.data["checkpoint_location"])

    @property
    def trigger(self) -> dict[str, Any]:
        return dict(self.data.get("trigger") or {})

    @property
    def stop(self) -> dict[str, Any]:
        return dict(self.data.get("stop") or {})


def _absolute(value: str, base: Path) -> str:
    # A location with a scheme (file:/ck, Spark's spelling of a local folder) is read as Spark reads it.
    if is_uri(value) or os.path.isabs(value):
        return value
    return str((base / value).resolve())


def parse(text: str, source_file: str) -> RunConfig:
    """Parse and validate a config; raises :class:`ConfigError` listing every problem."""
    import yaml

    from iceberg_sink.cli import safeyaml

    try:
        raw = safeyaml.load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(source_file, [f"not valid YAML{where}: {problem}"]) from None
    problems: list[str] = []
    expanded = _expand(raw, "", problems)
    data = _TOP(expanded, "", problems)
    if not problems:
        sink = data["sink"]
        if "embedded" in sink and "catalog" in sink:
            problems.append("sink: expected one of embedded or catalog, received both")
        if "upsert" in sink and "cdc" in sink:
            problems.append("sink: expected one of upsert or cdc, received both")
        if ("table" in sink) == ("route" in sink):
            problems.append(
                "sink: expected one of table (one table) or route (many tables), received "
                + ("both" if "table" in sink else "neither")
            )
    if problems:
        raise ConfigError(source_file, problems)
    base = Path(source_file).absolute().parent
    data["checkpoint_location"] = _absolute(data["checkpoint_location"], base)
    if "embedded" in data["sink"]:
        data["sink"]["embedded"] = _absolute(data["sink"]["embedded"], base)
    if data["source"]["type"] == "files":
        data["source"]["path"] = _absolute(data["source"]["path"], base)
    return RunConfig(data, source_file)


def load(path: str) -> RunConfig:
    """Read and validate a config file."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidSinkConfigError(f"config file {path} cannot be read: {e}") from None
    return parse(text, path)
