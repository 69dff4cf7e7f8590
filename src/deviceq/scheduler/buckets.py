"""The queue's buckets as an operator sees them (depth, head task, its submit time): what
``deviceq status``, the metrics gauges and ``explain``'s position read. Bounded by
``max_queues`` buckets; the scheduler's own bounded read is `deviceq.scheduler.snapshot`."""

from __future__ import annotations

from ..core.connection import PoolConnection
from .strategies import Bucket


def buckets(admin: PoolConnection, max_queues: int = 1000) -> list[Bucket]:
    """Non-empty queue buckets, oldest head first (at most ``max_queues``)."""
    r, k = admin.redis, admin.keys
    sigs: list[str] = r.zrange(k.queues, 0, max_queues - 1)  # type: ignore[assignment]
    pipe = r.pipeline(transaction=False)
    for sig in sigs:
        pipe.hgetall(k.sig(sig))
        pipe.zcard(k.queue(sig))
        pipe.zrange(k.queue(sig), 0, 0)
    res = pipe.execute()
    heads = [res[3 * i + 2][0] if res[3 * i + 2] else None for i in range(len(sigs))]
    pipe = r.pipeline(transaction=False)
    for head in heads:
        if head:
            pipe.hget(k.task(head), "submitted_at")
        else:
            pipe.echo("")
    submitted = pipe.execute()
    out = []
    for i, sig in enumerate(sigs):
        info = res[3 * i] or {}
        out.append(
            Bucket(
                sig=sig,
                driver_type=info.get("driver_type") or None,
                tags=frozenset(t for t in (info.get("tags") or "").split(",") if t),
                priority=int(info.get("priority") or 0),
                tenant=info.get("tenant") or None,
                depth=int(res[3 * i + 1]),
                head_task=heads[i],
                head_submitted_at=int(submitted[i]) if submitted[i] else None,
            )
        )
    return out
