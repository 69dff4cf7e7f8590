"""The leases each host's devices hold now (``host_held``, kept by the Lua scripts: assign and
gang_assign count up, every end of a lease counts down), for the placement view's
``host_tasks``, and the pool's ``max_tasks_per_host`` cap as the scripts read it
(`placement.builtin.host_cap`; read by ``inputs`` for single tasks and ``gangs`` for
multi-device ones)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from redis import Redis

from ..core.config import PoolConfig
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


_LO, _HI = (int(b) for b in PoolConfig.bounds("max_tasks_per_host"))


def host_cap_setting(raw: str | bytes | None) -> int:
    """The pool's ``max_tasks_per_host`` from its raw config value as the Lua scripts read it:
    missing or not a number is the default (0, no limit), a fraction is floored, a value out
    of bounds is clamped."""
    try:
        v = float(raw) if raw is not None else 0.0
    except ValueError:
        return 0
    if math.isnan(v):
        return 0
    return _LO if v <= _LO else _HI if v >= _HI else math.floor(v)
