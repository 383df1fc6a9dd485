"""The embedded catalog's file and warehouse are the folder given, whatever characters its path
holds (tests/integration/test_special_locations.py writes and reads such a table end to end)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from iceberg_sink.errors import InvalidSinkConfigError
from iceberg_sink.table.catalog import CatalogConfig

NAMES = ["plain", "My Lake", "50%41", "%20", "é ü", "a+b;c=d&e", "x@y:z", "[brackets]"]


@pytest.mark.parametrize("name", NAMES)
def test_the_catalog_file_and_warehouse_are_under_the_folder_given(tmp_path: Path, name: str) -> None:
    base = tmp_path / name
    props = dict(CatalogConfig.embedded(base).properties)
    assert make_url(props["uri"]).database == str(base / "catalog.db")  # what SQLAlchemy opens
    assert props["warehouse"] == f"file://{base}/warehouse"  # read literally by PyIceberg's file IO
    assert (base / "warehouse").is_dir()


@pytest.mark.parametrize("bad", ["?", "#", "\n", "\t", "\x7f"])
def test_a_root_a_location_would_cut_is_refused_and_nothing_is_created(tmp_path: Path, bad: str) -> None:
    with pytest.raises(InvalidSinkConfigError, match=r"embedded\(root\): expected a folder whose path holds no"):
        CatalogConfig.embedded(tmp_path / f"lake{bad}x")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("uri", ["file:/data/lake", "file:///data/lake", "s3://b/lake"])
def test_a_uri_is_refused_as_an_embedded_root(tmp_path: Path, uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidSinkConfigError, match=r"embedded\(root\): expected a local folder .* received the URI"):
        CatalogConfig.embedded(uri)
    assert list(tmp_path.iterdir()) == []  # no folder 'file:' made here
