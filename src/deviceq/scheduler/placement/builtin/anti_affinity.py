"""Anti-affinity: a retry prefers a device and host it has not lost an attempt on (0), then a
new device on a host it failed on (1), then a device it failed on (2).

`RetryElsewhere`: a retry after a failure blamed on the device (`DEVICE_BLAMED`) waits for
another device: up to the pool's ``retry_elsewhere_wait`` after the failure it takes none of
the devices it failed on (the snapshot reader sets `QueuedTask.avoid_until`, 0 when the pool
has no other matching device: then it returns to the same device at once). A permit, not a
score: anti-affinity already offers those devices last, so the task is offered one only when
no other matching device is idle, and then it waits (the device serves other tasks
meanwhile)."""

from __future__ import annotations

from dataclasses import dataclass

from ....core.vocabulary import DEVICE_FAULT_KINDS
from ..rows import IdleDevice, QueuedTask
from ..view import View


@dataclass(frozen=True)
class AntiAffinity:
    name: str = "anti_affinity"
    needs: frozenset[str] = frozenset({"avoid"})

    def applies(self, view: View, task: QueuedTask) -> bool:
        avoid = view.avoid
        return avoid is not None and task.task_id in avoid

    def task_key(self, view: View, task: QueuedTask, device: IdleDevice) -> int:
        rec = view.avoid.get(task.task_id) if view.avoid else None
        if rec is None:
            return 0
        if device.device_id in rec.devices:
            return 2
        return 1 if device.host_id in rec.hosts else 0


DEVICE_BLAMED: frozenset[str] = frozenset((*DEVICE_FAULT_KINDS, "lease_expired"))
"""The failure kinds that blame the device (its faults, and a lease its host lost)."""


def waits(task: QueuedTask, device: IdleDevice, now_ms: int) -> bool:
    """Whether ``task`` must not take ``device`` now: one it failed on, within its wait."""
    return task.avoid_until > now_ms and device.device_id in task.avoid_devices


class _Pass:
    def __init__(self, now_ms: int) -> None:
        self.now = now_ms

    def allows(self, task: QueuedTask, device: IdleDevice) -> bool:
        return not waits(task, device, self.now)

    def placed(self, task: QueuedTask, device: IdleDevice) -> None:
        return None

    def unplaced(self, task: QueuedTask, device: IdleDevice) -> None:
        return None

    def closed(self) -> list[str]:
        return []


@dataclass(frozen=True)
class RetryElsewhere:
    name: str = "retry_elsewhere"
    needs: frozenset[str] = frozenset()

    def start(self, view: View) -> _Pass | None:
        now = view.now_ms
        if not any(t.avoid_until > now for b in view.buckets for t in b.heads):
            return None  # (the common case: allows every pair, never asked)
        return _Pass(now)
