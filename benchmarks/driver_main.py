"""The command line every benchmark driver shares: ``<python> -m benchmarks.<driver> SPEC.json``.

Drivers run in several venvs (the main one, the Java venvs, the Flink venv), so this module uses the
standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def driver_main(run: Callable[[dict[str, Any]], dict[str, Any]], usage: str | None, argv: list[str]) -> int:
    """Run ``run`` on the JSON spec named by the one argument and write its result where the spec's
    ``result`` says; print ``usage`` and return 2 on any other arguments."""
    import sys

    if len(argv) != 1:
        print(usage or "usage: python -m benchmarks.<driver> SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    result = run(spec)
    Path(spec["result"]).write_text(json.dumps(result, indent=2), encoding="utf-8")
    return 0
