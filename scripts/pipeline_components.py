#!/usr/bin/env python3
"""The real components of a PostgreSQL (or MariaDB) -> Debezium -> Kafka -> Spark -> Iceberg pipeline, on loopback.

Standard library only (it runs with any Python 3.11+, before the project's venv exists). Jars come
from Maven Central through scripts/maven_fetch.py, the project's one fetcher (the Java readers of the
tests use it too): fetched once into ``${ICEBERG_SINK_CACHE:-~/.cache/iceberg-sink}/maven/sets/``, a
set complete only once its marker exists (an interrupted fetch is redone, never half-used), with
``mvn -B`` without standard input, failing loudly with Maven's own output.

Bundles:

- ``kafka``: an Apache Kafka broker (``org.apache.kafka:kafka_2.13``) and its tools (console
  producer, topics), run as a one-node KRaft broker (``kafka.Kafka``);
- ``connect``: Kafka Connect (``connect-runtime``, ``connect-json``) with Debezium's PostgreSQL and
  MariaDB connectors as plugins (``plugins/debezium-connector-postgres``,
  ``plugins/debezium-connector-mariadb``, each isolated by Connect's ``plugin.path``), run
  standalone (``ConnectStandalone``);
- ``spark-kafka``: Spark's Kafka source (``spark-sql-kafka-0-10_2.13``, ``_2.12`` for Spark 3.x)
  for a Spark version, for ``spark.jars`` (:func:`spark_kafka_jars`).

Command line (``scripts/kafka.sh`` and ``scripts/connect.sh`` wrap it)::

    pipeline_components.py fetch kafka|connect|spark-kafka [--spark-version V]
    pipeline_components.py kafka start DIR [--port P]      # prints the bootstrap address
    pipeline_components.py kafka stop DIR
    pipeline_components.py connect start DIR --bootstrap HOST:PORT --connector FILE.properties
                                         [--schemas true|false]
    pipeline_components.py connect stop DIR
    pipeline_components.py spark-kafka-jars [--spark-version V]   # comma-separated, for spark.jars
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

KAFKA_VERSION = os.environ.get("ICEBERG_SINK_KAFKA_VERSION", "4.3.0")
"""Kafka broker and Connect version: the one Debezium DEBEZIUM_VERSION is built against."""
DEBEZIUM_VERSION = os.environ.get("ICEBERG_SINK_DEBEZIUM_VERSION", "3.6.1.Final")
MARIADB_CONNECTOR_VERSION = os.environ.get("ICEBERG_SINK_DEBEZIUM_MARIADB_VERSION", "3.5.0.Final")
"""Debezium's MariaDB connector: the newest release Maven Central serves here (3.6.x is not), a plugin
of its own (its own Debezium core, isolated by Connect's class loaders from the PostgreSQL one's)."""
SCALA = "2.13"
CENTRAL = "https://repo.maven.apache.org/maven2"
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
LOG_BINDING = "org.apache.logging.log4j:log4j-slf4j-impl:2.25.4"
"""slf4j 1.7 (Kafka's logging API) to log4j2 (what Kafka's distribution ships), so the logs land in files."""
HEAP = os.environ.get("ICEBERG_SINK_COMPONENT_HEAP", "-Xmx384m")


class ComponentError(RuntimeError):
    """A component could not be fetched, started or stopped (the message holds the evidence)."""


def _maven_fetch() -> ModuleType:
    """scripts/maven_fetch.py, loaded by path (scripts/ is not a package) under the name the tests
    load it by (tests/scripts.py), so that both share one module."""
    name = "iceberg_sink_script_maven_fetch"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().with_name("maven_fetch.py"))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


maven = _maven_fetch()


def cache_root() -> Path:
    """``${ICEBERG_SINK_CACHE:-~/.cache/iceberg-sink}/maven``: scripts/maven_fetch.py's cache."""
    return Path(maven.cache_root())


