"""The standard-library modules under scripts/ (not a package), loaded by path for the tests.

Each is registered as ``iceberg_sink_script_<file stem>``, the name scripts/pipeline_components.py
loads its sibling scripts/maven_fetch.py under: one module object per file in a process, so an
exception class raised by one caller is the class another catches.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load(file_name: str) -> ModuleType:
    """``scripts/<file_name>`` as a module, loaded once."""
    name = f"iceberg_sink_script_{Path(file_name).stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / file_name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
