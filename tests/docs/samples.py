"""Code samples of README.md and docs/: collected from the Markdown and run by tests/docs/test_samples.py.

Conventions (docs/contributing-docs.md says the same for writers):

- A fenced block tagged ``python`` runs in the page's namespace; a block tagged ``bash`` (or ``sh``)
  runs with ``bash -euo pipefail``. All blocks of one page run in order, in one fresh working
  directory, so a later block sees the variables (and files) of the earlier ones. ``spark`` is the
  test session's SparkSession; the embedded default catalog is ``./iceberg-sink-data`` in that
  directory. In bash blocks ``python`` and ``iceberg-sink`` are this checkout's.
- ``<!-- sample-setup`` ... ``-->``: hidden Python that runs at that point of the page (fixture data
  such as ``streaming_df`` or ``df``); HTML comments do not show on the site.
- A block with ``title="NAME"`` in its info string (any language, e.g. ``yaml title="pipeline.yaml"``)
  is written to the file NAME in the working directory when it is reached, for later blocks to use.
- ``text`` (output, layouts) and ``mermaid`` (diagrams) blocks are not code and are not run.
- ``<!-- not-run: REASON -->`` on the line before a fence excludes that block; REASON must say why it
  cannot run here (a Kafka cluster, an S3 bucket, a benchmark taking minutes). Use it sparingly.
- Every other fence (untagged, or another language without a title) is an error: tag or mark it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

PYTHON = frozenset({"python", "py"})
SHELL = frozenset({"bash", "sh", "shell"})
NOT_CODE = frozenset({"text", "mermaid"})

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_NOT_RUN = re.compile(r"^\s*<!--\s*not-run:(?P<reason>.*?)-->\s*$")
_SETUP_OPEN = re.compile(r"^\s*<!--\s*sample-setup\s*$")
_TITLE = re.compile(r"""title=(?:"([^"]*)"|'([^']*)'|(\S+))""")


class SampleError(AssertionError):
    """A page breaks the conventions, or one of its samples failed."""


@dataclass(frozen=True)
class Block:
    """One fenced block or hidden setup of a page."""

    page: str
    line: int  # 1-based line of the opening fence (or comment)
    kind: str  # "python", "shell", "file", "setup", "skip"
    code: str
    lang: str = ""
    title: str = ""
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def page_name(path: Path) -> str:
    return path.resolve().relative_to(ROOT).as_posix()


def parse(text: str, page: str) -> list[Block]:
    """Every block of a page, in order; raises SampleError for a fence the conventions do not cover."""
    lines = text.splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if _SETUP_OPEN.match(line):
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "-->"), None)
            if end is None:
                raise SampleError(f"{page}:{i + 1}: <!-- sample-setup is never closed by a line holding only -->")
            blocks.append(Block(page, i + 1, "setup", "\n".join(lines[i + 1 : end]) + "\n", "python"))
            i = end + 1
            continue
        m = _FENCE.match(line)
        if not m:
            i += 1
            continue
        indent, fence, info = m["indent"], m["fence"], m["info"].strip()
        end = next(
            (
                j
                for j in range(i + 1, len(lines))
                if lines[j].strip().startswith(fence[0] * len(fence)) and not lines[j].strip().strip(fence[0])
            ),
            None,
        )
        if end is None:
            raise SampleError(f"{page}:{i + 1}: fence {fence} is never closed")
        body = "\n".join(_dedent(lines[j], indent) for j in range(i + 1, end)) + "\n"
        lang = info.split()[0].lstrip(".").lower() if info else ""
        title_match = _TITLE.search(info)
        title = next((g for g in title_match.groups() if g), "") if title_match else ""
        previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        skip = _NOT_RUN.match(previous)
        where = f"{page}:{i + 1}"
        if skip:
            reason = skip["reason"].strip()
            if not reason:
                problems.append(f"{where}: <!-- not-run: --> needs a reason saying why the block cannot run here")
            blocks.append(Block(page, i + 1, "skip", body, lang, title, reason))
        elif lang in NOT_CODE:
            pass
        elif title:
            blocks.append(Block(page, i + 1, "file", body, lang, title))
        elif lang in PYTHON:
            blocks.append(Block(page, i + 1, "python", body, lang))
        elif lang in SHELL:
            blocks.append(Block(page, i + 1, "shell", body, lang))
        elif not lang:
            problems.append(
                f"{where}: untagged fence: tag it python or bash (run), text or mermaid (not code), "
                'give it title="FILE" (written for later blocks), or mark it <!-- not-run: REASON -->'
            )
        else:
            problems.append(
                f'{where}: a {lang!r} block is neither run nor written to a file: give it title="FILE" for '
                "a later block to use, or mark it <!-- not-run: REASON -->"
            )
        i = end + 1
    if problems:
        raise SampleError("\n".join(problems))
    return blocks


def _dedent(line: str, indent: str) -> str:
    return line[len(indent) :] if line.startswith(indent) else line.lstrip(" \t")


def _entry_points() -> dict[str, str]:
    scripts: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    return scripts


def tool_dir(where: Path) -> Path:
    """A folder to put first on PATH: ``python`` is this interpreter, console scripts run this checkout."""
    where.mkdir(parents=True, exist_ok=True)
    # A wrapper, not a symlink: a venv's interpreter finds its pyvenv.cfg through the path it is started by.
    python = where / "python"
    python.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    for name, target in _entry_points().items():
        module, _, func = target.partition(":")
        script = where / name
        script.write_text(
            f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c "
            + shlex.quote(f"import sys; from {module} import {func}; sys.exit({func}())")
            + ' "$@"\n'
        )
        script.chmod(0o755)
    return where


@contextlib.contextmanager
def _cwd(path: Path) -> Iterator[None]:
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def run_page(blocks: list[Block], workdir: Path, namespace: dict[str, Any], tools: Path) -> int:
    """Run a page's blocks in order in ``workdir``; raise SampleError naming the first that fails.

    Returns the number of blocks run (setups and files included).
    """
    env = dict(os.environ)
    env["PATH"] = f"{tools}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    ran = 0
    with _cwd(workdir):
        for block in blocks:
            if block.kind == "skip":
                continue
            started = time.monotonic()
            if block.kind == "file":
                target = workdir / block.title
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(block.code)
            elif block.kind in ("python", "setup"):
                try:
                    exec(compile(block.code, block.where, "exec"), namespace)
                except Exception as e:
                    raise SampleError(
                        f"{block.where}: {block.kind} block failed: {type(e).__name__}: {e}\n"
                        + "".join(traceback.format_exception(e))
                    ) from e
            else:
                done = subprocess.run(
                    ["bash", "-euo", "pipefail", "-c", block.code],
                    cwd=workdir,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                sys.stdout.write(done.stdout)
                if done.returncode != 0:
                    raise SampleError(
                        f"{block.where}: bash block failed with exit code {done.returncode}\n"
                        f"--- block\n{block.code}--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
                    )
            ran += 1
            print(f"[sample] {block.where} {block.kind}: {time.monotonic() - started:.1f} s")
    return ran