def _log_tail(path: Path, chars: int = 6000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return text[-chars:]


# -- fetching --------------------------------------------------------------------------------------


def _jar_dir(name: str, coordinates: Sequence[str], exclude_groups: Sequence[str] = ()) -> Path:
    """The folder holding the jars of ``coordinates`` and their runtime dependencies, fetched once."""
    try:
        jars = maven.fetch_jars(name, coordinates, transitive=True, exclude_groups=exclude_groups)
    except maven.MavenFetchError as e:
        raise ComponentError(str(e)) from None
    return Path(jars[0]).parent


def _link(link: Path, target: Path) -> None:
    """``link`` -> ``target``, replaced atomically (another process may be making the same link)."""
    if link.is_symlink() and link.resolve() == target.resolve():
        return
    link.parent.mkdir(parents=True, exist_ok=True)
    temporary = link.with_name(f".{link.name}.{os.getpid()}")
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(target, target_is_directory=True)
    temporary.replace(link)


def kafka_home(version: str = KAFKA_VERSION) -> Path:
    """The broker's jars (broker, KRaft storage tool, console producer and topics tools)."""
    return _jar_dir(
        f"kafka-{version}",
        [f"org.apache.kafka:kafka_{SCALA}:{version}", f"org.apache.kafka:kafka-tools:{version}", LOG_BINDING],
    )


def connect_home(
    version: str = KAFKA_VERSION, debezium: str = DEBEZIUM_VERSION, mariadb: str = MARIADB_CONNECTOR_VERSION
) -> Path:
    """Kafka Connect's jars under ``lib/``, with Debezium's PostgreSQL and MariaDB connectors under
    ``plugins/`` (each its own class loader through ``plugin.path``; Kafka's own jars are left to the
    worker's classpath). All are links to the fetched sets: Connect wants a plugin folder inside the
    folder ``plugin.path`` names."""
    lib = _jar_dir(
        f"kafka-connect-{version}",
        [f"org.apache.kafka:connect-runtime:{version}", f"org.apache.kafka:connect-json:{version}", LOG_BINDING],
    )
    plugin = _jar_dir(
        f"debezium-connector-postgres-{debezium}",
        [f"io.debezium:debezium-connector-postgres:{debezium}"],
        exclude_groups=["org.apache.kafka"],
    )
    mariadb_plugin = _jar_dir(
        f"debezium-connector-mariadb-{mariadb}",
        [f"io.debezium:debezium-connector-mariadb:{mariadb}"],
        exclude_groups=["org.apache.kafka"],
    )
    home = cache_root() / "connect-homes" / f"connect-{version}-debezium-{debezium}-mariadb-{mariadb}"
    _link(home / "lib", lib)
    _link(home / "plugins" / "debezium-connector-postgres", plugin)
    _link(home / "plugins" / "debezium-connector-mariadb", mariadb_plugin)
    return home


def _released_versions(group: str, artifact: str) -> list[str]:
    url = f"{CENTRAL}/{group.replace('.', '/')}/{artifact}/maven-metadata.xml"
    with urllib.request.urlopen(url, timeout=60) as answer:
        root = ET.fromstring(answer.read())
    return [v.text for v in root.iter("version") if v.text]


def _as_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in version.split("."))


def spark_scala(spark_version: str) -> str:
    """The Scala version PyPI's PySpark of ``spark_version`` is built with: 2.12 for 3.x, else 2.13."""
    return "2.12" if spark_version.startswith("3.") else SCALA


def spark_kafka_version(spark_version: str) -> str:
    """The ``spark-sql-kafka-0-10`` release for ``spark_version``: the same version when Maven
    Central has it, else the newest release of the same major version before it (a Spark release
    whose connector is not published yet), with a warning."""
    artifact = f"spark-sql-kafka-0-10_{spark_scala(spark_version)}"
    released = _released_versions("org.apache.spark", artifact)
    if spark_version in released:
        return spark_version
    major = spark_version.split(".")[0]
    older = [
        v for v in released if v.split(".")[0] == major and v.count(".") == 2 and _as_tuple(v) < _as_tuple(spark_version)
    ]
    older = [v for v in older if all(p.isdigit() for p in v.split("."))]
    if not older:
        raise ComponentError(
            f"Maven Central has no {artifact} for Spark {spark_version} nor an earlier {major}.x: released {released}"
        )
    chosen = max(older, key=_as_tuple)
    print(
        f"warning: Maven Central has no {artifact}:{spark_version}; using {chosen}, the newest {major}.x before it",
        file=sys.stderr,
    )
    return chosen


