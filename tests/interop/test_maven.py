"""Jars from Maven Central (maven.py): fetched with mvn, cached, and failing loudly."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from tests.interop.maven import MARKER_NAME, MavenFetchError, fetch_jars, set_dir

pytestmark = pytest.mark.interop


def test_an_unknown_version_fails_with_mavens_output() -> None:
    """Against Maven Central itself (the real cache): a version that does not exist is an error naming it."""
    with pytest.raises(MavenFetchError, match=r"(?s)org\.apache\.iceberg:iceberg-aws-bundle:0\.0\.404.*mvn exit"):
        fetch_jars("missing", ["org.apache.iceberg:iceberg-aws-bundle:0.0.404"])


def test_a_malformed_coordinate_is_refused() -> None:
    with pytest.raises(
        ValueError, match="expected a Maven coordinate 'group:artifact:version', got 'iceberg-aws-bundle'"
    ):
        fetch_jars("bad", ["iceberg-aws-bundle"])


def test_a_complete_set_is_reused_without_maven(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A set whose marker lists existing jars is returned as is; with a jar gone it is fetched again
    (here: fails, since mvn is off the PATH)."""
    monkeypatch.setenv("ICEBERG_SINK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    coordinates = ["org.example:thing:1.0"]
    target = set_dir("thing", coordinates)
    target.mkdir(parents=True)
    with zipfile.ZipFile(target / "thing-1.0.jar", "w") as jar:
        jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
    (target / MARKER_NAME).write_text(json.dumps({"coordinates": coordinates, "jars": ["thing-1.0.jar"]}))
    assert fetch_jars("thing", coordinates) == [target / "thing-1.0.jar"]
    (target / "thing-1.0.jar").unlink()
    with pytest.raises(MavenFetchError, match="mvn not found"):
        fetch_jars("thing", coordinates)
