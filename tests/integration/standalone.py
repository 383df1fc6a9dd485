"""A Spark standalone cluster on loopback for the tests: one master and two workers, started from the
installed PySpark (``spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``).

Each daemon gets free ports, its own work and log directory and small memory; the workers get a
minimal environment of their own (not the test's), with ``PYTHONPATH`` set to the project root as
an installation on the workers would (``project_on_workers=False`` leaves it out: workers with nothing
of the project, whose Python an application ships itself, as tests/integration/test_spark_submit.py
does). The second worker binds 127.0.0.2 (still loopback): Spark
never runs a speculative copy of a task on a host where an attempt already runs, so two workers on
one address would never speculate.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests import scripts
from tests.helpers import driver_env

ROOT = Path(__file__).resolve().parents[2]
WORKER_HOSTS = ("127.0.0.1", "127.0.0.2")


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct free ports (scripts/pipeline_components.py ``free_ports``)."""
    ports: list[int] = scripts.load("pipeline_components.py").free_ports(count, host)
    return ports


class StandaloneCluster:
    """A running master and two workers; :meth:`stop` ends them (their process groups)."""

    def __init__(
        self, base: Path, worker_cores: int = 1, worker_memory: str = "1g", *, project_on_workers: bool = True
    ) -> None:
        self.base = base
        base.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.port, self.ui_port = free_ports(2)
        self.url = f"spark://127.0.0.1:{self.port}"
        home = spark_home()
        java_home = os.environ.get("JAVA_HOME")
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(base),
            "SPARK_HOME": str(home),
            "SPARK_LOG_DIR": str(base / "logs"),
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_NO_DAEMONIZE": "1",
            # What an installation on the workers would provide: the project's code.
            **({"PYTHONPATH": str(ROOT)} if project_on_workers else {}),
            **({"JAVA_HOME": java_home} if java_home else {}),
        }
        spark_class = str(home / "bin" / "spark-class")
        try:
            self._start(
                "master",
                [
                    *(spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"),
                    *("--port", str(self.port), "--webui-port", str(self.ui_port)),
                ],
                env,
            )
            self._wait(0, "the master to answer")
            for i, host in enumerate(WORKER_HOSTS):
                work = base / f"worker{i}"
                work.mkdir(parents=True, exist_ok=True)
                worker_env = {**env, "SPARK_LOCAL_DIRS": str(work / "local")}
                port, ui_port = free_ports(2, host)
                self._start(
                    f"worker{i}",
                    [
                        *(spark_class, "org.apache.spark.deploy.worker.Worker", self.url, "--host", host),
                        *("--port", str(port), "--webui-port", str(ui_port)),
                        *("--cores", str(worker_cores), "--memory", worker_memory, "--work-dir", str(work)),
                    ],
                    worker_env,
                )
            self._wait(len(WORKER_HOSTS), "the workers to register")
        except BaseException:
            self.stop()
            raise

    def _start(self, name: str, args: list[str], env: dict[str, str]) -> None:
        log = (self.base / f"{name}.log").open("wb")
        self.procs.append(
            subprocess.Popen(args, env=env, cwd=self.base, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )

    def _ports_from_master_log(self) -> None:
        """The ports the master bound, as its log says: a port chosen free may be taken by another
        process before the master binds it, and Spark then moves to the next one (seen in CI: the UI
        on port+1 while this harness polled the port it had chosen)."""
        log = (self.base / "master.log").read_text(errors="replace")
        ui = re.search(r"Successfully started service 'MasterUI' on port (\d+)", log)
        if ui is not None:
            self.ui_port = int(ui.group(1))
        master = re.search(r"Starting Spark master at spark://127\.0\.0\.1:(\d+)", log)
        if master is not None:
            self.port = int(master.group(1))
            self.url = f"spark://127.0.0.1:{self.port}"

    def alive_workers(self) -> int:
        """Workers the master's status page lists as ALIVE."""
        self._ports_from_master_log()
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as response:
            state = json.load(response)
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE")

    def _wait(self, workers: int, what: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited ({proc.args}); logs:\n{self.logs()}")
            with contextlib.suppress(OSError, ValueError):
                if self.alive_workers() >= workers:
                    return
            time.sleep(0.5)
        raise TimeoutError(f"waited {timeout:.0f}s for {what}; logs:\n{self.logs()}")

    def logs(self, tail: int = 4000) -> str:
        parts = []
        for path in sorted(self.base.glob("*.log")):
            parts.append(f"== {path.name}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    def executor_logs(self, tail: int = 4000) -> str:
        parts = []
        for path in sorted(self.base.glob("worker*/app-*/*/stderr")):
            parts.append(f"== {path}\n{path.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    def executor_dirs(self) -> list[Path]:
        """The working directories the workers gave executors (``<work-dir>/<app>/<executor>``)."""
        return sorted(p for p in self.base.glob("worker*/app-*/*") if p.is_dir())

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=20)
        self.procs.clear()


@contextlib.contextmanager
def standalone_cluster(base: Path, *, project_on_workers: bool = True) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(base, project_on_workers=project_on_workers)
    try:
        yield cluster
    finally:
        cluster.stop()


def run_driver(
    module: str, args: list[str], cwd: Path, extra_env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m module args`` as a driver in its own process group and working directory."""
    env = driver_env(str(ROOT))
    env.update(extra_env or {})
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,
        check=False,
    )


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
