"""docs/postgres-debezium-kafka.md, followed as written (issue 42 item 14): a user's shell, step by step.

The page's blocks run in order in a fresh folder, as a user following it from the root of a clone
would run them (``scripts/`` at hand, the venv active): every bash and Python block whose
``not-run`` reason says this test runs it, and every titled block (written to its file). What
carries from one step to the next is what carries in a user's shell: files, and the variables a
block **exports** (each bash block is its own process started with the environment the previous
ones exported; a variable set without ``export`` does not reach a later Python step, as it does not
reach ``python`` in a shell). The Python blocks share one namespace (one interactive session). The
page's fixed PostgreSQL port, 55432, is replaced by a free one.

Then the Iceberg tables, read by Iceberg Java and DuckDB, must equal PostgreSQL's ``SELECT *``.
Before this test the guide's tables were not the ones the stream created (``shop.customers`` was
``shop.shop_s_public_s_customers``), its variables were not exported (``KeyError: 'SPARK_JARS'``),
it assumed a running PostgreSQL with a login role, and PyIceberg could not read its tables.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from iceberg_sink.sources.kafka_source import HINT_START
from tests.docs.samples import Block, parse
from tests.interop.readers import JavaIcebergReader, duckdb_read, normalize

pytestmark = [pytest.mark.interop, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PAGE = "docs/postgres-debezium-kafka.md"
RUN_HERE = "tests/e2e/test_guide.py runs it"
PAGE_PORT = "55432"
SERVERS = (("connect.sh", "connect-data"), ("kafka.sh", "kafka-data"), ("postgres.sh", "pg-data"))


def guide_blocks() -> list[Block]:
    """The blocks this test runs, in page order (each not-run block must say whether it does)."""
    blocks = parse((ROOT / PAGE).read_text(), PAGE)
    chosen = []
    for block in blocks:
        if block.kind == "skip":
            if RUN_HERE in block.reason:
                kind = "python" if block.lang in ("python", "py") else "shell"
                chosen.append(Block(block.page, block.line, kind, block.code, block.lang, block.title))
            continue
        chosen.append(block)
    return chosen


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Shell:
    """A user's shell: the environment blocks export, the process groups they leave running."""

    def __init__(self, work: Path) -> None:
        venv = Path(sys.executable).parent  # the activated venv: its python3 is Spark's workers' too
        env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
        env["PATH"] = f"{venv}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(venv.parent)
        self.env = env
        self.work = work
        self.groups: list[int] = []
        self._dump = work / ".exported.json"

    def bash(self, block: Block, code: str) -> None:
        dump = f"\n{sys.executable} -c 'import json, os, sys; json.dump(dict(os.environ), open(sys.argv[1], \"w\"))' {self._dump}\n"
        process = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", code + dump],
            cwd=self.work,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its background jobs stay in its process group, killed at the end
        )
        self.groups.append(process.pid)
        out, err = process.communicate(timeout=900)
        sys.stdout.write(out)
        if process.returncode != 0:
            raise AssertionError(
                f"{block.where}: bash block failed with exit code {process.returncode}\n"
                f"--- block\n{code}--- stdout\n{out}--- stderr\n{err}"
            )
        self.env = json.loads(self._dump.read_text())

    def python(self, block: Block, code: str, namespace: dict[str, Any]) -> None:
        saved = dict(os.environ)
        cwd = Path.cwd()
        os.environ.clear()
        os.environ.update(self.env)
        os.chdir(self.work)
        try:
            exec(compile(code, block.where, "exec"), namespace)
        except Exception as e:
            log = self.work / "shop_stream.log"
            tail = log.read_text(errors="replace")[-6000:] if log.exists() else "(none)"
            raise AssertionError(
                f"{block.where}: python block failed: {type(e).__name__}: {e}\n"
                + "".join(traceback.format_exception(e))
                + f"--- shop_stream.log (tail)\n{tail}"
            ) from e
        finally:
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(saved)

    def close(self) -> None:
        """Stop what the guide started, also when it failed halfway (its last block stops the servers)."""
        for group in self.groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        for script, folder in SERVERS:
            if (self.work / folder).exists():
                subprocess.run(
                    [str(ROOT / "scripts" / script), "stop", folder],
                    cwd=self.work,
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=120,
                )
        server = self.work / "pg-data" / "server.json"
        if server.exists():  # run as root, the cluster lives outside the folder (scripts/pg_server.py)
            shutil.rmtree(json.loads(server.read_text())["root"], ignore_errors=True)


