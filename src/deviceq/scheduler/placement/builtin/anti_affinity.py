"""Anti-affinity: a retry prefers a device and host it has not lost an attempt on (0), then a
new device on a host it failed on (1), then a device it failed on (2)."""

from __future__ import annotations

from dataclasses import dataclass

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
