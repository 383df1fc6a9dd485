"""The documentation site builds with ``mkdocs build --strict`` (every page in the nav, no broken link)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.docs.samples import ROOT


def test_site_builds_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's banner about MkDocs 2.0
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    assert (site / "index.html").is_file()
    # The pipeline diagram is rendered by Material's mermaid support from a superfences custom fence.
    assert '<pre class="mermaid">' in (site / "architecture" / "index.html").read_text()
    # Hidden sample setups (HTML comments) stay hidden: none leaks into a page's visible HTML.
    leaks = []
    for html in site.rglob("*.html"):
        visible = re.sub(r"<!--.*?-->", "", html.read_text(), flags=re.S)
        if "contributing-docs" not in html.parts and ("sample-setup" in visible or "not-run:" in visible):
            leaks.append(str(html.relative_to(site)))
    assert not leaks, f"hidden sample setups or not-run markers show on {leaks}"
