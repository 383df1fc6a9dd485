"""``iceberg-sink run CONFIG.yaml``: the config file is validated before Spark starts, every problem
named by its key path, with what was expected and what was received."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from iceberg_sink.cli import EXIT_NOT_FOUND, EXIT_USAGE, main, runconfig, runner

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "pipeline.yaml"


def problems(text: str) -> list[str]:
    with pytest.raises(runconfig.ConfigError) as raised:
        runconfig.parse(text, "p.yaml")
    return raised.value.problems


def test_the_documented_example_is_valid_and_paths_are_relative_to_it() -> None:
    config = runconfig.load(str(EXAMPLE))
    assert config.source["path"] == str(EXAMPLE.parent / "incoming")
    assert config.sink["embedded"] == str(EXAMPLE.parent / "lake")
    assert config.checkpoint_location == str(EXAMPLE.parent / "checkpoints" / "users")
    assert config.trigger == {"availableNow": True}


def test_every_problem_is_reported_at_once_with_its_key_path() -> None:
    found = problems(
        """
source: {type: files, path: in, format: avro, max_file_per_trigger: 2}
sink:
  table: 42
  compaction: {every_n_commit: 3, background: "yes"}
  upsert: {key: [1, 2]}
  create_if_missing: {partition_by: day(ts), format_version: 4}
  distribution_mode: spread
