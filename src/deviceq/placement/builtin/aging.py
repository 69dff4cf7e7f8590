"""Effective priority: ``priority`` raised one level per ``aging_ms`` waited (`aged`, the rule
the snapshot reader applies), from the view's submit times."""

from __future__ import annotations

from collections.abc import Callable

from ...scheduler.strategies import QueuedTask, aged
from ..view import View


def effective_priority(view: View) -> Callable[[QueuedTask], int]:
    """The priority to order ``view``'s tasks by. Without submit times in the view: what the
    snapshot set (`QueuedTask.aged_priority`). With them: aged from them, as the reader does,
    only when aging is on and the view's buckets have more than one priority (with one,
    aging cannot change an order within it, so the reader skips it, and so must the order
    across tenants)."""
    submitted = view.submit_times
    if submitted is None:
        return _snapshot_priority
    if view.aging_ms <= 0 or len({b.priority for b in view.buckets}) <= 1:
        return _raw_priority
    now, aging = view.now_ms, view.aging_ms

    def prio(t: QueuedTask) -> int:
        return aged(t.priority, submitted.get(t.task_id, 0), now, aging)

    return prio


def _snapshot_priority(t: QueuedTask) -> int:
    return t.aged_priority


def _raw_priority(t: QueuedTask) -> int:
    return t.priority