def spark_kafka_jars(spark_version: str) -> list[Path]:
    """Jars of Spark's Kafka source for ``spark_version`` (Spark's own jars left out), for ``spark.jars``:
    any Spark 3.5 or 4.x, whichever Python runs this (the Spark 3.5 tests fetch 3.5's from PySpark 4's venv)."""
    name = f"spark-kafka-for-spark-{spark_version}"
    jars = maven.fetched(name)  # fetched once: no look-up at Maven Central after that
    if jars is None:
        version = spark_kafka_version(spark_version)
        folder = _jar_dir(name, [f"org.apache.spark:spark-sql-kafka-0-10_{spark_scala(spark_version)}:{version}"])
        jars = sorted(folder.glob("*.jar"))
    # Only what Spark does not ship itself (its Hadoop client, slf4j, lz4, snappy, ... stay Spark's).
    keep = ("spark-sql-kafka-", "spark-token-provider-kafka-", "kafka-clients-", "commons-pool2-")
    return sorted(Path(p) for p in jars if Path(p).name.startswith(keep))


# -- processes -------------------------------------------------------------------------------------


def free_ports(count: int, host: str = "127.0.0.1", avoid: tuple[int, ...] = ()) -> list[int]:
    """``count`` distinct ports free on ``host`` now, none of ``avoid``. The sockets stay bound until
    all are picked: ports picked one at a time can repeat (the system may hand out a port just
    released), and a process given two equal ports fails (a broker's listener and controller)."""
    sockets: list[socket.socket] = []
    try:
        ports: list[int] = []
        while len(ports) < count:
            s = socket.socket()
            sockets.append(s)
            s.bind((host, 0))
            port = int(s.getsockname()[1])
            if port not in avoid:
                ports.append(port)
        return ports
    finally:
        for s in sockets:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    candidate = Path(home) / "bin" / "java" if home else None
    if candidate is not None and candidate.exists():
        return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise ComponentError("java (17 or newer) is not on PATH")
    return found


_LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
"""


class JavaProcess:
    """One JVM started in the background with its output in ``root/<name>.out`` and its pid in
    ``root/<name>.pid`` (so a shell ``stop`` finds it)."""

    def __init__(self, root: Path, name: str) -> None:
        self.root = root
        self.name = name
        self.out = root / f"{name}.out"
        self.pid_file = root / f"{name}.pid"
        self.process: subprocess.Popen[bytes] | None = None

    def spawn(self, classpath: str, main: str, args: Sequence[str], level: str = "INFO") -> None:
        log4j = self.root / f"{self.name}-log4j2.properties"
        log4j.write_text(_LOG4J2.format(log=self.root / f"{self.name}.log", level=level))
        command = [
            java(),
            HEAP,
            f"-Dlog4j2.configurationFile={log4j}",
            f"-Dkafka.logs.dir={self.root}",
            "-cp",
            classpath,
            main,
            *args,
        ]
        with self.out.open("ab") as out:
            self.process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.pid_file.write_text(str(self.process.pid))

    def pid(self) -> int | None:
        if self.process is not None:
            return self.process.pid if self.process.poll() is None else None
        try:
            pid = int(self.pid_file.read_text())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except OSError:
            return None
        return pid

    def alive(self) -> bool:
        return self.pid() is not None

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = STOP_TIMEOUT_S) -> None:
        pid = self.pid()
        if pid is None:
            return
        with contextlib.suppress(OSError):
            os.kill(pid, sig)
        deadline = time.monotonic() + timeout_s
        while self.alive() and time.monotonic() < deadline:
            if self.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(0.2)
            else:
                time.sleep(0.2)
        if self.alive():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            if self.process is not None:
                self.process.wait(10)
        self.pid_file.unlink(missing_ok=True)

    def failure(self, what: str) -> ComponentError:
        return ComponentError(
            f"{what}\n--- {self.out} ---\n{_log_tail(self.out, 3000)}\n"
            f"--- {self.root / (self.name + '.log')} ---\n{_log_tail(self.root / (self.name + '.log'))}"
        )


def _wait(check: object, process: JavaProcess, what: str, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not process.alive():
            raise process.failure(f"{what}: the process exited")
        if check():  # type: ignore[operator]
            return
        time.sleep(0.3)
    raise process.failure(f"{what}: not ready within {timeout_s:g} s")


class KafkaBroker:
    """A one-node KRaft Kafka broker (broker and controller in one JVM) on 127.0.0.1.

    Its data lives in ``root`` (kept across :meth:`stop` and :meth:`start`: a restart is the same
    broker, same port, same topics and offsets).
    """

    def __init__(self, root: Path, port: int | None = None, version: str = KAFKA_VERSION) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.home = kafka_home(version)
        state = root / "broker.json"
        if state.exists():
            saved = json.loads(state.read_text())
            self.port, self.controller_port = int(saved["port"]), int(saved["controller_port"])
        else:
            # Picked together (one after the other they could be the same port), never the given one.
            given = (port,) if port else ()
            self.port, self.controller_port = [*given, *free_ports(2 - len(given), avoid=given)]
            state.write_text(json.dumps({"port": self.port, "controller_port": self.controller_port}))
        self.process = JavaProcess(root, "kafka")
        self.properties = root / "server.properties"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def classpath(self) -> str:
        return str(self.home / "*")

    def _configure(self) -> None:
        self.properties.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    "controller.listener.names=CONTROLLER",
                    "inter.broker.listener.name=PLAINTEXT",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                    f"log.dirs={self.root / 'data'}",
                    "num.partitions=1",
                    "auto.create.topics.enable=true",
                    "offsets.topic.replication.factor=1",
                    "offsets.topic.num.partitions=4",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "share.coordinator.state.topic.replication.factor=1",
                    "share.coordinator.state.topic.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "log.flush.interval.messages=1",
                    "",
                ]
            )
        )
        if not (self.root / "data" / "meta.properties").exists():
            cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            done = subprocess.run(
                [
                    java(),
                    "-cp",
                    self.classpath,
                    "kafka.tools.StorageTool",
                    "format",
                    f"--cluster-id={cluster}",
                    f"--config={self.properties}",
                ],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=120,
            )
            if done.returncode != 0:
                raise ComponentError(f"kafka-storage format failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")

    def start(self) -> None:
        if self.process.alive():
            return
        self._configure()
        self.process.spawn(self.classpath, "kafka.Kafka", [str(self.properties)])
        _wait(self._ready, self.process, f"Kafka broker on {self.bootstrap}")

    def _ready(self) -> bool:
        if not port_open(self.port):
            return False
        log = _log_tail(self.root / "kafka.log", 200000)
        return "Kafka Server started" in log or "[KafkaRaftServer nodeId=1] Kafka Server started" in log

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.process.stop(sig)

    def restart(self) -> None:
        self.stop()
        self.start()

    def _tool(self, main: str, args: Sequence[str], stdin: bytes | None = None) -> str:
        done = subprocess.run(
            [java(), "-Xmx256m", "-cp", self.classpath, main, *args],
            input=stdin if stdin is not None else b"",
            capture_output=True,
            timeout=180,
        )
        if done.returncode != 0:
            raise ComponentError(
                f"{main} {' '.join(args)} failed ({done.returncode}):\n"
                f"{done.stdout.decode(errors='replace')[-3000:]}\n{done.stderr.decode(errors='replace')[-3000:]}"
            )
        return done.stdout.decode(errors="replace")

    def create_topic(self, topic: str, partitions: int = 1) -> None:
        self._tool(
            "org.apache.kafka.tools.TopicCommand",
            ["--bootstrap-server", self.bootstrap, "--create", "--if-not-exists", "--topic", topic,
             "--partitions", str(partitions), "--replication-factor", "1"],
        )

    def topics(self) -> list[str]:
        out = self._tool("org.apache.kafka.tools.TopicCommand", ["--bootstrap-server", self.bootstrap, "--list"])
        return [t for t in out.split() if t]

    def produce(self, topic: str, records: Sequence[tuple[str | None, str]], separator: str = "\t") -> None:
        """Send ``(key, value)`` records (a None key: no key) with Kafka's console producer, in order."""
        keyed = any(k is not None for k, _ in records)
        lines = []
        for key, value in records:
            if separator in value or "\n" in value or (key is not None and (separator in key or "\n" in key)):
                raise ValueError(f"record holds the separator or a newline: {key!r} {value!r}")
            lines.append(f"{key or ''}{separator}{value}" if keyed else value)
        args = ["--bootstrap-server", self.bootstrap, "--topic", topic]
        if keyed:
            args += ["--property", "parse.key=true", "--property", f"key.separator={separator}"]
        self._tool("org.apache.kafka.tools.ConsoleProducer", args, ("\n".join(lines) + "\n").encode())

    def consume(self, topic: str, max_messages: int, timeout_s: float = 60) -> list[tuple[str, str]]:
        """The first ``max_messages`` records of ``topic`` as ``(key, value)`` text (``"null"`` for a
        null), with Kafka's console consumer."""
        out = self._tool(
            "org.apache.kafka.tools.consumer.ConsoleConsumer",
            [
                "--bootstrap-server",
                self.bootstrap,
                "--topic",
                topic,
                "--from-beginning",
                "--max-messages",
                str(max_messages),
                "--timeout-ms",
                str(int(timeout_s * 1000)),
                "--formatter-property",
                "print.key=true",
                "--formatter-property",
                "key.separator=\t",
            ],
        )
        return [tuple(line.split("\t", 1)) for line in out.splitlines() if "\t" in line]  # type: ignore[misc]

    def end_offsets(self, topic_pattern: str = ".*") -> dict[str, dict[int, int]]:
        """The end offset (next offset) of each partition of the topics matching ``topic_pattern``."""
        out = self._tool(
            "org.apache.kafka.tools.GetOffsetShell",
            ["--bootstrap-server", self.bootstrap, "--topic", topic_pattern, "--time", "-1"],
        )
        offsets: dict[str, dict[int, int]] = {}
        for line in out.splitlines():
            parts = line.strip().rsplit(":", 2)
            if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                offsets.setdefault(parts[0], {})[int(parts[1])] = int(parts[2])
        return offsets


