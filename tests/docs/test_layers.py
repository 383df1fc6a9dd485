"""docs/architecture.md draws the layers of pyproject.toml's contract, as tests/docs/layers.py makes them."""

from __future__ import annotations

from tests.docs.layers import ROOT, layers, mermaid


def test_the_architecture_page_draws_the_layer_contract() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert mermaid() in page, "docs/architecture.md: paste the output of `python -m tests.docs.layers`"


def test_every_layer_has_a_row_in_the_page_s_table() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    for layer in layers():
        for part in layer:
            assert f"| `{part}`" in page, f"docs/architecture.md: no row for `{part}` in the layers table"


def test_the_drawing_follows_the_contract_order() -> None:
    drawing = mermaid()
    assert drawing.index('L0["cli"]') < drawing.index('"errors"]')
    assert "L0 --> L1" in drawing
