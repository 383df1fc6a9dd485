"""docs/cli.md documents every command, every option and every exit code, and shows the example
config file that tests/integration/test_cli.py runs, as it is."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from iceberg_sink import cli

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "cli.md").read_text()


def test_the_example_config_is_shown_verbatim() -> None:
    example = (ROOT / "docs" / "examples" / "pipeline.yaml").read_text()
    assert '```yaml title="pipeline.yaml"\n' + example + "```" in DOC


def test_every_command_and_option_is_documented() -> None:
    subparsers = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, sub in subparsers.choices.items():
        if f"## `iceberg-sink {name}" not in DOC:
            missing.append(f"section for {name}")
        for action in sub._actions:
            missing += [
                f"{name} {o}"
                for o in action.option_strings
                if o.startswith("--") and o != "--help" and f"`{o}" not in DOC
            ]
    assert missing == []


def test_exit_codes_match_the_table() -> None:
    documented = {int(m[1]) for m in re.finditer(r"^\| (\d+) \|", DOC, re.MULTILINE)}
    codes = {v for k, v in vars(cli).items() if k.startswith("EXIT_") and isinstance(v, int)}
    assert documented == codes
    assert all(f"  {code} " in cli.EXIT_CODES for code in codes)