class KafkaConnect:
    """A standalone Kafka Connect worker with one Debezium connector (PostgreSQL or MariaDB), JsonConverter for
    keys and values (``schemas_enable``: with or without the ``schema`` part), offsets in a file
    under ``root`` (kept across restarts: a restart resumes from the last flushed offset and
    re-sends what came after it, as Connect does)."""

    def __init__(
        self,
        root: Path,
        bootstrap: str,
        connector: dict[str, str],
        schemas_enable: bool = True,
        version: str = KAFKA_VERSION,
        debezium: str = DEBEZIUM_VERSION,
        offset_flush_ms: int = 1000,
    ) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.home = connect_home(version, debezium)
        self.bootstrap = bootstrap
        self.connector = dict(connector)
        self.schemas_enable = schemas_enable
        state = root / "connect.json"
        if state.exists():
            self.rest_port = int(json.loads(state.read_text())["rest_port"])
        else:
            self.rest_port = free_port()
            state.write_text(json.dumps({"rest_port": self.rest_port}))
        self.offset_flush_ms = offset_flush_ms
        self.process = JavaProcess(root, "connect")

    def _configure(self) -> tuple[Path, Path]:
        schemas = "true" if self.schemas_enable else "false"
        worker = self.root / "worker.properties"
        worker.write_text(
            "\n".join(
                [
                    f"bootstrap.servers={self.bootstrap}",
                    "key.converter=org.apache.kafka.connect.json.JsonConverter",
                    "value.converter=org.apache.kafka.connect.json.JsonConverter",
                    f"key.converter.schemas.enable={schemas}",
                    f"value.converter.schemas.enable={schemas}",
                    f"offset.storage.file.filename={self.root / 'connect.offsets'}",
                    f"offset.flush.interval.ms={self.offset_flush_ms}",
                    f"plugin.path={self.home / 'plugins'}",
                    # Plugins found by their ServiceLoader manifests, without scanning every class
                    # of every jar (a minute of start-up on a busy machine).
                    "plugin.discovery=service_load",
                    f"listeners=http://127.0.0.1:{self.rest_port}",
                    "",
                ]
            )
        )
        connector = self.root / "connector.properties"
        connector.write_text("\n".join(f"{k}={v}" for k, v in self.connector.items()) + "\n")
        return worker, connector

    def start(self) -> None:
        if self.process.alive():
            return
        worker, connector = self._configure()
        self.process.spawn(
            f"{self.home / 'lib' / '*'}",
            "org.apache.kafka.connect.cli.ConnectStandalone",
            [str(worker), str(connector)],
        )
        _wait(self._running, self.process, f"Kafka Connect (REST on {self.rest_port})", timeout_s=START_TIMEOUT_S * 2)

    def status(self) -> dict[str, object] | None:
        name = self.connector.get("name", "")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.rest_port}/connectors/{name}/status", timeout=5) as r:
                return dict(json.loads(r.read()))
        except (OSError, ValueError):
            return None

    def _running(self) -> bool:
        status = self.status()
        if status is None:
            return False
        tasks = status.get("tasks") or []
        states = [t.get("state") for t in tasks if isinstance(t, dict)]
        if "FAILED" in states:
            raise self.process.failure(f"Debezium connector task failed: {json.dumps(status)[:3000]}")
        return bool(states) and all(s == "RUNNING" for s in states)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.process.stop(sig)

    def restart(self, sig: int = signal.SIGTERM) -> None:
        self.stop(sig)
        self.start()


