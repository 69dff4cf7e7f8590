"""A tenant at its ``max_devices`` cap (devices its tasks hold, counting this pass's) gets no
more devices in the pass (the commit enforces the cap as well: ``tenant_cap``). A permit, not
a filter: it depends on what the pass placed so far, not on the device. A multi-device task
counts every one of its roles' devices: it is refused unless all of them fit under the cap."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..rows import IdleDevice, QueuedTask
from ..view import View


class CapState:
    def __init__(self, view: View) -> None:
        tenants = view.tenants or {}
        self._cap = {n: s.max_devices for n, s in tenants.items() if s.max_devices}
        self._held = {n: tenants[n].held for n in self._cap}

    def allows(self, task: QueuedTask, device: IdleDevice) -> bool:
        name = task.tenant or ""
        cap = self._cap.get(name)
        return cap is None or self._held[name] < cap

    def allows_gang(self, task: QueuedTask, devices: Sequence[IdleDevice | None]) -> bool:
        name = task.tenant or ""
        cap = self._cap.get(name)
        return cap is None or self._held[name] + len(devices) <= cap

    def placed(self, task: QueuedTask, device: IdleDevice) -> None:
        name = task.tenant or ""
        if name in self._held:
            self._held[name] += 1

    def unplaced(self, task: QueuedTask, device: IdleDevice) -> None:
        name = task.tenant or ""
        if name in self._held:
            self._held[name] -= 1

    def closed(self) -> tuple[str, ...]:
        return ()  # (a cap of the task's tenant, not of a device)


@dataclass(frozen=True)
class TenantCap:
    name: str = "tenant_cap"
    needs: frozenset[str] = frozenset({"tenants"})

    def start(self, view: View) -> CapState:
        return CapState(view)
