"""Tenants: who a task is for (``submit --tenant``), and the pool's policy for each.

``dq:{POOL}:tenants`` (hash) maps a tenant to ``WEIGHT:MAX_DEVICES``: its weight under the
``fair_share`` strategy (1..1000; a tenant not in the hash weighs 1) and the most devices its
tasks may hold at once (0 = no cap; ``lua/assign.lua`` enforces it, refusing ``tenant_cap``).
``dq:{POOL}:tenant_held`` (hash) counts the devices each tenant's tasks hold (leases, assigned
or running): ``assign.lua`` adds one, every end of a lease (``drop_lease`` in
``lua/lib/leases.lua``) takes one off."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import redis

from .errors import InvalidInput
from .keys import Keys
from .validation import validate_id

MAX_WEIGHT = 1000
MAX_DEVICES = 1_000_000


def format_tenant(weight: int, max_devices: int) -> str:
    return f"{weight}:{max_devices}"


def parse_tenant(spec: str | bytes | None) -> tuple[int, int]:
    """(weight, max_devices) of a stored spec; (1, 0) when missing or malformed (the
    scripts read it the same way)."""
    if isinstance(spec, bytes):
        spec = spec.decode(errors="replace")
    w, _, c = (spec or "").partition(":")
    if not (w.isdigit() and c.isdigit()):
        return 1, 0
    return max(1, min(MAX_WEIGHT, int(w))), min(MAX_DEVICES, int(c))


@dataclass(frozen=True)
class TenantInfo:
    """A tenant's policy and the devices its tasks hold now."""

    tenant: str
    weight: int
    max_devices: int
    held: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def set_tenant(r: redis.Redis, keys: Keys, tenant: str, weight: int, max_devices: int) -> str:
    """Validate and store a tenant's policy; returns the stored spec. Raises InvalidInput
    (nothing written) for a bad tenant id, weight or cap."""
    validate_id(tenant, "tenant")
    for name, v, lo, hi in (
        ("weight", weight, 1, MAX_WEIGHT),
        ("max_devices", max_devices, 0, MAX_DEVICES),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise InvalidInput(f"{name} must be an integer {lo}-{hi}, got {v!r}")
    spec = format_tenant(weight, max_devices)
    r.hset(keys.tenants, tenant, spec)
    return spec


def remove_tenant(r: redis.Redis, keys: Keys, tenant: str) -> bool:
    """Forget a tenant's policy (its tasks then weigh 1, uncapped). True if it was set."""
    validate_id(tenant, "tenant")
    return bool(r.hdel(keys.tenants, tenant))


def tenant_infos(r: redis.Redis, keys: Keys) -> list[TenantInfo]:
    """Every tenant with a policy or holding devices, by name (two hash reads: bounded by
    the number of tenants, not of tasks)."""
    pipe = r.pipeline(transaction=False)
    pipe.hgetall(keys.tenants)
    pipe.hgetall(keys.tenant_held)
    specs, held = pipe.execute()
    out = []
    for name in sorted({_s(x) for x in specs} | {_s(x) for x in held}):
        spec = specs.get(name, specs.get(name.encode())) if specs else None
        weight, cap = parse_tenant(spec)
        h = held.get(name, held.get(name.encode())) if held else None
        out.append(TenantInfo(name, weight, cap, int(h or 0)))
    return out


def _s(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v
