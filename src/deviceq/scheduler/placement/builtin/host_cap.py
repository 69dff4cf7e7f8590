"""A host whose devices hold the pool's ``max_tasks_per_host`` leases (held when the snapshot
was read, plus the pairs placed on it this pass) gets no more in the pass; the commit enforces
the cap as well (``host_cap`` in lua/assign.lua, counted in ``host_held``). A permit, not a
filter or a score: it depends on what the pass placed so far. Its answer depends on the device
only, so a host at its cap is ``closed``: its devices count as taken and the next task takes
the best device of another host. A multi-device task counts each of its devices on a host
(``allows_gang``: all of them must fit); its roles are picked before permits judge them, so a
gang whose picks put more devices on one host than it has room for is refused for the pass
even where another spread of its roles would fit. With the cap 0 (the default) it allows
every pair."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..rows import IdleDevice, QueuedTask
from ..view import View


class HostCapState:
    """One pass's leases per host: those held at the snapshot plus those placed so far."""

    def __init__(self, cap: int, held: Mapping[str, int], devices: tuple[IdleDevice, ...]) -> None:
        self._cap = cap
        self._held = dict(held)
        self._devices: dict[str, list[str]] = {}
        self._closed: list[str] = []
        if cap > 0:
            for d in devices:
                self._devices.setdefault(d.host_id, []).append(d.device_id)
            for host in self._devices:
                if self._held.get(host, 0) >= cap:
                    self._closed.extend(self._devices[host])

    def allows(self, task: QueuedTask, device: IdleDevice) -> bool:
        return self._cap <= 0 or self._held.get(device.host_id, 0) < self._cap

    def allows_gang(self, task: QueuedTask, devices: Sequence[IdleDevice | None]) -> bool:
        """Whether every one of a multi-device task's devices fits on its host (a role
        without a device yet takes none)."""
        if self._cap <= 0:
            return True
        more: dict[str, int] = {}
        for d in devices:
            if d is not None:
                more[d.host_id] = more.get(d.host_id, 0) + 1
        return all(self._held.get(h, 0) + n <= self._cap for h, n in more.items())

    def placed(self, task: QueuedTask, device: IdleDevice) -> None:
        if self._cap > 0:
            n = self._held[device.host_id] = self._held.get(device.host_id, 0) + 1
            if n == self._cap:
                self._closed.extend(self._devices.get(device.host_id, ()))

    def unplaced(self, task: QueuedTask, device: IdleDevice) -> None:
        if self._cap > 0:
            self._held[device.host_id] = self._held.get(device.host_id, 0) - 1

    def closed(self) -> list[str]:
        out = self._closed
        if out:
            self._closed = []
        return out


@dataclass(frozen=True)
class HostCap:
    """The pool's cap on leases held on one host's devices at once (``View.max_tasks_per_host``
    over ``View.host_tasks``)."""

    name: str = "host_cap"
    needs: frozenset[str] = frozenset({"host_tasks"})

    def start(self, view: View) -> HostCapState | None:
        """None at cap 0: every pair is allowed, nothing is counted."""
        if view.max_tasks_per_host <= 0:
            return None
        return HostCapState(view.max_tasks_per_host, view.host_tasks or {}, view.devices)
