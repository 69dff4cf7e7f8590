"""``explain`` and the pool's ``max_tasks_per_host``: which of a queued task's idle matching
devices are on hosts whose devices hold that many leases already (the placement leaves them
for later and the commit refuses them: ``host_cap``), so it waits for a lease there to end."""

from __future__ import annotations

from collections.abc import Sequence

from ...core.connection import PoolConnection
from ...core.models import PooledDevice
from ...scheduler.host_load import host_cap_setting, read_host_tasks
from .model import Reason

SHOWN_HOSTS = 5  # full hosts named in the message (all of them are in the detail)


def host_cap_reason(admin: PoolConnection, idle: Sequence[PooledDevice]) -> Reason | None:
    """A ``host_cap`` reason when some of the ``idle`` matching devices are on full hosts
    (two reads: the setting, then ``host_held`` for their hosts); None when the setting is
    0 or no such host is full. Its count is how many of those devices are held back."""
    raw = admin.redis.hget(admin.keys.config, "max_tasks_per_host")
    cap = host_cap_setting(raw)
    if cap <= 0 or not idle:
        return None
    held = read_host_tasks(admin.redis, admin.keys, {d.host_id or "" for d in idle})
    full = [d for d in idle if held.get(d.host_id or "", 0) >= cap]
    if not full:
        return None
    hosts = sorted({d.host_id or "" for d in full})
    named = ", ".join(hosts[:SHOWN_HOSTS]) + (", ..." if len(hosts) > SHOWN_HOSTS else "")
    return Reason(
        "host_cap",
        f"{len(full)} of {len(idle)} idle matching device(s) are on host(s) whose devices hold "
        f"max_tasks_per_host ({cap}) leases already ({named}): they wait for one to end",
        len(full),
        {"max_tasks_per_host": cap, "hosts": {h: held[h] for h in hosts}},
    )
