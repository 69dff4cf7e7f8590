"""The declared limits' loads as the scripts see them (`deviceq.core.limits`): each limit's bound
(its pool setting, read as lua/lib/limits.lua reads it, or each tenant's ``max_devices``) and
the leases it counts now in its count hash (kept by the Lua scripts: assign and gang_assign
count up, every end of a lease counts down), for the placement view's ``limits``
(`deviceq.scheduler.placement.view.LimitLoad`; read by ``inputs`` for single tasks and ``gangs`` for
multi-device ones), ``deviceq explain`` and ``deviceq limit list``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from redis import Redis

from ..core.keys import Keys
from ..core.lane import batch
from ..core.limits import LIMITS, Limit, lease_fields, setting_bound
from ..core.tenants import parse_tenant
from .placement.view import LimitLoad

WIDE = 2000
"""A limit whose pass could touch more count fields than this is read whole (``HGETALL``: its
hash holds a field per combination holding a lease, so at most one per live lease)."""


def _int(v: object) -> int:
    try:
        n = int(v) if v is not None else 0  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 0
    return max(n, 0)


def read_limits(
    redis: Redis,
    keys: Keys,
    settings: Mapping[str, object],
    hosts: Iterable[str],
    tenants: Iterable[str],
    *,
    per_tenant: bool = False,
) -> dict[str, LimitLoad]:
    """Limit name -> its load, for a pass placing on ``hosts`` for tasks of ``tenants``, given
    the raw pool ``settings`` (as read with the pass: the limits' settings). A limit with no
    bound set (for them) is left out: nothing of it is read. ``per_tenant``: the limits
    bounded by each tenant's ``max_devices`` too (the placement reads those from the tenants'
    shares instead: `deviceq.scheduler.placement.builtin.limit_caps`). At most two round trips: the
    tenants' caps (when read, a limit is per tenant and there are tenants), then the counts."""
    hosts, names = sorted(set(hosts)), sorted({t for t in tenants if t})
    caps: dict[str, int] = {}
    limits = [lim for lim in LIMITS if per_tenant or not lim.per_tenant]
    if names and any(lim.per_tenant for lim in limits):
        raw = redis.hmget(keys.tenants, names)
        caps = {n: parse_tenant(s)[1] for n, s in zip(names, raw, strict=True)}
    wanted: list[tuple[Limit, int, dict[str, int], list[str] | None]] = []
    fields: list[str] | None
    for lim in limits:
        bound = 0 if lim.per_tenant else setting_bound(settings.get(lim.setting or ""))
        bounds = {n: c for n, c in caps.items() if c > 0} if lim.per_tenant else {}
        if bound <= 0 and not bounds:
            continue
        fields = lease_fields(lim, hosts, names)
        if lim.per_tenant:
            fields = [f for f in fields if lim.bound(settings, caps, f) > 0]
        wanted.append((lim, bound, bounds, fields if len(fields) <= WIDE else None))
    if not wanted:
        return {}
    pipe = batch(redis)
    for lim, _, _, fields in wanted:
        if fields is None:
            pipe.hgetall(keys.counter(lim.counter))
        elif fields:
            pipe.hmget(keys.counter(lim.counter), fields)
    replies = iter(pipe.execute())
    out: dict[str, LimitLoad] = {}
    for lim, bound, bounds, fields in wanted:
        if fields is None:
            raw_all: Mapping[str, object] = next(replies)
            held = {_str(f): _int(v) for f, v in raw_all.items()}
        elif fields:
            held = {f: _int(v) for f, v in zip(fields, next(replies), strict=True)}
        else:
            held = {}
        out[lim.name] = LimitLoad({f: n for f, n in held.items() if n}, bound, bounds)
    return out


def _str(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def read_counts(redis: Redis, keys: Keys, lim: Limit) -> dict[str, int]:
    """Every count of ``lim`` now: field -> leases (``HGETALL`` of its count hash: one field
    per combination of scope values holding a lease, so bounded by the live leases)."""
    raw: Mapping[object, object] = redis.hgetall(keys.counter(lim.counter))  # type: ignore[assignment]
    return {_str(f): n for f, v in raw.items() if (n := _int(v))}


def device_room(limits: Mapping[str, LimitLoad], host: str) -> int | None:
    """The leases more the devices of ``host`` may take whatever their tasks, by the limits
    counted by device fields alone (``host``); None when none of them bounds it."""
    room: int | None = None
    for lim in LIMITS:
        load = limits.get(lim.name)
        if load is None or "tenant" in lim.scope:
            continue
        key = lim.field(host=host)
        cap = load.cap(key) if key else 0
        if cap > 0:
            left = cap - load.held.get(key or "", 0)
            room = left if room is None else min(room, left)
    return room
