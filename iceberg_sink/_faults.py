"""Named points in the checkpoint flow where tests inject failures (a SIGKILL of the driver).

Production code only calls :func:`hit`; with no handler installed it does nothing.
"""

from __future__ import annotations

from collections.abc import Callable

AFTER_WRITE = "after-write"  # writer tasks finished, nothing staged yet
AFTER_MANIFESTS = "after-manifests"  # staged manifests and committable persisted, no commit yet
AFTER_COMMIT = "after-commit"  # snapshot committed, committable not yet removed, Spark not told

_handlers: list[Callable[[str, int], None]] = []


def install(handler: Callable[[str, int], None]) -> None:
    _handlers.append(handler)


def clear() -> None:
    _handlers.clear()


def hit(point: str, checkpoint_id: int) -> None:
    for handler in list(_handlers):
        handler(point, checkpoint_id)
