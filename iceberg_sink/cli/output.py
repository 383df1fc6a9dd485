"""What the command line prints, and how it stops when no one reads it any more.

Every line goes through :func:`emit`: a command's human output (:class:`Output`), progress, the
``--json`` document and the one-line error. When stdout's reader is gone (``iceberg-sink inspect t
--json | head -c 100``) :func:`emit` raises :class:`StdoutClosed` and ``main()`` stops quietly
(:func:`detach_stdout`, exit code 141, as a command killed by SIGPIPE), never with a traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import attrs


class StdoutClosed(Exception):
    """The reader of stdout went away (``iceberg-sink inspect t --json | head -c 10``): the command
    stops quietly, as a command killed by SIGPIPE does (the interpreter ignores SIGPIPE, and restoring
    its default would kill the process when a catalog's socket breaks instead)."""


def emit(text: str, stream: Any = None) -> None:
    """Write ``text`` to ``stream`` (stdout by default) now: every line the CLI prints goes through here.

    Raises:
        StdoutClosed: stdout's reader is gone. A closed stderr is ignored (there is no one to tell).
    """
    stream = sys.stdout if stream is None else stream
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        if stream is sys.stdout:
            raise StdoutClosed() from None


@attrs.frozen
class Output:
    """Where a command's output goes: human lines (off with --json) and progress."""

    json: bool
    progress_on: bool

    def say(self, text: str) -> None:
        """A line of human output on stdout; nothing with --json."""
        if not self.json:
            emit(text + "\n")

    def progress(self) -> Callable[[str, int, int], None] | None:
        """A (phase, done, total) progress callback, or None when progress is off."""
        if not self.progress_on:
            return None
        stream = sys.stderr if self.json else sys.stdout

        def show(phase: str, done: int, total: int) -> None:
            width = 30
            filled = int(width * done / total) if total else width
            end = "\n" if done >= total else ""
            emit(f"\r{phase:<8} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} groups{end}", stream)

        return show


def detach_stdout() -> None:
    """Point stdout at devnull, so that the interpreter's flush at exit does not fail again on the
    closed pipe (the Python docs' recipe, library/signal.html, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass  # stdout is not a file (an embedding program's stream): nothing left to flush at exit
