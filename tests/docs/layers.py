"""The layer drawing of docs/architecture.md, made from the layer contract of pyproject.toml.

``python -m tests.docs.layers`` prints the mermaid block; tests/docs/test_layers.py checks that the
page holds exactly it, so the drawing cannot drift from the contract import-linter enforces.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def layers() -> list[list[str]]:
    """The contract's layers, top first, each a list of its (independent) modules and packages."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = config["contracts"]
    return [[name.strip() for name in layer.split("|")] for layer in contract["layers"]]


def mermaid() -> str:
    """The drawing: one box a layer (its parts side by side, none importing another), each above
    the layers it may import."""
    lines = ["```mermaid", "flowchart TB"]
    for i, layer in enumerate(layers()):
        lines.append(f'    L{i}["{" | ".join(layer)}"]')
    chain = " --> ".join(f"L{i}" for i in range(len(layers())))
    lines += [f"    {chain}", "```"]
    return "\n".join(lines)


if __name__ == "__main__":
    print(mermaid())
