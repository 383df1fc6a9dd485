#!/usr/bin/env python3
"""A throw-away PostgreSQL server for trying the pipeline: logical decoding on, loopback only.

Standard library only. Uses the server binaries of the Debian package ``postgresql``
(``/usr/lib/postgresql/<version>/bin``: ``apt-get install postgresql``, or scripts/ensure_postgres.sh),
never the system's own cluster: a new cluster in its own folder, superuser ``postgres`` with trust
authentication on 127.0.0.1 (so no password: for trying things on one machine, never for data you
keep), ``wal_level=logical`` and room for replication slots, as Debezium's PostgreSQL connector needs.

    pg_server.py start DIR [--port P]   # creates the cluster on first use, starts it; prints the port
    pg_server.py stop DIR

PostgreSQL refuses to run as root: run as root, the cluster lives in a folder of its own under the
temporary directory, owned by the ``postgres`` user the Debian package creates, and DIR records
where (``DIR/server.json``); ``stop`` removes nothing, delete DIR (and, as root, that folder) to start over.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import pwd
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

SERVICE_USER = "postgres"
START_TIMEOUT_S = 60


class ServerError(RuntimeError):
    """The server could not be created, started or stopped (the message holds the evidence)."""


def server_bin() -> Path:
    """The newest ``/usr/lib/postgresql/<version>/bin`` holding ``initdb`` and ``pg_ctl``."""
    found = sorted(
        (Path(p).parent for p in glob.glob("/usr/lib/postgresql/*/bin/initdb")),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if not found:
        raise ServerError(
            "expected PostgreSQL's server binaries under /usr/lib/postgresql/<version>/bin, found none: "
            "install them with `apt-get install postgresql` (scripts/ensure_postgres.sh does)"
        )
    return found[-1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(tool: Path, *args: str) -> str:
    """Run a server binary, as the ``postgres`` user when this process is root."""
    user = pwd.getpwnam(SERVICE_USER) if os.geteuid() == 0 else None
    done = subprocess.run(
        [str(tool), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        user=user.pw_uid if user else None,
        group=user.pw_gid if user else None,
        extra_groups=[] if user else None,
        cwd="/",
    )
    if done.returncode != 0:
        raise ServerError(f"{tool.name} {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


def _state(folder: Path) -> dict[str, str]:
    path = folder / "server.json"
    if not path.exists():
        return {}
    state = json.loads(path.read_text())
    if not isinstance(state, dict):
        raise ServerError(f"{path}: expected a JSON object, received {state!r}")
    return {str(k): str(v) for k, v in state.items()}


def _log_tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-4000:]
    except OSError:
        return "(no log)"


def start(folder: Path, port: int | None) -> int:
    """Create the cluster in ``folder`` on first use and start it; its port."""
    folder.mkdir(parents=True, exist_ok=True)
    state = _state(folder)
    binaries = server_bin()
    if not state:
        if os.geteuid() == 0:
            root = Path(tempfile.mkdtemp(prefix="iceberg-sink-pg-"))
            entry = pwd.getpwnam(SERVICE_USER)
            os.chown(root, entry.pw_uid, entry.pw_gid)
        else:
            root = folder
        data = root / "data"
        _run(binaries / "initdb", "-D", str(data), "-U", SERVICE_USER, "-A", "trust", "-E", "UTF8", "--no-sync")
        state = {"root": str(root), "data": str(data), "port": str(port or free_port())}
        (folder / "server.json").write_text(json.dumps(state, indent=2) + "\n")
    elif port is not None and str(port) != state["port"]:
        raise ServerError(f"{folder} holds a server on port {state['port']}; received --port {port}")
    root, data = Path(state["root"]), Path(state["data"])
    if (data / "postmaster.pid").exists():
        return int(state["port"])
    log = root / "postgres.log"
    options = (
        f"-p {state['port']} -c listen_addresses=127.0.0.1 -k {root} -c wal_level=logical "
        "-c max_wal_senders=10 -c max_replication_slots=10 -c fsync=off"
    )
    try:
        _run(binaries / "pg_ctl", "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", str(START_TIMEOUT_S), "start")
    except ServerError as e:
        raise ServerError(f"{e}\n--- {log} ---\n{_log_tail(log)}") from e
    return int(state["port"])


def stop(folder: Path) -> None:
    state = _state(folder)
    if not state or not (Path(state["data"]) / "postmaster.pid").exists():
        return
    _run(server_bin() / "pg_ctl", "-D", state["data"], "-m", "fast", "-w", "stop")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="pg_server.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--port", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        if args.action == "start":
            print(start(args.dir.absolute(), args.port))
        else:
            stop(args.dir.absolute())
    except ServerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
