"""The command line creates nothing by looking, says where it looked, and stops quietly when the
reader of its output goes away (``iceberg-sink inspect t --json | head``), for every command.

Real embedded catalog (SQLite + local warehouse), the real ``python -m iceberg_sink.cli`` behind a
real pipe; no Spark is needed (every command here stops before it would start one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from iceberg_sink.cli import EXIT_NOT_FOUND, EXIT_OK, EXIT_STDOUT_CLOSED, main
from iceberg_sink.table.catalog import CatalogConfig
from tests.helpers import driver_env

ROOT = Path(__file__).resolve().parents[2]

# Every command that works on an existing table, read-only or not, as the user types it.
TABLE_COMMANDS = [
    ["inspect", "db.t"],
    ["inspect", "--checkpoint-location", "ck"],
    ["compact", "db.t", "--dry-run"],
    ["compact", "db.t"],
    ["expire-snapshots", "db.t", "--dry-run"],
    ["expire-snapshots", "db.t"],
    ["remove-orphans", "db.t", "--dry-run"],
    ["remove-orphans", "db.t"],
    ["convert-equality-deletes", "db.t"],
    ["rewrite-manifests", "db.t"],
    ["upgrade-format-version", "db.t"],
]


def _lake(root: Path) -> Path:
    """An embedded catalog holding table db.t with one snapshot."""
    catalog = CatalogConfig.embedded(root).load()
    catalog.create_namespace("db")
    table = catalog.create_table("db.t", pa.schema([("id", pa.int64()), ("v", pa.string())]))
    table.append(pa.table({"id": [1, 2], "v": ["a", "b"]}))
    return root


@pytest.mark.parametrize("command", TABLE_COMMANDS, ids=lambda c: " ".join(c))
def test_no_command_creates_a_catalog_by_looking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main([*command, "--json"]) == EXIT_NOT_FOUND
    error = json.loads(capsys.readouterr().out)["error"]["message"]
    default = tmp_path / "iceberg-sink-data"
    assert error.startswith(f"no embedded catalog at {default} (expected its catalog.db there); without --embedded")
    assert list(tmp_path.iterdir()) == []  # no ./iceberg-sink-data, no catalog.db, no warehouse

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([*command, "--embedded", str(empty)]) == EXIT_NOT_FOUND
    assert f"no embedded catalog at {empty} (expected its catalog.db there)" in capsys.readouterr().err
    assert list(empty.iterdir()) == []


def test_a_missing_table_names_the_catalog_looked_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = _lake(tmp_path / "lake")
    assert main(["inspect", "db.nope", "--embedded", str(lake)]) == EXIT_NOT_FOUND
    assert (
        capsys.readouterr().err
        == f"iceberg-sink inspect: table db.nope does not exist in the embedded catalog at {lake}\n"
    )
    _lake(tmp_path / "iceberg-sink-data")
    monkeypatch.chdir(tmp_path)
    assert main(["compact", "db.nope", "--dry-run"]) == EXIT_NOT_FOUND
    assert capsys.readouterr().err == (
        f"iceberg-sink compact: table db.nope does not exist in the embedded catalog at {tmp_path / 'iceberg-sink-data'}"
        ", the default without --embedded DIR or --catalog NAME\n"
    )
    assert main(["inspect", "db.t"]) == EXIT_OK  # the default folder is still found
    assert "db.t" in capsys.readouterr().out


def _closed_pipe_run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the CLI with stdout a pipe whose reader is already gone (what ``| head`` leaves behind)."""
    env = driver_env(str(ROOT))
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "iceberg_sink.cli", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env=env,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)


@pytest.mark.parametrize(
    "args",
    [
        ["inspect", "db.t", "--embedded", "lake", "--json"],
        ["inspect", "db.t", "--embedded", "lake"],
        ["expire-snapshots", "db.t", "--embedded", "lake", "--dry-run", "--json"],
        ["inspect", "db.nope", "--embedded", "lake", "--json"],  # the error document
        ["run", "p.yaml", "--validate-only"],
        ["--help"],
    ],
    ids=lambda a: " ".join(a),
)
def test_a_closed_stdout_ends_the_command_quietly(tmp_path: Path, args: list[str]) -> None:
    _lake(tmp_path / "lake")
    (tmp_path / "p.yaml").write_text("source: {type: rate}\nsink: {table: db.t}\ncheckpoint_location: c\n")
    done = _closed_pipe_run(args, tmp_path)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
    # argparse's --help ignores a failed write itself (exit 0); every command stops with 141.
    assert done.returncode == (EXIT_OK if args == ["--help"] else EXIT_STDOUT_CLOSED), done.stderr
    if args[:2] == ["inspect", "db.nope"]:
        assert done.stderr.startswith("iceberg-sink inspect: table db.nope does not exist")


def test_read_only_commands_change_nothing_in_an_existing_catalog(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = _lake(tmp_path / "lake")

    def state() -> dict[str, tuple[int, int]]:
        return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(lake.rglob("*"))}

    before = state()
    for command in (
        ["inspect", "db.t"],
        ["compact", "db.t", "--dry-run"],
        ["expire-snapshots", "db.t", "--dry-run", "--older-than-hours", "0"],
        ["remove-orphans", "db.t", "--dry-run"],
    ):
        assert main([*command, "--embedded", str(lake), "--json"]) == EXIT_OK, capsys.readouterr()
        assert json.loads(capsys.readouterr().out)["ok"] is True
        assert state() == before, command
