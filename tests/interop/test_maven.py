"""Jars from Maven Central (maven.py): fetched with mvn, cached, and failing loudly."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from tests.interop.maven import MARKER_NAME, MavenFetchError, fetch_jars, set_dir
from tests.scripts import load

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


def test_sets_asked_without_excluded_groups_keep_their_folder() -> None:
    """The folder of a set is a hash of what was asked; ``exclude_groups`` joins the hash only when
    given, so the sets fetched before it existed (the Java readers') are not fetched again."""
    coordinates = ["org.example:thing:1.0"]
    before = json.dumps({"coordinates": coordinates, "transitive": False}, sort_keys=True)
    assert set_dir("thing", coordinates).name == f"thing-{hashlib.sha256(before.encode()).hexdigest()[:12]}"
    assert set_dir("thing", coordinates, exclude_groups=["org.example"]) != set_dir("thing", coordinates)
    assert set_dir("thing", coordinates, transitive=True) != set_dir("thing", coordinates)


def test_a_complete_set_is_found_by_name_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``fetched(name)``: a complete set of that name whatever was asked (no Maven, no network); a
    longer name sharing the prefix and an incomplete set are not it."""
    monkeypatch.setenv("ICEBERG_SINK_CACHE", str(tmp_path / "cache"))
    fetch = load("maven_fetch.py")
    assert fetch.fetched("thing") is None
    for name, coordinates, complete in [
        ("thing", ["org.example:thing:1.0"], True),
        ("thing-2", ["org.example:thing:2.0"], True),
        ("thing", ["org.example:thing:3.0"], False),
    ]:
        target = set_dir(name, coordinates)
        target.mkdir(parents=True)
        jar = coordinates[0].split(":")[1] + "-" + coordinates[0].split(":")[2] + ".jar"
        with zipfile.ZipFile(target / jar, "w") as archive:
            archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
        if complete:
            (target / MARKER_NAME).write_text(json.dumps({"coordinates": coordinates, "jars": [jar]}))
    assert fetch.fetched("thing") == [set_dir("thing", ["org.example:thing:1.0"]) / "thing-1.0.jar"]
