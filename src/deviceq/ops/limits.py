"""``deviceq limit list``: every declared limit (`deviceq.core.limits`) with its bound as set now
and the highest counts it holds (read from its count hash: one ``HGETALL`` a limit, bounded by
the live leases)."""

from __future__ import annotations

from typing import Any

from ..core.connection import PoolConnection
from ..core.limits import LIMITS, setting_bound
from ..core.tenants import parse_tenant
from ..scheduler.limit_load import read_counts

TOP = 5
"""The highest counts shown per limit."""


def limit_summary(admin: PoolConnection, top: int = TOP) -> list[dict[str, Any]]:
    """One row per declared limit, in their order: ``name``, ``scope`` (the lease fields it
    counts by), ``setting`` (the pool setting of its bound; None: each tenant's
    ``max_devices``), ``bound`` (the setting's value, 0 = none; None per tenant), ``counter``
    (its count hash), ``summary``, ``held`` (the leases it counts now, in all) and ``highest``
    (up to ``top`` counts, largest first: ``{key: {scope: value}, held, bound}``)."""
    r, keys = admin.redis, admin.keys
    settings = [lim.setting for lim in LIMITS if lim.setting]
    raw = r.hmget(keys.config, settings) if settings else []
    bound_of = {s: setting_bound(v) for s, v in zip(settings, raw, strict=True)}
    caps: dict[str, int] = {}
    if any(lim.per_tenant for lim in LIMITS):
        specs: dict[str, str] = r.hgetall(keys.tenants)  # type: ignore[assignment]
        caps = {
            n if isinstance(n, str) else n.decode(): parse_tenant(s)[1] for n, s in specs.items()
        }
    rows = []
    for lim in LIMITS:
        counts = read_counts(r, keys, lim)
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
        bound = None if lim.setting is None else bound_of[lim.setting]
        rows.append(
            {
                "name": lim.name,
                "scope": list(lim.scope),
                "setting": lim.setting,
                "bound": bound,
                "counter": lim.counter,
                "summary": lim.summary,
                "held": sum(counts.values()),
                "highest": [
                    {
                        "key": lim.values(key),
                        "held": n,
                        "bound": lim.bound(bound_of, caps, key),
                    }
                    for key, n in ranked
                ],
            }
        )
    return rows
