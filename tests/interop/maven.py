"""Jars from Maven Central for the Java readers: scripts/maven_fetch.py, the project's one fetcher
(shared with scripts/pipeline_components.py: one cache folder, one way of calling ``mvn``)."""

from __future__ import annotations

from tests.scripts import load

_maven_fetch = load("maven_fetch.py")

MARKER_NAME: str = _maven_fetch.MARKER_NAME
MavenFetchError: type[RuntimeError] = _maven_fetch.MavenFetchError
cache_root = _maven_fetch.cache_root
fetch_jars = _maven_fetch.fetch_jars
set_dir = _maven_fetch.set_dir

__all__ = ["MARKER_NAME", "MavenFetchError", "cache_root", "fetch_jars", "set_dir"]
