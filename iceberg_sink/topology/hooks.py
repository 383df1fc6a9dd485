"""Post-commit topology, part 1: user hooks around each commit.

- Pre-commit hooks run on the driver before a checkpoint's commit with its :class:`CommitSummary`;
  each may return snapshot properties to add, or raise to veto (the checkpoint stays pending under
  the checkpoint location, the stream stops, and a restart commits it, running the hooks again).
- Post-commit hooks run after each successful commit with a :class:`CommitResult`, in registration
  order. A failing post-commit hook is logged and counted and never undoes the commit; it stops the
  stream only when ``iceberg-sink.post-commit.fail-on-error`` is true.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import attrs

from iceberg_sink.committer.committable import CommitSummary
from iceberg_sink.errors import CommitVetoedError, IcebergSinkError
from iceberg_sink.observe.metrics import SinkMetrics

logger = logging.getLogger(__name__)


@attrs.frozen
class CommitResult:
    """What a post-commit hook receives about one committed checkpoint.

    Attributes:
        table: the table identifier.
        branch: the branch committed to.
        job_id: the sink's job id.
        checkpoint_id: the checkpoint (micro-batch) id.
        snapshot_id: the new snapshot.
        sequence_number: its sequence number.
        operation: ``append``, ``overwrite`` or ``delete``.
        snapshot_summary: the snapshot's summary properties.
        checkpoint: the checkpoint's counts (files, records, bytes, deletes).
    """

    table: str
    branch: str
    job_id: str
    checkpoint_id: int
    snapshot_id: int
    sequence_number: int
    operation: str
    snapshot_summary: Mapping[str, str]
    checkpoint: CommitSummary


PreCommitHook = Callable[[CommitSummary], Mapping[str, str] | None]
PostCommitHook = Callable[[CommitResult], None]


class PostCommitHookError(IcebergSinkError, RuntimeError):
    """A post-commit hook failed and the sink is configured to stop on it. The commit stands."""


class HookRunner:
    """Runs the registered hooks in order, with the sink's failure policy."""

    def __init__(
        self,
        pre: Sequence[PreCommitHook],
        post: Sequence[PostCommitHook],
        fail_on_post_error: bool,
        metrics: SinkMetrics,
    ) -> None:
        self._pre = tuple(pre)
        self._post = tuple(post)
        self._fail_on_post_error = fail_on_post_error
        self._metrics = metrics

    def before_commit(self, summary: CommitSummary) -> dict[str, str]:
        """Snapshot properties added by the hooks; raises CommitVetoedError on a veto."""
        properties: dict[str, str] = {}
        for hook in self._pre:
            try:
                added = hook(summary)
            except Exception as e:
                self._metrics.add(vetoed_commits=1)
                raise CommitVetoedError(
                    f"pre-commit hook {_name(hook)} vetoed checkpoint {summary.checkpoint_id}: {e}; it stays pending "
                    "under the checkpoint location and is committed when the stream restarts"
                ) from e
            if added:
                bad = {k: v for k, v in added.items() if not isinstance(k, str) or not isinstance(v, str)}
                if bad:
                    raise CommitVetoedError(
                        f"pre-commit hook {_name(hook)} returned snapshot properties that are not str -> str: {bad!r}"
                    )
                properties.update(added)
        return properties

    def after_commit(self, result: CommitResult) -> None:
        for hook in self._post:
            try:
                hook(result)
            except Exception as e:
                self._metrics.add(post_commit_hook_failures=1)
                logger.exception(
                    "post-commit hook %s failed for checkpoint %s (snapshot %s committed)",
                    _name(hook),
                    result.checkpoint_id,
                    result.snapshot_id,
                )
                if self._fail_on_post_error:
                    raise PostCommitHookError(
                        f"post-commit hook {_name(hook)} failed after checkpoint {result.checkpoint_id} was committed "
                        f"as snapshot {result.snapshot_id}: {e}"
                    ) from e


def _name(hook: Callable[..., object]) -> str:
    return getattr(hook, "__qualname__", None) or repr(hook)
