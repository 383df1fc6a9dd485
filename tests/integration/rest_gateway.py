"""SeaweedFS with its Iceberg REST catalog in a process of its own, so the catalog can be stopped alone.

``weed mini`` serves S3 and an Iceberg REST catalog from one process: stopping it would take the
storage down with the catalog. Here ``weed mini`` keeps serving S3 (and its filer), and a second
process, ``weed s3`` pointed at the same filer, serves the Iceberg REST catalog the sink uses. Stopping
and starting that process (same port, same filer, same credentials) is a real REST catalog outage
while the object store stays up.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration import seaweed as sw


class SplitSeaweed:
    """``weed mini`` (S3, filer) plus a separate ``weed s3`` serving the REST catalog."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._env, access_key, secret_key = sw.credentials_env()
        attempts = iter(range(1, sw.START_ATTEMPTS + 1))

        def mini_root() -> Path:
            path = root / f"mini-{next(attempts)}"
            path.mkdir()
            return path

        try:
            self._mini, self._ports, mini_props, mini_dir = sw.start_mini(mini_root, self._env, access_key, secret_key)
        except sw.SeaweedStartError as e:
            pytest.fail(str(e), pytrace=False)
        self._mini_log = mini_dir / "weed.log"
        self._gateway: subprocess.Popen[bytes] | None = None
        for attempt in range(1, sw.START_ATTEMPTS + 1):
            # New ports (and a new log) while the first start finds one of them taken (see sw.start_mini).
            self._gateway_ports = sw.free_ports(3)
            rest = self._gateway_ports[2]
            self.props = {
                **mini_props,
                "uri": f"http://127.0.0.1:{rest}",
                "oauth2-server-uri": f"http://127.0.0.1:{rest}/v1/oauth/tokens",
            }
            self._gateway_log = root / f"gateway-{attempt}.log"
            problem = self._start_gateway()
            if problem is None:
                return
            if attempt == sw.START_ATTEMPTS or not sw.port_taken(self._gateway_log):
                self.close()
                self._check(problem, self._gateway_log)

    def _spawn(self, command: list[str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            return subprocess.Popen(
                command, cwd=self.root, env=self._env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )

    @staticmethod
    def _check(problem: str | None, log: Path) -> None:
        if problem is not None:
            pytest.fail(f"{problem}.\n--- log ({log}) ---\n{sw.log_tail(log)}", pytrace=False)

    def start_catalog(self) -> None:
        """Start the REST catalog process again on its ports (after ``stop_catalog``)."""
        self._check(self._start_gateway(), self._gateway_log)

    def _start_gateway(self) -> str | None:
        port, grpc, rest = self._gateway_ports
        filer = f"127.0.0.1:{self._ports['filer.port']}.{self._ports['filer.port.grpc']}"
        command = [
            sw.weed_binary(),
            "-logtostderr",
            "s3",
            f"-filer={filer}",
            "-ip.bind=127.0.0.1",
            f"-port={port}",
            f"-port.grpc={grpc}",
            f"-port.iceberg={rest}",
            "-port.lance=0",
        ]
        self._gateway = self._spawn(command, self._gateway_log)
        problem = sw._wait_ready(self._gateway, self.props, self._gateway_log)
        if problem is not None:
            self.stop_catalog()
        return problem

    def stop_catalog(self) -> None:
        if self._gateway is not None:
            sw._stop(self._gateway)
            self._gateway = None

    def close(self) -> None:
        self.stop_catalog()
        sw._stop(self._mini)


@pytest.fixture
def split_seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SplitSeaweed]:
    server = SplitSeaweed(tmp_path_factory.mktemp("seaweed-split"))
    try:
        yield server
    finally:
        server.close()
