"""Fair share as a task order: the next device goes to the next task (highest effective
priority, then oldest) of the tenant holding the fewest devices per unit of weight, counting
what this pass gave it so far; a higher effective priority goes first across tenants. Tasks
without a tenant form one tenant of weight 1. A tenant's cap is not this plugin's concern
(the `tenant` limit's permit, `limit_caps`): a capped tenant's tasks are still offered, and
refused there."""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass

from ..rows import IdleDevice, QueuedTask, TenantShare
from ..view import View
from .aging import effective_priority

_NONE = TenantShare()


class FairOrder:
    """One pass's fair-share order: a heap of tenants keyed by (-priority of their next task,
    held / weight, its seq, name); a tenant goes back on the heap with its next task when the
    pass asks for the task after the one it offered (so what that task was given counts)."""

    def __init__(self, view: View) -> None:
        prio = effective_priority(view)
        tenants = view.tenants or {}
        queues: dict[str, list[tuple[int, int, QueuedTask]]] = {}
        for t in view.tasks():
            queues.setdefault(t.tenant or "", []).append((prio(t), -t.seq, t))
        for q in queues.values():  # best last: popped from the end
            q.sort(key=lambda e: (e[0], e[1]))
        self._queues = queues
        self._weight = {n: max(1, tenants.get(n, _NONE).weight) for n in queues}
        self._held = {n: tenants.get(n, _NONE).held for n in queues}
        self._heap: list[tuple[int, float, int, str]] = []
        self._last: str | None = None
        for name in queues:
            self._push(name)

    def _push(self, name: str) -> None:
        q = self._queues[name]
        if q:
            p, neg_seq, _ = q[-1]
            heapq.heappush(self._heap, (-p, self._held[name] / self._weight[name], -neg_seq, name))

    def __iter__(self) -> Iterator[QueuedTask]:
        return self

    def __next__(self) -> QueuedTask:
        if self._last is not None:
            self._push(self._last)
            self._last = None
        if not self._heap:
            raise StopIteration
        name = heapq.heappop(self._heap)[3]
        self._last = name
        return self._queues[name].pop()[2]

    def placed(self, task: QueuedTask, device: IdleDevice) -> None:
        self._held[task.tenant or ""] += 1


@dataclass(frozen=True)
class FairShareSort:
    name: str = "fair_share"
    needs: frozenset[str] = frozenset({"tenants", "submit_times"})

    def order(self, view: View) -> FairOrder:
        return FairOrder(view)
