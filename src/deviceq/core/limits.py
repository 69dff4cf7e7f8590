"""The pool's hard limits on leases held at once, each one declaration.

A `Limit` names what it counts (its ``scope``: the fields of a lease that key its count), where
its bound comes from (a pool setting, or each tenant's own ``max_devices``) and the hash that
counts the leases held now. Everything else is built from `LIMITS`:

- the Lua scripts check every limit when a lease is made (``limits_refusal`` in
  ``lua/lib/limits.lua``: assign.lua and gang_assign.lua) and count it up, and count it down
  where a lease ends (``limits_count`` in ``drop_lease``), from the generated include
  ``gen/limits`` (`lua_include`);
- the placement permit (`deviceq.scheduler.placement.builtin.limit_caps`), the scheduler's reader of
  counts (`deviceq.scheduler.limit_load`), ``deviceq verify``, ``deviceq explain``, the metrics,
  the ACL key lists and ``deviceq limit list`` iterate `LIMITS`.

A lease is described by its scope values: ``host`` (the host of its device) and ``tenant`` (its
task's tenant, '' for none). It counts under a limit when every field of the limit's scope is
set; the count's hash field is those values joined with ``|`` (ids never hold one). A bound of
0 means no limit; the counts are kept whatever the bound, so a bound set later holds at once.

Adding a limit is one entry here (its setting in `deviceq.core.config.PoolConfig`), plus its
tests and docs."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

Scope = Literal["host", "tenant"]
SCOPES: tuple[Scope, ...] = ("host", "tenant")
"""The fields of a lease a limit may count by (the Lua scripts describe every lease by them)."""


@dataclass(frozen=True)
class Limit:
    """One hard limit on leases held at once."""

    name: str
    """Its name (``deviceq limit list``); a commit refused by it says ``NAME_cap``."""
    scope: tuple[Scope, ...]
    """The lease fields its count is keyed by (each lease counts once per distinct key)."""
    setting: str | None
    """The pool setting holding its bound (0 = none); None: each tenant's own ``max_devices``
    (``deviceq tenant set``), for a limit scoped by tenant."""
    counter: str
    """The hash ``dq:{POOL}:COUNTER`` counting the leases held now, by scope values."""
    summary: str
    """One line: what it limits."""

    def __post_init__(self) -> None:
        if not 1 <= len(self.scope) <= 2 or len(set(self.scope)) != len(self.scope):
            raise ValueError(f"limit {self.name}: a scope is one or two distinct lease fields")
        if not set(self.scope) <= set(SCOPES):
            raise ValueError(f"limit {self.name}: scope fields are {', '.join(SCOPES)}")
        if self.setting is None and self.scope != ("tenant",):
            raise ValueError(f"limit {self.name}: only a limit by tenant may be per tenant")

    @property
    def reason(self) -> str:
        """The refusal reason of a commit that would break it (``assign.lua``'s
        ``err:REASON``; gang_assign.lua adds ``@ROLE``)."""
        return f"{self.name}_cap"

    @property
    def per_tenant(self) -> bool:
        """Whether its bound is each tenant's own (not a pool setting)."""
        return self.setting is None

    def field(self, *, host: str | None = None, tenant: str | None = None) -> str | None:
        """The count's hash field of a lease with these scope values; None when the lease is
        not counted (a scope value unset)."""
        values = {"host": host, "tenant": tenant}
        parts = [values[s] for s in self.scope]
        if not all(parts):
            return None
        return "|".join(p for p in parts if p)

    def values(self, field: str) -> dict[Scope, str]:
        """The scope values of a count's hash field (`field`'s inverse)."""
        return dict(zip(self.scope, field.split("|"), strict=False))

    def bound(
        self, settings: Mapping[str, object], tenant_caps: Mapping[str, int], field: str
    ) -> int:
        """The bound on the count of ``field``: the setting (as the scripts read it: missing
        or not a number is 0, a fraction floored) or, per tenant, the tenant's cap."""
        if self.setting is None:
            return tenant_caps.get(self.values(field).get("tenant", ""), 0)
        return setting_bound(settings.get(self.setting))


LIMITS: tuple[Limit, ...] = (
    Limit(
        "tenant",
        ("tenant",),
        None,
        "tenant_held",
        "devices one tenant's tasks hold at once (each tenant's max_devices)",
    ),
    Limit(
        "host",
        ("host",),
        "max_tasks_per_host",
        "host_held",
        "leases (assigned or running) on one host's devices at once",
    ),
    Limit(
        "tenant_host",
        ("tenant", "host"),
        "max_tasks_per_tenant_per_host",
        "tenant_host_held",
        "leases one tenant's tasks hold on one host's devices at once",
    ),
)
"""Every declared limit, in the order a commit checks them (the first broken one is named)."""

BY_NAME: Mapping[str, Limit] = {lim.name: lim for lim in LIMITS}
COUNTERS: tuple[str, ...] = tuple(lim.counter for lim in LIMITS)
"""The count hashes (key suffixes) of every limit."""
SETTINGS: tuple[str, ...] = tuple(lim.setting for lim in LIMITS if lim.setting)
"""The pool settings holding limits' bounds."""
REASONS: tuple[str, ...] = tuple(lim.reason for lim in LIMITS)


def setting_bound(raw: object) -> int:
    """A limit setting's raw stored value as the scripts read it: missing or not a number is
    0 (no limit), a fraction is floored, a negative value is 0."""
    if isinstance(raw, bytes):
        raw = raw.decode(errors="replace")
    try:
        v = float(raw) if raw is not None else 0.0  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0
    if math.isnan(v) or v <= 0:
        return 0
    return math.floor(min(v, 1e9))


def lease_fields(lim: Limit, hosts: Iterable[str], tenants: Iterable[str]) -> list[str]:
    """The count fields of ``lim`` for every combination of these scope values (the fields a
    pass placing on ``hosts`` for tasks of ``tenants`` may touch), sorted."""
    hs, ts = sorted(set(hosts)), sorted({t for t in tenants if t})
    out: set[str] = set()
    for h in hs or [""]:
        for t in ts or [""]:
            f = lim.field(host=h, tenant=t)
            if f:
                out.add(f)
    return sorted(out)


def _lua_str(s: str) -> str:
    if not s.replace("_", "").isalnum() or not s.isascii():
        raise ValueError(f"{s!r} is no plain Lua word")
    return f"'{s}'"


def lua_include() -> str:
    """The text of the generated include ``gen/limits``: ``LIMITS``, a list of
    ``{name, reason, counter, scope = {...}, setting}`` (setting nil: per tenant)."""
    rows = []
    for lim in LIMITS:
        scope = ", ".join(_lua_str(s) for s in lim.scope)
        setting = f", setting = {_lua_str(lim.setting)}" if lim.setting else ""
        rows.append(
            f"  {{name = {_lua_str(lim.name)}, reason = {_lua_str(lim.reason)}, counter = "
            f"{_lua_str(lim.counter)}, scope = {{{scope}}}{setting}}},\n"
        )
    return "-- gen/limits (deviceq.core.limits)\nlocal LIMITS = {\n" + "".join(rows) + "}\n"
