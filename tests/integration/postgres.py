"""A real PostgreSQL server for PyIceberg's SQL catalog in tests, and a proxy that loses a commit's answer.

``PostgresServer`` runs the Debian package's ``initdb``/``pg_ctl`` (installed by scripts/ensure_postgres.sh)
on loopback only, on a free port, with its data in a fresh temporary directory, as the ``postgres``
user when the tests run as root (the server refuses root). It can be stopped and started again on the
same port and data directory: a real catalog outage. Failing to start is a test failure naming the
log, never a skip.

``CommitCuttingProxy`` sits between the catalog client and the server (TCP, PostgreSQL's wire protocol
read just enough to see simple queries). Armed, it forwards the ``COMMIT`` that follows an
``UPDATE iceberg_tables`` (PyIceberg's compare-and-swap of the metadata location) to the server, waits
for the server's answer (the transaction is durable by then), runs a callback (for example stopping the
server) and closes the client's connection without passing the answer on: a commit that landed but
whose response was lost.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.seaweed import free_ports, log_tail

START_TIMEOUT_S = 60
USER = "sink"
_SERVICE_USER = "postgres"


def postgres_bin() -> Path:
    """The newest ``/usr/lib/postgresql/<version>/bin`` holding ``initdb`` and ``pg_ctl``."""
    found = sorted(
        (Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if not found:
        pytest.fail(
            "PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin: run scripts/ensure_postgres.sh "
            "(apt-get install postgresql)",
            pytrace=False,
        )
    return found[-1]


class PostgresServer:
    """One throw-away PostgreSQL cluster on 127.0.0.1 (trust authentication, no fsync)."""

    def __init__(self, settings: dict[str, str] | None = None) -> None:
        """``settings``: more server settings (``{"wal_level": "logical"}`` for Debezium)."""
        self.settings = dict(settings or {})
        self.bin = postgres_bin()
        self.root = Path(tempfile.mkdtemp(prefix="iceberg-sink-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.port = free_ports(1)[0]
        self._as_service_user = os.geteuid() == 0
        if self._as_service_user:
            entry = pwd.getpwnam(_SERVICE_USER)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", USER, "-A", "trust", "--no-sync", "-E", "UTF8")

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin / tool), *args]
        # PostgreSQL refuses to run as root: as root, the child switches to the service user itself
        # (no runuser, which lives in /usr/sbin and is not on every PATH).
        user = pwd.getpwnam(_SERVICE_USER) if self._as_service_user else None
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
            user=user.pw_uid if user else None,
            group=user.pw_gid if user else None,
            extra_groups=[] if user else None,
        )
        if done.returncode != 0:
            pytest.fail(
                f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}\n"
                f"--- log ({self.log}) ---\n{log_tail(self.log)}",
                pytrace=False,
            )

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off -c max_connections=50"
        options += "".join(f" -c {key}={value}" for key, value in self.settings.items())
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "-t",
            str(START_TIMEOUT_S),
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: disconnect clients, roll back open transactions)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def create_database(self, name: str) -> None:
        import psycopg2

        with contextlib.closing(psycopg2.connect(host="127.0.0.1", port=self.port, user=USER, dbname="postgres")) as c:
            c.autocommit = True
            c.cursor().execute(f'CREATE DATABASE "{name}"')

    def url(self, database: str, port: int | None = None) -> str:
        """SQLAlchemy URL (psycopg2) of ``database``, through ``port`` (a proxy) if given."""
        return f"postgresql+psycopg2://{USER}@127.0.0.1:{port or self.port}/{database}?sslmode=disable"

    def close(self) -> None:
        if self.running():
            with contextlib.suppress(BaseException):
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def postgres() -> Iterator[PostgresServer]:
    """A started PostgreSQL server of its own for one test (tests may stop and start it)."""
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


def sql_catalog_properties(
    server: PostgresServer, database: str, warehouse: Path, port: int | None = None
) -> dict[str, str]:
    server.create_database(database)
    return {"type": "sql", "uri": server.url(database, port), "warehouse": warehouse.as_uri()}


class CommitCuttingProxy:
    """A TCP proxy to a PostgreSQL server that can lose the answer to one catalog commit (see module doc)."""

    def __init__(self, target_port: int) -> None:
        self._target = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._on_cut: Callable[[], None] | None = None
        self.cuts = 0
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def arm(self, on_cut: Callable[[], None] = lambda: None) -> None:
        """Lose the answer to the next catalog commit; run ``on_cut`` once the server has answered."""
        with self._lock:
            self._on_cut = on_cut

    def close(self) -> None:
        self._closed = True
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self._target))
            except OSError:
                client.close()  # the server is down: so is the proxy, as a network path would be
                continue
            state = {"update": False, "cut": None}
            threading.Thread(target=self._client_to_server, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._server_to_client, args=(client, server, state), daemon=True).start()

    @staticmethod
    def _recv_exact(sock: socket.socket, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data

    def _client_to_server(self, client: socket.socket, server: socket.socket, state: dict[str, object]) -> None:
        try:
            # Startup packet: int32 length (itself included), no type byte.
            head = self._recv_exact(client, 4)
            server.sendall(head + self._recv_exact(client, struct.unpack("!i", head)[0] - 4))
            while True:
                kind = self._recv_exact(client, 1)
                head = self._recv_exact(client, 4)
                body = self._recv_exact(client, struct.unpack("!i", head)[0] - 4)
                if kind == b"Q":
                    sql = body.rstrip(b"\0").decode(errors="replace").strip().upper()
                    with self._lock:
                        if self._on_cut is not None:
                            if sql.startswith("UPDATE ICEBERG_TABLES"):
                                state["update"] = True
                            elif sql == "COMMIT" and state["update"]:
                                state["cut"], self._on_cut = self._on_cut, None
                server.sendall(kind + head + body)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                server.shutdown(socket.SHUT_WR)

    def _server_to_client(self, client: socket.socket, server: socket.socket, state: dict[str, object]) -> None:
        try:
            while True:
                data = server.recv(65536)
                if not data:
                    break
                on_cut = state["cut"]
                if callable(on_cut):
                    # The server answered the COMMIT: the transaction is durable. The answer is lost.
                    self.cuts += 1
                    on_cut()
                    break
                client.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, server):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
