"""Jars from Maven Central, fetched once into a cache folder with the ``mvn`` command: the one
fetcher of the project (scripts/pipeline_components.py for Kafka, Kafka Connect + Debezium and
Spark's Kafka source; tests/interop/java_env.py, through tests/interop/maven.py, for the Iceberg
Java readers).

Standard library only: it runs before the project's venv exists. scripts/ is not a package, so
callers load this file by path under the module name ``iceberg_sink_script_maven_fetch`` (one
module object, one ``MavenFetchError`` class, whoever loads it first).

``fetch_jars(name, coordinates)`` writes a throwaway pom listing ``coordinates`` (``group:artifact:
version``), runs ``mvn -B dependency:copy-dependencies`` on it (batch mode, no stdin) with its local
repository inside the cache, and returns the jars it copied: only those of ``coordinates``, or with
``transitive=True`` their runtime dependencies too (less any ``exclude_groups``). The jars of one set
live in ``<cache>/maven/sets/<name>-<hash of what was asked>/``; a ``jars.json`` written last marks a
set as complete, so an interrupted fetch is redone and a complete one is reused without starting
Maven (about a millisecond). Concurrent callers are serialized by a lock file in the cache.

The cache is ``$ICEBERG_SINK_CACHE/maven`` (default ``~/.cache/iceberg-sink/maven``). Any failure
(no ``mvn``, no network, an unknown version) raises ``MavenFetchError`` with Maven's output.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from xml.sax.saxutils import escape

CACHE_ENV_VAR: str = "ICEBERG_SINK_CACHE"
MARKER_NAME: str = "jars.json"
FETCH_TIMEOUT_S: float = 1800.0


class MavenFetchError(RuntimeError):
    """Fetching jars from Maven Central failed; the message carries Maven's output."""


def cache_root() -> Path:
    """``$ICEBERG_SINK_CACHE/maven`` if set, else ``~/.cache/iceberg-sink/maven``."""
    base = os.environ.get(CACHE_ENV_VAR)
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "iceberg-sink"
    return (root / "maven").resolve()


def _pom(coordinates: Sequence[str]) -> str:
    deps = []
    for coordinate in coordinates:
        parts = coordinate.split(":")
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"expected a Maven coordinate 'group:artifact:version', got {coordinate!r}")
        group, artifact, version = (escape(p) for p in parts)
        deps.append(
            f"    <dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
            f"<version>{version}</version></dependency>"
        )
    body = "\n".join(deps)
    return f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>iceberg-sink.local</groupId>
  <artifactId>jar-set</artifactId>
  <version>0</version>
  <packaging>pom</packaging>
  <dependencies>
{body}
  </dependencies>
</project>
"""


def _complete(target: Path) -> list[Path] | None:
    try:
        names = json.loads((target / MARKER_NAME).read_text(encoding="utf-8"))["jars"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    jars = [target / str(n) for n in names]
    return jars if jars and all(j.is_file() for j in jars) else None


def set_dir(name: str, coordinates: Sequence[str], *, transitive: bool = False, exclude_groups: Sequence[str] = ()) -> Path:
    """The cache folder of one set of jars: its name and a hash of what it holds."""
    asked: dict[str, object] = {"coordinates": list(coordinates), "transitive": transitive}
    if exclude_groups:  # absent otherwise, so that the sets fetched before it existed keep their folder
        asked["exclude_groups"] = sorted(exclude_groups)
    key = json.dumps(asked, sort_keys=True)
    return cache_root() / "sets" / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def fetched(name: str) -> list[Path] | None:
    """The jars of a complete set called ``name``, whatever was asked for it (the newest if several),
    or None: for a caller that resolves its coordinates over the network and would rather not."""
    sets = sorted(
        (p for p in (cache_root() / "sets").glob(f"{name}-*") if len(p.name) == len(name) + 13),
        key=lambda p: p.stat().st_mtime,
    )
    for target in reversed(sets):
        found = _complete(target)
        if found is not None:
            return found
    return None


def fetch_jars(
    name: str, coordinates: Sequence[str], *, transitive: bool = False, exclude_groups: Sequence[str] = ()
) -> list[Path]:
    """The jars of ``coordinates`` (and, with ``transitive``, of their runtime dependencies but those
    of ``exclude_groups``), fetched once.

    Returns them sorted by file name. Raises ``MavenFetchError`` when Maven fails or copies a file
    that is not a jar.
    """
    target = set_dir(name, coordinates, transitive=transitive, exclude_groups=exclude_groups)
    found = _complete(target)
    if found is not None:
        return found
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MavenFetchError(
            f"mvn not found: Maven is needed to fetch {', '.join(coordinates)} from Maven Central "
            "(install the Debian package maven)"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / f".{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = _complete(target)  # another process may have fetched it while we waited
        if found is not None:
            return found
        return _fetch(mvn, target, coordinates, transitive, exclude_groups)


def _fetch(
    mvn: str, target: Path, coordinates: Sequence[str], transitive: bool, exclude_groups: Sequence[str]
) -> list[Path]:
    shutil.rmtree(target, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=target.parent) as tmp:
        work = Path(tmp)
        (work / "pom.xml").write_text(_pom(coordinates), encoding="utf-8")
        out = work / "jars"
        cmd = [
            mvn,
            "-B",  # batch mode: no prompts, no progress bars
            "-q",
            f"-Dmaven.repo.local={cache_root() / 'repository'}",
            "-f",
            str(work / "pom.xml"),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={out}",
            f"-DexcludeTransitive={'false' if transitive else 'true'}",
        ]
        if transitive:
            cmd.append("-DincludeScope=runtime")
        if exclude_groups:
            cmd.append(f"-DexcludeGroupIds={','.join(exclude_groups)}")
        print(f"== fetching {', '.join(coordinates)} into {target}", file=sys.stderr)
        try:
            proc = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=FETCH_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise MavenFetchError(f"mvn did not finish in {FETCH_TIMEOUT_S:.0f}s: {' '.join(cmd)}") from exc
        if proc.returncode != 0:
            raise MavenFetchError(
                f"fetching {', '.join(coordinates)} from Maven Central failed (mvn exit {proc.returncode}): "
                f"{' '.join(cmd)}\n--- output ---\n{proc.stdout}"
            )
        jars = sorted(out.glob("*.jar")) if out.is_dir() else []
        if not jars:
            raise MavenFetchError(f"mvn copied no jars for {', '.join(coordinates)}\n--- output ---\n{proc.stdout}")
        for jar in jars:
            if not zipfile.is_zipfile(jar):
                raise MavenFetchError(f"{jar.name} fetched for {', '.join(coordinates)} is not a jar (zip) file")
        (out / MARKER_NAME).write_text(
            json.dumps({"coordinates": list(coordinates), "jars": [j.name for j in jars]}, indent=2), encoding="utf-8"
        )
        out.rename(target)
    found = _complete(target)
    if found is None:
        raise MavenFetchError(f"{target} is incomplete right after fetching it")
    return found
