"""``explain`` and the declared limits bounded by a pool setting (`deviceq.core.limits`): which of
a queued task's idle matching devices are on hosts where a limit is reached for it already
(``max_tasks_per_host``: the host's devices hold that many leases). The placement leaves them
for later and the commit refuses them (``NAME_cap``), so the task waits for a lease there to
end. (A tenant's own cap, ``max_devices``, concerns the task whatever the device:
`single._tenant` explains it.)"""

from __future__ import annotations

from collections.abc import Sequence

from ...core.connection import PoolConnection
from ...core.limits import LIMITS
from ...core.models import PooledDevice
from ...scheduler.limit_load import read_limits
from .model import Reason

SHOWN_HOSTS = 5  # full hosts named in the message (all of them are in the detail)


def limit_reasons(
    admin: PoolConnection, tenant: str | None, idle: Sequence[PooledDevice]
) -> list[Reason]:
    """A ``NAME_cap`` reason for each setting-bound limit that holds back some of the ``idle``
    matching devices of a task of ``tenant`` (two reads: the settings, then the counts);
    none when no such limit is set or reached. Each one's count is how many of those devices
    it holds back."""
    limits = [lim for lim in LIMITS if lim.setting and "host" in lim.scope]
    if not idle or not limits:
        return []
    raw = admin.redis.hmget(admin.keys.config, [lim.setting or "" for lim in limits])
    settings = {lim.setting or "": v for lim, v in zip(limits, raw, strict=True)}
    hosts = {d.host_id or "" for d in idle}
    loads = read_limits(admin.redis, admin.keys, settings, hosts, [tenant or ""])
    out = []
    for lim in limits:
        load = loads.get(lim.name)
        if load is None:
            continue
        held: dict[str, int] = {}
        for h in hosts:
            key = lim.field(host=h, tenant=tenant or "")
            if key is not None and load.cap(key) > 0 and load.held.get(key, 0) >= load.cap(key):
                held[h] = load.held.get(key, 0)
        full = [d for d in idle if (d.host_id or "") in held]
        if not full:
            continue
        named_hosts = sorted(held)
        named = ", ".join(named_hosts[:SHOWN_HOSTS])
        named += ", ..." if len(named_hosts) > SHOWN_HOSTS else ""
        whose = "the task's tenant's tasks hold" if "tenant" in lim.scope else "whose devices hold"
        out.append(
            Reason(
                lim.reason,
                f"{len(full)} of {len(idle)} idle matching device(s) are on host(s) where "
                f"{whose} {lim.setting} ({load.bound}) leases already ({named}): they wait "
                "for one to end",
                len(full),
                {lim.setting or "": load.bound, "hosts": {h: held[h] for h in named_hosts}},
            )
        )
    return out
