"""A queued task's place among the tasks that compete for its devices, and an estimate of its
wait from how fast those devices have been finishing tasks. Apart from the blockers: this is
a forecast, not a reason."""

from __future__ import annotations

from typing import Any

from ...core.connection import PoolConnection
from ...core.models import PooledDevice, ScheduledTask
from ...scheduler.buckets import buckets
from .devices import classes, serves
from .model import Reason

RATE_EVENTS = 5000  # recent events read to estimate the matching devices' throughput


def position(
    admin: PoolConnection,
    task: ScheduledTask,
    matching: list[PooledDevice],
    now: int,
    counts: dict[str, int],
) -> Reason:
    """The task's place among the queued tasks that compete for its devices (buckets the
    filters accept some matching device for: higher priority ones ahead in full, equal
    priority ones by submission order; aging and tenants' shares are not modelled) and an
    estimate of its wait from how many tasks those devices finished recently (the last
    RATE_EVENTS events). Sets ``counts["competing_ahead"]``."""
    r, k = admin.redis, admin.keys
    seq = task.seq
    mine = classes(matching)
    rivals = [b for b in buckets(admin) if b.priority >= task.priority and serves(b, mine)]
    pipe = r.pipeline(transaction=False)
    for b in rivals:
        if b.priority > task.priority:
            pipe.zcard(k.queue(b.sig))
        else:
            pipe.zcount(k.queue(b.sig), "-inf", f"({seq}")
    pipe.xrevrange(k.events, "+", "-", count=RATE_EVENTS)
    res = pipe.execute()
    ahead = sum(int(n) for n in res[:-1])
    ids = {d.device_id for d in matching}
    ended = [
        int(str(eid).split("-")[0])
        for eid, f in res[-1]
        if f.get("type") in ("done", "failed", "cancelled") and f.get("device") in ids
    ]
    counts["competing_ahead"] = ahead
    detail: dict[str, Any] = {"position": ahead + 1, "rate_per_s": None, "estimated_wait_s": None}
    text = f"position {ahead + 1} among the queued tasks competing for its {len(ids)} device(s)"
    if len(ended) >= 2 and now > min(ended):
        span = (now - min(ended)) / 1000
        rate = len(ended) / span
        eta = (ahead + 1) / rate
        detail.update(rate_per_s=round(rate, 3), estimated_wait_s=round(eta, 1))
        text += (
            f"; those devices finished {len(ended)} task(s) in the last {span:.0f}s "
            f"({rate:.2f}/s): it should start in about {eta:.0f}s"
        )
    else:
        text += "; too few recent runs on those devices to estimate its wait"
    return Reason("position", text, ahead + 1, detail)
