"""The leases each host's devices hold now (``host_held``, kept by the Lua scripts: assign and
gang_assign count up, every end of a lease counts down), for the placement view's
``host_tasks`` and the ``max_tasks_per_host`` cap (`deviceq.placement.builtin.host_cap`)."""

from __future__ import annotations

from collections.abc import Iterable

from redis import Redis

from ..core.keys import Keys


def read_host_tasks(redis: Redis, keys: Keys, host_ids: Iterable[str]) -> dict[str, int]:
    """host_id -> leases (assigned or running) on its devices, for ``host_ids`` (one ``HMGET``
    of ``host_held``; a host holding none, or a value that is not a count, maps to 0).
    Replies may be decoded or bytes."""
    ids = sorted(set(host_ids))
    if not ids:
        return {}
    raw: list[str | bytes | None] = redis.hmget(keys.host_held, ids)
    out: dict[str, int] = {}
    for host, v in zip(ids, raw, strict=True):
        try:
            n = int(v) if v is not None else 0
        except ValueError:
            n = 0
        out[host] = max(n, 0)
    return out