def postgres_rows(port: int, query: str) -> list[dict[str, Any]]:
    import psycopg2
    import psycopg2.extras

    with contextlib.closing(psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="shop")) as conn:
        cursor = conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor)
        cursor.execute(query)
        return [dict(r) for r in cursor.fetchall()]


def test_the_guide_runs_as_written(tmp_path: Path, java_reader: JavaIcebergReader) -> None:
    blocks = guide_blocks()
    assert [b.title for b in blocks if b.kind == "file"] == [
        "shop-connector.properties",
        "shop_stream.py",
        "shop-pipeline.yaml",
    ]
    assert sum(b.kind == "shell" for b in blocks) >= 6 and sum(b.kind == "python" for b in blocks) >= 3
    port = free_port()
    work = tmp_path / "clone"
    work.mkdir()
    (work / "scripts").symlink_to(ROOT / "scripts")  # "from the root of a clone"
    shell = Shell(work)
    namespace: dict[str, Any] = {"__name__": "__guide__"}
    started = time.monotonic()
    *steps, last = blocks
    assert "postgres.sh stop" in last.code, f"{last.where}: the guide's last block stops the servers"
    try:
        for block in steps:
            run(shell, block, port, namespace)
        check_tables(work, port, java_reader)  # while the servers still run
        # The guide's stream sets the Kafka source's options: sink.start warns without them (sources/kafka_source.py).
        assert HINT_START not in (work / "shop_stream.log").read_text(errors="replace")
        run(shell, last, port, namespace)
        print(f"[guide] {len(blocks)} blocks in {time.monotonic() - started:.0f} s")
    finally:
        shell.close()


def run(shell: Shell, block: Block, port: int, namespace: dict[str, Any]) -> None:
    code = block.code.replace(PAGE_PORT, str(port))
    started = time.monotonic()
    if block.kind == "file":
        (shell.work / block.title).write_text(code)
    elif block.kind == "python":
        shell.python(block, code, namespace)
    else:
        shell.bash(block, code)
    print(f"[guide] {block.where} {block.kind}: {time.monotonic() - started:.1f} s")


def check_tables(work: Path, port: int, java_reader: JavaIcebergReader) -> None:
    """Each Iceberg table, read by Iceberg Java and DuckDB, equals its PostgreSQL table; format v3."""
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("iceberg_sink", type="sql", uri=f"sqlite:///{work / 'lake' / 'catalog.db'}")
    assert sorted(".".join(t) for t in catalog.list_tables("shop")) == ["shop.customers", "shop.orders"]
    for name, columns in (("customers", ["id", "name", "credit", "born"]), ("orders", ["id", "customer_id", "amount"])):
        table = catalog.load_table(f"shop.{name}")
        assert table.metadata.format_version == 3, name
        assert [f.name for f in table.schema().fields] == [*columns, "lsn"]
        expected = postgres_rows(port, f"SELECT {', '.join(columns)} FROM {name} ORDER BY id")
        java = normalize(java_reader.read(table.metadata_location).select(columns), ["id"])
        duck = normalize(duckdb_read(table.metadata_location).select(columns), ["id"])
        assert java == duck, name
        assert java == normalize(pa.Table.from_pylist(expected), ["id"]), name
    assert [r["id"] for r in postgres_rows(port, "SELECT id FROM customers ORDER BY id")] == [1, 3]
