"""The worker probe's function, run in this interpreter: what it reports missing, and that it
finds modules without importing them (importing pyarrow and pandas cost every start() ~1.5 s)."""

from __future__ import annotations

import json
import subprocess
import sys

from iceberg_sink.writer import workers


def _reply(modules: tuple[str, ...]) -> dict:
    return json.loads(next(iter(workers._probe_function(modules)([]))))


def test_missing_top_level_modules_and_parents_are_named() -> None:
    reply = _reply(("json", "no_such_module_xyz", "no_such_package_xyz.sub.module"))
    assert reply["python"] == sys.executable
    assert [(m["module"], m["missing"]) for m in reply["missing"]] == [
        ("no_such_module_xyz", "no_such_module_xyz"),
        ("no_such_package_xyz.sub.module", "no_such_package_xyz"),
    ]
    assert all("no_such" in m["error"] for m in reply["missing"])


def test_the_required_modules_are_found_without_being_imported() -> None:
    # The probe alone in a fresh interpreter, as a worker runs it (this process imported them long ago).
    code = (
        f"MODULES = {workers.REQUIRED_MODULES!r}\n" + workers._PROBE_SOURCE + "import sys, json\n"
        "reply = json.loads(next(iter(probe([]))))\n"
        "heavy = [m for m in ('pyarrow', 'pandas', 'pyiceberg', 'iceberg_sink.writer.task_writer') if m in sys.modules]\n"
        "print(json.dumps({'missing': reply['missing'], 'imported': heavy}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"missing": [], "imported": []}