checkpoint_location: ck
trigger: {processingTime: "1 second", availableNow: true}
extra: 1
"""
    )
    assert "source.format: expected one of 'parquet', 'json', 'csv', received a string 'avro'" in found
    assert "source.max_file_per_trigger: unknown key; did you mean 'max_files_per_trigger'?" in found
    assert "sink.table: expected a non-empty string, received an integer 42" in found
    assert "sink.compaction.every_n_commit: unknown key; did you mean 'every_n_commits'?" in found
    assert "sink.compaction.background: expected true or false, received a string 'yes'" in found
    assert "sink.upsert.key: expected a list of strings, received a list [1, 2]" in found
    assert "sink.create_if_missing.format_version: expected 1, 2 or 3, received an integer 4" in found
    assert "sink.distribution_mode: expected one of 'none', 'hash', 'range', received a string 'spread'" in found
    assert any(p.startswith("trigger: expected one of processingTime, availableNow, once") for p in found)
    assert any(p.startswith("extra: unknown key; expected one of source, sink") for p in found)
    assert len(found) == 10, found


def test_missing_keys_and_wrong_shapes() -> None:
    assert problems("sink: {table: db.t}\n") == ["source: required, missing", "checkpoint_location: required, missing"]
    assert problems("- a\n- b\n")[0].startswith("(top level): expected a mapping (the pipeline) with keys source")
    found = problems("source: {type: kafka}\nsink: {table: db.t, upsert: {key: [id]}, cdc: {op_column: op}}\n")
    assert "source.bootstrap_servers: required, missing" in found
    assert (
        "source: expected one of topic (a topic name) or topic_pattern (a Java regular expression of topic names), "
        "received neither"
    ) in found
    assert "sink.cdc.op_column: required, missing" not in found  # given; key may be omitted (table/keys.py)
    assert "checkpoint_location: required, missing" in found
    found = problems("source: {type: rate}\nsink: {embedded: a}\ncheckpoint_location: c\n")
    assert found == ["sink: expected one of table (one table) or route (many tables), received neither"]
    found = problems("source: {type: rate}\nsink: {route: {namespace: n}}\ncheckpoint_location: c\n")
    assert found == ["sink.route.table_column: required, missing"]
    found = problems("source: {type: socket}\nsink: {table: db.t}\ncheckpoint_location: c\n")
    assert found == ["source.type: expected one of 'files', 'rate', 'kafka', received a string 'socket'"]
    found = problems(
        "source: {type: rate}\nsink: {table: db.t, embedded: a, catalog: {name: c}}\ncheckpoint_location: c\n"
    )
    assert found == ["sink: expected one of embedded or catalog, received both"]


def test_kafka_topic_or_topic_pattern() -> None:
    head = "source: {type: kafka, bootstrap_servers: 'b:9092', "
    tail = "}\nsink: {table: db.t}\ncheckpoint_location: c\n"
    assert runconfig.parse(head + "topic: t" + tail, "p.yaml").source["topic"] == "t"
    assert runconfig.parse(head + "topic_pattern: 'shop[.].*'" + tail, "p.yaml").source["topic_pattern"] == "shop[.].*"
    assert problems(head + "topic: t, topic_pattern: 'x.*'" + tail) == [
        "source: expected one of topic (a topic name) or topic_pattern (a Java regular expression of topic names), "
        "received both"
    ]


def test_yaml_syntax_errors_name_the_line() -> None:
    found = problems("source:\n  type: [rate\nsink: {}\n")
    assert len(found) == 1 and found[0].startswith("not valid YAML at line ")


def test_environment_variables_are_expanded_and_unset_ones_named() -> None:
    text = (
        "source: {type: rate}\ncheckpoint_location: c\n"
        "sink: {table: db.t, catalog: {name: c, properties: {uri: '${ICEBERG_SINK_TEST_URI}', token: '${ICEBERG_SINK_UNSET_X}'}}}\n"
    )
    os.environ["ICEBERG_SINK_TEST_URI"] = "http://rest:8181"
    try:
        found = problems(text)
        assert found == [
            "sink.catalog.properties.token: environment variable ICEBERG_SINK_UNSET_X is not set "
            "(used as ${ICEBERG_SINK_UNSET_X})"
        ]
        config = runconfig.parse(text.replace("${ICEBERG_SINK_UNSET_X}", "t0k"), "p.yaml")
        assert config.sink["catalog"]["properties"] == {"uri": "http://rest:8181", "token": "t0k"}
    finally:
        del os.environ["ICEBERG_SINK_TEST_URI"]


def test_the_builder_checks_values_the_file_cannot(tmp_path: Path) -> None:
    # Shapes are fine; the builder finds the partition column missing from the upsert key.
    config = runconfig.parse(
        f"source: {{type: rate}}\ncheckpoint_location: c\nsink: {{table: db.t, embedded: {tmp_path}, "
        "create_if_missing: {partition_by: [country]}, upsert: {key: [id]}, compaction: {max_group_bytes: 10}}\n",
        str(tmp_path / "p.yaml"),
    )
    with pytest.raises(runconfig.InvalidSinkConfigError, match="country"):
        runner.build_sink(config)


def test_identifier_fields_of_create_if_missing_reach_the_builder(tmp_path: Path) -> None:
    def sink(create: str, upsert: str) -> str:
        return f"source: {{type: rate}}\ncheckpoint_location: c\nsink: {{table: db.t, embedded: {tmp_path}, create_if_missing: {create}, upsert: {upsert}}}\n"

    with pytest.raises(runconfig.InvalidSinkConfigError) as found:
        runconfig.parse(sink("{identifier_fields: 'no'}", "{key: [id]}"), "p.yaml")
    assert "sink.create_if_missing.identifier_fields: expected true or false" in str(found.value)
    config = runconfig.parse(sink("{identifier_fields: false}", "{}"), "p.yaml")
    with pytest.raises(runconfig.InvalidSinkConfigError, match=r"create_if_missing\(identifier_fields=False\)"):
        runner.build_sink(config)  # no key=[...]: a table without identifier fields keeps no key
    built = runner.build_sink(runconfig.parse(sink("{identifier_fields: false}", "{key: [id]}"), "p.yaml"))
    assert built.config.create is not None and built.config.create.identifier_fields is False


def test_cli_reports_config_errors_in_one_line_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("source: {type: rate, rows_per_second: fast}\nsink: {table: db.t}\ncheckpoint_location: c\n")
    assert main(["run", str(bad)]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"iceberg-sink run: {bad}: source.rows_per_second: expected a positive integer, received a string 'fast'\n"
    )
    assert main(["run", str(tmp_path / "missing.yaml"), "--json"]) == EXIT_NOT_FOUND
    captured = capsys.readouterr()
    assert '"ok": false' in captured.out and '"exit_code": 3' in captured.out
    assert main(["run", str(EXAMPLE), "--validate-only", "--json"]) == 0
    assert capsys.readouterr().out.strip() == f'{{"command": "run", "ok": true, "config": "{EXAMPLE}", "valid": true}}'


def test_errors_have_no_stack_trace_unless_debug(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("source: {type: rate}\nsink: {table: db.t, brnch: x}\ncheckpoint_location: c\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "iceberg_sink.cli", "run", str(bad)]
    quiet = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert quiet.returncode == EXIT_USAGE and quiet.stdout == ""
    assert quiet.stderr == f"iceberg-sink run: {bad}: sink.brnch: unknown key; did you mean 'branch'?\n"
    loud = subprocess.run([*cmd, "--debug"], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert loud.returncode == EXIT_USAGE and "Traceback (most recent call last)" in loud.stderr
    assert loud.stderr.endswith(quiet.stderr)


# ---- --validate-only runs the builder's own checks; strict YAML -----------------------------------

_VALID_BASE = "source: {type: rate}\ncheckpoint_location: c\n"


@pytest.mark.parametrize(
    ("sink", "expected"),
    [
        ("{table: db.t, write_options: {write.target-file-sise-bytes: 10}}", "unknown write option"),
        ("{table: db.t, write_options: {iceberg-sink.writer.max-open-files: -4}}", "max-open-files"),
        ("{table: t}", "table name 't' holds no namespace"),
        ("{table: db.t, create_if_missing: {partition_by: [country]}, upsert: {key: [id]}}", "country"),
    ],
    ids=["unknown-option", "bad-option-value", "no-namespace", "key-without-partition-source"],
)
def test_validate_only_runs_the_builders_checks_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], sink: str, expected: str
) -> None:
    config = tmp_path / "p.yaml"
    config.write_text(_VALID_BASE + f"sink: {sink}\n")
    before = set(os.listdir(tmp_path))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(["run", str(config), "--validate-only"]) == EXIT_USAGE
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err
    assert "invalid sink configuration" in err and expected in err, err
    assert set(os.listdir(tmp_path)) == before  # no ./iceberg-sink-data, no catalog, no checkpoints


def test_validate_only_accepts_what_the_builder_accepts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "p.yaml"
    config.write_text(
        _VALID_BASE + "sink: {table: db.t, embedded: lake, write_options: {iceberg-sink.writer.max-open-files: 4}, "
        "create_if_missing: {partition_by: [country]}, upsert: {key: [id, country]}}\n"
    )
    assert main(["run", str(config), "--validate-only"]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out == f"{config}: valid\n"
    assert not (tmp_path / "lake").exists()


def test_a_key_given_twice_is_an_error_naming_it_and_both_lines() -> None:
    found = problems("source: {type: rate}\nsink:\n  table: db.a\n  table: db.b\ncheckpoint_location: c\n")
    assert found == [
        "not valid YAML at line 4, column 3: found duplicate key 'table' (first given at line 3); "
        "expected each key once"
    ]
    # Flow mappings and nested ones too; merge keys (<<) may be overridden, as YAML says.
    assert "duplicate key 'type'" in problems("source: {type: rate, type: files}\n")[0]
    config = runconfig.parse(
        "source: {type: rate}\nsink: {table: db.t}\ncheckpoint_location: c\nspark: {conf: {<<: {a: 1}, a: 2}}\n",
        "p.yaml",
    )
    assert config.data["spark"]["conf"] == {"a": 2}


def test_alias_expansion_is_bounded() -> None:
    import signal
    import time

    def too_slow(signum: int, frame: object) -> None:
        raise TimeoutError("the billion-laughs document was being expanded")

    signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(20)  # expanded, it never ends (10^9 strings): fail instead of hanging
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)]
    started = time.monotonic()
    try:
        found = problems("\n".join(lines) + "\nsource: *a9\n")
    finally:
        signal.alarm(0)
    assert time.monotonic() - started < 5
    assert len(found) == 1 and "aliases expand to more than 100000 nodes" in found[0], found
    assert "recursive" in problems("source: &r [*r]\n")[0]
    # Ordinary anchors still work.
    config = runconfig.parse(
        "source: {type: rate}\nsink: {table: db.t}\ncheckpoint_location: c\nspark: {conf: {x: &x v, y: *x}}\n",
        "p.yaml",
    )
    assert config.data["spark"]["conf"] == {"x": "v", "y": "v"}


def test_route_allow_is_accepted_and_checked(tmp_path: Path) -> None:
    # issue 18: a routed sink writes its namespace's tables, or those `allow` lists.
    config = runconfig.parse(
        f"source: {{type: rate}}\ncheckpoint_location: c\nsink: {{embedded: {tmp_path}, create_if_missing: {{}}, "
        "route: {table_column: tbl, namespace: cdc, allow: ['orders_*', audit.log]}}\n",
        str(tmp_path / "p.yaml"),
    )
    route = runner.build_sink(config).config.route
    assert route is not None and route.allow == ("orders_*", "audit.log") and route.namespace == "cdc"
    found = problems("source: {type: rate}\ncheckpoint_location: c\nsink: {route: {table_column: t, allow: [1]}}\n")
    assert [p.split(":")[0] for p in found] == ["sink.route.allow"], found
    bad = runconfig.parse(
        f"source: {{type: rate}}\ncheckpoint_location: c\nsink: {{embedded: {tmp_path}, route: {{table_column: t}}}}\n",
        str(tmp_path / "p.yaml"),
    )
    with pytest.raises(runconfig.InvalidSinkConfigError, match=r"route: expected namespace= .* or allow="):
        runner.build_sink(bad)


def test_upsert_order_by_is_a_column_name_the_builder_gets(tmp_path: Path) -> None:
    found = problems(
        "source: {type: rate}\ncheckpoint_location: c\nsink: {table: db.t, upsert: {key: [id], order_by: 7}}\n"
    )
    assert any(p.startswith("sink.upsert.order_by: expected a non-empty string") for p in found), found
    config = runconfig.parse(
        f"source: {{type: rate}}\ncheckpoint_location: c\nsink: {{table: db.t, embedded: {tmp_path}, "
        "upsert: {key: [id], key_column: id, order_by: id}}\n",
        str(tmp_path / "p.yaml"),
    )
    # The file's shape is right; the builder names what it refuses (here key_column before order_by).
    with pytest.raises(runconfig.InvalidSinkConfigError, match=r"upsert\(key_column\)"):
        runner.build_sink(config)


def test_debezium_order_takes_one_path_or_several_with_their_types(tmp_path: Path) -> None:
    """MariaDB and MySQL order by binlog file, position and row: ``order_by`` and ``order_type``
    take lists (a single string stays one path, or one type for every path)."""
    text = (
        f"source: {{type: rate}}\ncheckpoint_location: c\nsink: {{table: db.t, embedded: {tmp_path}, "
        "debezium: {order_by: [source.file, source.pos, source.row], order_type: [binlog, long, long], "
        "order_column: binlog}, cdc: {op_column: op, key: [id], order_by: binlog}}\n"
    )
    config = runconfig.parse(text, str(tmp_path / "p.yaml"))
    assert config.sink["debezium"]["order_by"] == ["source.file", "source.pos", "source.row"]
    assert config.sink["debezium"]["order_type"] == ["binlog", "long", "long"]
    runner.validate_sink(config)
    single = runconfig.parse(text.replace("order_type: [binlog, long, long]", "order_type: long"), "p.yaml")
    assert single.sink["debezium"]["order_type"] == "long"
    runner.validate_sink(single)
    found = problems(
        text.replace("[source.file, source.pos, source.row]", "[]").replace("[binlog, long, long]", "[long, 5]")
    )
    assert [p.split(":")[0] for p in found] == ["sink.debezium.order_by", "sink.debezium.order_type"], found
    assert all("expected a non-empty string or a non-empty list of them" in p for p in found), found
    # The shape is right, the counts are not: the builder names both.
    wrong = runconfig.parse(text.replace("[binlog, long, long]", "[binlog, long]"), "p.yaml")
    with pytest.raises(runconfig.InvalidSinkConfigError, match=r"one order type or one per path"):
        runner.validate_sink(wrong)


def test_debezium_transactions_is_ignore_or_consistent(tmp_path: Path) -> None:
    text = (
        f"source: {{type: rate}}\ncheckpoint_location: c\nsink: {{table: db.t, embedded: {tmp_path}, "
        "debezium: {transactions: consistent}, cdc: {op_column: op, key: [id], order_by: lsn}}\n"
    )
    config = runconfig.parse(text, str(tmp_path / "p.yaml"))
    assert config.sink["debezium"]["transactions"] == "consistent"
    runner.validate_sink(config)
    found = problems(text.replace("consistent", "whole"))
    assert len(found) == 1 and found[0].startswith("sink.debezium.transactions") and "'whole'" in found[0], found


@pytest.mark.parametrize(
    "location", ["file:/data/ck", "file:///data/ck", "hdfs://nn:8020/ck", "s3a://b/ck", "/data/ck"]
)
def test_locations_with_a_scheme_or_absolute_are_kept_as_written(location: str) -> None:
    # 'file:/data/ck' (Spark's spelling of a local folder) was joined to the config's folder.
    text = f"source: {{type: files, path: '{location}', format: json}}\nsink: {{table: db.t}}\n"
    config = runconfig.parse(text + f"checkpoint_location: '{location}'\n", "/etc/p.yaml")
    assert config.checkpoint_location == location
    assert config.source["path"] == location
