"""Effective priority: ``priority`` raised one level per ``aging_ms`` waited (`aged`, the rule
the snapshot reader applies), from the view's submit times."""

from __future__ import annotations

from collections.abc import Callable

from ..rows import QueuedTask, aged
from ..view import View


def effective_priority(view: View) -> Callable[[QueuedTask], int]:
    """The priority to order ``view``'s tasks by: aged from the view's submit times when aging
    is on and the view's buckets have more than one priority (with one, aging cannot change
    an order within it, nor, by rule, the order across tenants); otherwise the task's
    priority as it is (`QueuedTask.aged_priority`: aged already in a whole-pass snapshot)."""
    submitted = view.submit_times
    if submitted is None or view.aging_ms <= 0 or len({b.priority for b in view.buckets}) <= 1:
        return _raw_priority
    now, aging = view.now_ms, view.aging_ms

    def prio(t: QueuedTask) -> int:
        return aged(t.priority, submitted.get(t.task_id, 0), now, aging)

    return prio


def _raw_priority(t: QueuedTask) -> int:
    return t.aged_priority  # (the priority itself unless a snapshot reader aged it)
