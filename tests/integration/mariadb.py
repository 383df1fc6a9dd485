"""A real MariaDB server for the Debezium MariaDB connector tests.

``MariaDBServer`` runs the Debian package's ``mariadb-install-db`` and ``mariadbd`` (installed by
scripts/ensure_mariadb.sh) on loopback only, on a free port, with its data in a fresh temporary
directory, the binary log on in row format with full row images (what Debezium's binlog connectors
require) and the server's time zone UTC. Failing to start is a test failure naming the log, never a
skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.seaweed import free_ports, log_tail

START_TIMEOUT_S = 60
USER = "sink"
PASSWORD = "sink-pw"
_SERVER = Path("/usr/sbin/mariadbd")


class MariaDBServer:
    """One throw-away MariaDB server on 127.0.0.1 with a user ``sink`` that Debezium can replicate as."""

    def __init__(self) -> None:
        install = shutil.which("mariadb-install-db")
        if install is None or not _SERVER.exists():
            pytest.fail(
                "MariaDB server binaries not found (mariadb-install-db, /usr/sbin/mariadbd): run "
                "scripts/ensure_mariadb.sh (apt-get install mariadb-server)",
                pytrace=False,
            )
        self.root = Path(tempfile.mkdtemp(prefix="iceberg-sink-mariadb-"))
        self.data = self.root / "data"
        self.log = self.root / "mariadb.log"
        self.port = free_ports(1)[0]
        self._process: subprocess.Popen[bytes] | None = None
        done = subprocess.run(
            [install, "--no-defaults", f"--datadir={self.data}", f"--user={self._user()}", "--skip-test-db",
             "--auth-root-authentication-method=normal"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )  # fmt: skip
        if done.returncode != 0:
            pytest.fail(f"mariadb-install-db failed ({done.returncode}):\n{done.stdout}\n{done.stderr}", pytrace=False)

    @staticmethod
    def _user() -> str:
        """The server refuses to run as root unless told to: as root it runs as root, in its own folder."""
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name

    def start(self) -> None:
        self._process = subprocess.Popen(
            [
                str(_SERVER),
                "--no-defaults",
                f"--datadir={self.data}",
                f"--user={self._user()}",
                f"--port={self.port}",
                "--bind-address=127.0.0.1",
                f"--socket={self.root / 'mariadb.sock'}",
                f"--pid-file={self.root / 'mariadb.pid'}",
                f"--log-error={self.log}",
                f"--log-bin={self.data / 'binlog'}",
                "--binlog-format=ROW",
                "--binlog-row-image=FULL",
                "--server-id=1",
                "--skip-name-resolve",
                "--default-time-zone=+00:00",
                "--innodb-flush-log-at-trx-commit=0",
                "--sync-binlog=0",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                with contextlib.closing(self.connect(user="root", password="")) as conn:
                    cur = conn.cursor()
                    cur.execute(f"CREATE USER IF NOT EXISTS '{USER}'@'%' IDENTIFIED BY '{PASSWORD}'")
                    # What Debezium's MariaDB connector needs: read the tables (snapshot), lock them
                    # (RELOAD), and read the binary log (REPLICATION SLAVE/CLIENT, BINLOG MONITOR).
                    cur.execute(f"GRANT ALL PRIVILEGES ON *.* TO '{USER}'@'%'")
                return
            except Exception as e:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"MariaDB did not start ({e}):\n{log_tail(self.log)}", pytrace=False)
                time.sleep(0.2)

    def connect(self, user: str = USER, password: str = PASSWORD, database: str | None = None) -> Any:
        """A PyMySQL connection (autocommit, session time zone UTC)."""
        import pymysql

        conn = pymysql.connect(
            host="127.0.0.1",
            port=self.port,
            user=user,
            password=password,
            database=database,
            autocommit=True,
            connect_timeout=5,
            init_command="SET time_zone = '+00:00'",
        )
        return conn

    def close(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        shutil.rmtree(self.root, ignore_errors=True)
