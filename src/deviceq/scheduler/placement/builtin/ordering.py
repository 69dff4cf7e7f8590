"""The static task orders: submission order (FIFO), priority then submission order, and the
same with aging applied from the view's submit times."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from ..rows import IdleDevice, QueuedTask
from ..view import View
from .aging import effective_priority


class FixedOrder:
    """An order that does not depend on what was placed."""

    def __init__(self, tasks: Iterable[QueuedTask]) -> None:
        self._tasks = tasks

    def __iter__(self) -> Iterator[QueuedTask]:
        return iter(self._tasks)

    def placed(self, task: QueuedTask, device: IdleDevice) -> None:
        pass


def _seq(t: QueuedTask) -> int:
    return t.seq


@dataclass(frozen=True)
class FifoSort:
    """Oldest first (the ``seq`` counter), across buckets: a merge of the buckets' heads,
    each already oldest first."""

    name: str = "fifo"
    needs: frozenset[str] = frozenset()

    def order(self, view: View) -> FixedOrder:
        return FixedOrder(heapq.merge(*(b.heads for b in view.buckets), key=_seq))


@dataclass(frozen=True)
class PrioritySort:
    """Highest priority first (the snapshot's effective priority), oldest first within one."""

    name: str = "priority"
    needs: frozenset[str] = frozenset()

    def order(self, view: View) -> FixedOrder:
        return FixedOrder(sorted(view.tasks(), key=lambda t: (-t.aged_priority, t.seq)))


@dataclass(frozen=True)
class AgingSort(PrioritySort):
    """`PrioritySort` with each task's priority aged from the view's submit times."""

    name: str = "aging"
    needs: frozenset[str] = frozenset({"submit_times"})

    def order(self, view: View) -> FixedOrder:
        prio = effective_priority(view)
        return FixedOrder(sorted(view.tasks(), key=lambda t: (-prio(t), t.seq)))
