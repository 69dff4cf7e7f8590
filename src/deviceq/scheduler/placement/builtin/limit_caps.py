"""The declared limits as placement permits: `LimitCap` of a `deviceq.core.limits.Limit` gives a
pass no pair that would break the limit (the leases it counted when the snapshot was read,
plus the pairs placed on the same count field in this pass). The commit enforces every limit as
well (``NAME_cap`` in lua/assign.lua and gang_assign.lua, lua/lib/limits.lua), so a permit only
spares the pass a pair the commit would refuse. A permit, not a filter or a score: it depends on
what the pass placed so far. A limit counted by device fields only (``host``) closes a device
whose field is full (`closed`): its devices count as taken and the next task takes the best
device of another host. A multi-device task counts each of its devices (``allows_gang``: all of
them must fit); its roles are picked before permits judge them. With no bound set it allows
every pair (`LimitCap.start` answers None)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ....core.limits import LIMITS, Limit
from ..rows import IdleDevice, QueuedTask
from ..view import LimitLoad, View


class LimitState:
    """One pass's counts of one limit: those held at the snapshot plus those placed so far."""

    def __init__(self, limit: Limit, load: LimitLoad, devices: tuple[IdleDevice, ...]) -> None:
        self._limit = limit
        self._load = load
        self._held = dict(load.held)
        self._closed: list[str] = []
        # a limit counted by the device alone: its full fields close their devices
        self._by_field: dict[str, list[str]] | None = None
        if "tenant" not in limit.scope:
            self._by_field = {}
            for d in devices:
                key = limit.field(host=d.host_id)
                if key is not None:
                    self._by_field.setdefault(key, []).append(d.device_id)
            for key, ids in self._by_field.items():
                if self._full(key, 0):
                    self._closed.extend(ids)
        # a limit counted by tenant and host: the hosts full for a tenant close their devices
        # to that tenant's tasks (`closed_for`)
        self._on_host: dict[str, list[str]] | None = None
        self._full_hosts: dict[str, set[str]] = {}
        if "tenant" in limit.scope and "host" in limit.scope:
            self._on_host = {}
            for d in devices:
                self._on_host.setdefault(d.host_id, []).append(d.device_id)
            for key in self._held:
                if self._full(key, 0):
                    v = limit.values(key)
                    self._full_hosts.setdefault(v["tenant"], set()).add(v["host"])

    def _key(self, task: QueuedTask, device: IdleDevice | None) -> str | None:
        host = device.host_id if device is not None else None
        return self._limit.field(host=host, tenant=task.tenant or "")

    def _full(self, key: str, more: int) -> bool:
        cap = self._load.cap(key)
        return cap > 0 and self._held.get(key, 0) + more >= cap

    def allows(self, task: QueuedTask, device: IdleDevice) -> bool:
        key = self._key(task, device)
        return key is None or not self._full(key, 0)

    def allows_gang(self, task: QueuedTask, devices: Sequence[IdleDevice | None]) -> bool:
        """Whether every one of a multi-device task's devices fits under the limit (a role
        without a device yet counts where the limit is not keyed by the device: a tenant's)."""
        more: dict[str, int] = {}
        for d in devices:
            key = self._key(task, d)
            if key is not None:
                more[key] = more.get(key, 0) + 1
        return not any(self._full(key, n - 1) for key, n in more.items())

    def placed(self, task: QueuedTask, device: IdleDevice) -> None:
        key = self._key(task, device)
        if key is None:
            return
        n = self._held[key] = self._held.get(key, 0) + 1
        if n == self._load.cap(key):
            if self._by_field is not None:
                self._closed.extend(self._by_field.get(key, ()))
            if self._on_host is not None:
                v = self._limit.values(key)
                self._full_hosts.setdefault(v["tenant"], set()).add(v["host"])

    def unplaced(self, task: QueuedTask, device: IdleDevice) -> None:
        key = self._key(task, device)
        if key is not None:
            self._held[key] = self._held.get(key, 0) - 1
            if self._on_host is not None and not self._full(key, 0):
                v = self._limit.values(key)
                self._full_hosts.get(v["tenant"], set()).discard(v["host"])

    def closed_for(self, task: QueuedTask) -> list[str]:
        """The devices ``task`` may not take now: those on hosts where its tenant is at the
        limit (only for a limit counted by tenant and host; others close devices for every
        task, `closed`, or judge the task whatever the device)."""
        if self._on_host is None or not task.tenant:
            return []
        hosts = self._full_hosts.get(task.tenant)
        if not hosts:
            return []
        return [d for h in hosts for d in self._on_host.get(h, ())]

    def closed(self) -> list[str]:
        out = self._closed
        if out:
            self._closed = []
        return out


@dataclass(frozen=True)
class LimitCap:
    """The permit of one declared limit (named by its refusal reason, e.g. ``host_cap``). A
    limit bounded by a pool setting reads the view's ``limits``; one bounded by each tenant's
    ``max_devices`` reads the tenants' shares (``tenants``: each one's cap and held devices,
    which fair share reads too)."""

    limit: Limit
    name: str = field(init=False)
    needs: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", self.limit.reason)
        object.__setattr__(
            self, "needs", frozenset({"tenants" if self.limit.per_tenant else "limits"})
        )

    def start(self, view: View) -> LimitState | None:
        """None when the limit has no bound set in this view: every pair is allowed."""
        if self.limit.per_tenant:
            tenants = view.tenants or {}
            load: LimitLoad | None = LimitLoad(
                {n: t.held for n, t in tenants.items()},
                0,
                {n: t.max_devices for n, t in tenants.items() if t.max_devices},
            )
        else:
            load = (view.limits or {}).get(self.limit.name)
        if load is None or (load.bound <= 0 and not any(b > 0 for b in load.bounds.values())):
            return None
        return LimitState(self.limit, load, view.devices)


LIMIT_CAPS: tuple[LimitCap, ...] = tuple(LimitCap(lim) for lim in LIMITS)
"""A permit per declared limit, in their order."""