def debezium_postgres_connector(
    name: str, port: int, database: str, user: str, topic_prefix: str, **settings: str
) -> dict[str, str]:
    """Debezium PostgreSQL connector settings for a server on 127.0.0.1 (pgoutput, trust auth)."""
    config = {
        "name": name,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "database.hostname": "127.0.0.1",
        "database.port": str(port),
        "database.user": user,
        "database.password": "",
        "database.dbname": database,
        "topic.prefix": topic_prefix,
        "plugin.name": "pgoutput",
        "slot.name": f"{name.replace('-', '_')}_slot",
        "publication.name": f"{name.replace('-', '_')}_pub",
        "publication.autocreate.mode": "all_tables",
        "snapshot.mode": "initial",
    }
    config.update(settings)
    return config


def debezium_mariadb_connector(
    name: str,
    port: int,
    database: str,
    user: str,
    password: str,
    topic_prefix: str,
    history_file: Path,
    server_id: int = 5400,
    **settings: str,
) -> dict[str, str]:
    """Debezium MariaDB connector settings for a server on 127.0.0.1 (binary log in row format), its
    schema history (the DDL it has seen, which a binlog connector needs to decode rows) in a file."""
    config = {
        "name": name,
        "connector.class": "io.debezium.connector.mariadb.MariaDbConnector",
        "tasks.max": "1",
        "database.hostname": "127.0.0.1",
        "database.port": str(port),
        "database.user": user,
        "database.password": password,
        "database.server.id": str(server_id),
        "database.include.list": database,
        "topic.prefix": topic_prefix,
        "schema.history.internal": "io.debezium.storage.file.history.FileSchemaHistory",
        "schema.history.internal.file.filename": str(history_file),
        "snapshot.mode": "initial",
    }
    config.update(settings)
    return config


# -- command line ----------------------------------------------------------------------------------


def _main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="pipeline_components.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch", help="fetch a bundle's jars into the cache")
    fetch.add_argument("bundle", choices=["kafka", "connect", "spark-kafka"])
    fetch.add_argument("--spark-version", default=None)
    jars = sub.add_parser("spark-kafka-jars", help="print the spark.jars value of Spark's Kafka source")
    jars.add_argument("--spark-version", required=True)
    kafka = sub.add_parser("kafka", help="start or stop a one-node KRaft broker in DIR")
    kafka.add_argument("action", choices=["start", "stop"])
    kafka.add_argument("dir", type=Path)
    kafka.add_argument("--port", type=int, default=None)
    connect = sub.add_parser("connect", help="start or stop Kafka Connect with Debezium in DIR")
    connect.add_argument("action", choices=["start", "stop"])
    connect.add_argument("dir", type=Path)
    connect.add_argument("--bootstrap", default=None)
    connect.add_argument("--connector", type=Path, default=None, help="connector .properties file")
    connect.add_argument("--schemas", choices=["true", "false"], default="true")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            if args.bundle == "kafka":
                print(kafka_home())
            elif args.bundle == "connect":
                print(connect_home())
            else:
                if not args.spark_version:
                    parser.error("fetch spark-kafka needs --spark-version")
                print(",".join(str(p) for p in spark_kafka_jars(args.spark_version)))
        elif args.command == "spark-kafka-jars":
            print(",".join(str(p) for p in spark_kafka_jars(args.spark_version)))
        elif args.command == "kafka":
            broker = KafkaBroker(args.dir.absolute(), args.port)
            if args.action == "start":
                broker.start()
                print(broker.bootstrap)
            else:
                broker.stop()
        else:
            if args.action == "stop":
                JavaProcess(args.dir.absolute(), "connect").stop()
                return 0
            if not args.bootstrap or not args.connector:
                parser.error("connect start needs --bootstrap and --connector")
            settings = {}
            for line in args.connector.read_text().splitlines():
                line = line.strip()
                if line and not line.startswith("#") and "=" in line:
                    key, value = line.split("=", 1)
                    settings[key.strip()] = value.strip()
            worker = KafkaConnect(args.dir.absolute(), args.bootstrap, settings, schemas_enable=args.schemas == "true")
            worker.start()
            print(f"http://127.0.0.1:{worker.rest_port}")
    except ComponentError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
