"""Placing multi-device (gang) tasks: every role of a task gets an idle matching device of its
own in the same pass, committed all at once by ``lua/gang_assign.lua``, or none does.

The gangs are planned before the single-device tasks of the pass, from the idle devices left
after hosts' health, with the scheduler's placement profile (`placement.gang`): the
profile orders the gangs (priority, aging, fair share as it orders single tasks), and its
filters and scores choose each role's device (anti-affinity per role, faulty devices last,
least recently used where the profile says so), its permits judge the gang's devices together
(a tenant's cap counts them all). A gang that cannot be placed takes nothing, so it never
blocks the tasks behind it. So that it cannot starve either (single tasks taking each device
the moment it frees), a gang that waited ``gang_reserve_after`` seconds *keeps* the idle
devices picked for its roles out of other tasks' reach until the rest frees up, for at most
``gang_hold_seconds``; then it lets them go for another ``gang_reserve_after`` before it may
keep any again (`placement.builtin.ReserveThenHold`). What a gang keeps is written to
the ``gang_holds`` hash (``explain`` shows it). The wait is counted from when this scheduler
first saw the task queued (a new leader starts counting afresh: it never keeps devices earlier
than the setting says).

Reads per pass, bounded by the waiting gangs the snapshot listed (at most ``GANG_SCAN``): one
round trip with each gang's row (priority, seq, submitted_at, tenant,
attempt, updated_at; its roles only the first time); a second one only when needed: the
weight, cap and held devices of the gangs' tenants (when a gang has one), and the
anti-affinity records of the parts (``GANG.ROLE``: the device and host a role lost an attempt
on) of gangs that ran before, read again only after their row changed; the declared limits'
counts when a limit is set (`limit_load.read_limits`). The pool settings (aging, the limits'
bounds) come with the pass's base: the snapshot reader reads those the profile's inputs name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from ..core.attributes import decode_hash, parse_prefer
from ..core.keys import Keys
from ..core.models import decode_roles
from ..core.tenants import parse_tenant
from ..core.where import parse_all
from .inputs import DAY_MS, _at
from .limit_load import read_limits
from .placement.builtin.gang_hold import HoldState, ReserveThenHold
from .placement.gang import Gang, GangView, Role, place_gangs
from .placement.plugins import GangDecision
from .placement.profiles import PROFILES, Profile
from .placement.view import Avoid
from .strategies import DEFAULT_STRATEGY, IdleDevice, TenantShare

GANG_SCAN = 50
"""Queued multi-device tasks considered per pass, oldest first (bounded work per pass)."""

GANG_FIELDS = ("priority", "seq", "submitted_at", "tenant", "attempt", "updated_at")


def gang_profile(profile: Profile | str | None) -> Profile:
    """The profile gangs are placed with: ``profile`` itself, the built-in profile of a
    strategy name, or (None, or a strategy without a profile) the default strategy's."""
    if isinstance(profile, Profile):
        return profile
    return PROFILES.get(profile or DEFAULT_STRATEGY) or PROFILES[DEFAULT_STRATEGY]


@dataclass
class GangPlan:
    """One pass's decisions: the gangs to commit (task id, one device per role in role
    order), in the profile's order, and the devices kept for gangs still waiting (not
    offered to other tasks)."""

    place: list[tuple[str, list[str]]] = field(default_factory=list)
    kept: dict[str, tuple[int, list[str]]] = field(default_factory=dict)  # id -> (until, devs)

    @property
    def used(self) -> set[str]:
        out = {d for _, devs in self.place for d in devs}
        for _, devs in self.kept.values():
            out.update(devs)
        return out


class GangPlanner:
    """Plans the multi-device tasks of one pool with a placement profile (``profile``: a
    `Profile`, a strategy name, or None for the default strategy's; see `gang_profile`).
    State between passes: role constraints by task id, since when each has waited, its
    keeping of devices, and its parts' anti-affinity records."""

    def __init__(self, r: redis.Redis, keys: Keys, profile: Profile | str | None = None) -> None:
        self.redis = r
        self.keys = keys
        self.profile = gang_profile(profile)
        self._roles: dict[str, tuple[Role, ...]] = {}
        self._since: dict[str, int] = {}  # ms: when this scheduler first saw it queued
        self._holds: dict[str, HoldState] = {}
        # id -> (its row's attempt and updated_at when read, its parts' records by part id)
        self._avoid: dict[str, tuple[tuple[Any, Any], dict[str, Avoid]]] = {}
        self._written: dict[str, str] = {}  # gang_holds as this scheduler last wrote it
        self._reset = True  # rewrite gang_holds whole (another scheduler may have written it)

    @property
    def kept(self) -> bool:
        """Whether this scheduler keeps devices for a gang (or must clear what it wrote)."""
        return bool(self._written) or self._reset

    def forget_all(self) -> None:
        """A new leadership: waits are counted afresh, holds written again."""
        self._since.clear()
        self._holds.clear()
        self._written.clear()
        self._reset = True

    def roles(self, ids: Sequence[str]) -> dict[str, tuple[Role, ...]]:
        """The role constraints of ``ids`` (read once per task: roles never change)."""
        missing = [t for t in ids if t not in self._roles]
        if missing:
            pipe = self.redis.pipeline(transaction=False)
            for t in missing:
                pipe.hmget(self.keys.task(t), "roles", "role_where")
            for t, (spec, where) in zip(missing, pipe.execute(), strict=True):
                self._roles[t] = _roles(spec, where)
        self._trim_roles(ids)
        return {t: self._roles[t] for t in ids}

    def plan(
        self,
        waiting: Sequence[str],
        devices: Sequence[IdleDevice],
        now: int,
        reserve_after_ms: int,
        hold_ms: int,
        settings: Mapping[str, Any] | None = None,
        aging_ms: int = 0,
    ) -> GangPlan:
        """Place the waiting gangs on ``devices`` with the profile: the gangs whose every role
        got a device, and the partial picks kept by gangs past their reserve time. ``settings``
        and ``aging_ms``: the pool settings and aging as the pass read them with its base (the
        snapshot reader reads what the profile's inputs name: `needs`)."""
        out = GangPlan()
        present = set(waiting)
        for state in (self._since, self._holds, self._avoid):
            for t in [t for t in state if t not in present]:
                del state[t]  # placed, cancelled or gone
        if not waiting:
            return out
        gangs, tenants, avoid = self.read(waiting, now)
        permit = ReserveThenHold(reserve_after_ms, hold_ms, self._holds)
        limits = read_limits(
            self.redis, self.keys, settings or {}, {d.host_id for d in devices},
            {g.tenant for g in gangs if g.tenant},
        )  # fmt: skip
        prefer = parse_prefer((settings or {}).get("prefer"))
        attributes, runs = self.attributes(gangs, devices, prefer, now)
        gv = GangView.build(
            gangs, devices, now, aging_ms=aging_ms, tenants=tenants, avoid=avoid, limits=limits,
            attributes=attributes, prefer=prefer, runs=runs,
        )  # fmt: skip
        for p in place_gangs(self.profile, gv, permit):
            if p.decision is GangDecision.ALLOW:
                out.place.append((p.gang_id, p.devices))
            elif p.decision is GangDecision.WAIT:
                out.kept[p.gang_id] = (permit.until(p.gang_id), p.devices)
        return out

    def attributes(
        self, gangs: Sequence[Gang], devices: Sequence[IdleDevice], prefer: tuple[str, str],
        now: int,
    ) -> tuple[dict[str, Any], dict[str, int] | None]:  # fmt: skip
        """The attributes of ``devices`` when a role has --where clauses or the pool prefers
        by an attribute, and with ``prefer`` least_used each device's runs in the last 24 h
        (one pipelined round trip over the idle devices the pass read; none when nothing
        needs it)."""
        ids = [d.device_id for d in devices]
        where = any(r.where for g in gangs for r in g.roles)
        attrs: dict[str, Any] = {}
        runs: dict[str, int] | None = None
        if not ids or not gangs:
            return attrs, runs
        if where or prefer[0] in ("max", "min"):
            pipe = self.redis.pipeline(transaction=False)
            for d in ids:
                pipe.hgetall(self.keys.device_attrs(d))
            attrs = {d: decode_hash(h) for d, h in zip(ids, pipe.execute(), strict=True)}
        if prefer[0] == "least_used":
            pipe = self.redis.pipeline(transaction=False)
            for d in ids:
                pipe.lrange(self.keys.device_history(d), 0, -1)
            since = now - DAY_MS
            runs = {d: sum(1 for e in rows if _at(e) >= since)
                    for d, rows in zip(ids, pipe.execute(), strict=True)}  # fmt: skip
        return attrs, runs

    def read(
        self, waiting: Sequence[str], now: int
    ) -> tuple[list[Gang], dict[str, TenantShare], dict[str, Avoid]]:
        """The waiting gangs (those still queued), their tenants and their parts' anti-affinity
        records (by part id): see the module doc for the reads."""
        k = self.keys
        pipe = self.redis.pipeline(transaction=False)
        for gid in waiting:
            if gid in self._roles:
                pipe.hmget(k.task(gid), *GANG_FIELDS)
            else:
                pipe.hmget(k.task(gid), *GANG_FIELDS, "roles", "role_where")
        rows = pipe.execute()
        gangs: list[Gang] = []
        stamps: dict[str, tuple[Any, Any]] = {}
        for gid, row in zip(waiting, rows, strict=True):
            prio, seq, sub, tenant, attempt, updated = row[:6]
            if len(row) > 6:
                self._roles[gid] = _roles(row[6], row[7])
            if seq is None:  # gone since the snapshot listed it
                continue
            since = self._since.setdefault(gid, now)
            gangs.append(
                Gang(
                    gid,
                    _int(seq),
                    self._roles[gid],
                    _int(prio),
                    tenant or None,
                    _int(sub),
                    now - since,
                )  # fmt: skip
            )
            if _int(attempt) > 0:
                stamps[gid] = (attempt, updated)
        self._trim_roles(waiting)
        names = sorted({g.tenant for g in gangs if g.tenant})
        stale = [g for g in gangs if g.gang_id in stamps and
                 self._avoid.get(g.gang_id, (None,))[0] != stamps[g.gang_id]]  # fmt: skip
        tenants: dict[str, TenantShare] = {}
        if names or stale:
            pipe = self.redis.pipeline(transaction=False)
            if names:
                pipe.hmget(k.tenants, names)
                pipe.hmget(k.tenant_held, names)
            for g in stale:
                for role in g.roles:
                    pipe.hmget(k.task(g.part_id(role)), "avoid_devices", "avoid_hosts")
            res = iter(pipe.execute())
            if names:
                specs, held = next(res), next(res)
                for name, spec, h in zip(names, specs, held, strict=True):
                    weight, cap = parse_tenant(spec)
                    tenants[name] = TenantShare(weight, cap, _int(h))
            for g in stale:
                recs = {}
                for role in g.roles:
                    devs, hosts = next(res)
                    if devs or hosts:
                        recs[g.part_id(role)] = Avoid(_csv(devs), _csv(hosts))
                self._avoid[g.gang_id] = (stamps[g.gang_id], recs)
        avoid = {p: a for gid, (_, recs) in self._avoid.items() for p, a in recs.items()}
        return gangs, tenants, avoid

    def _trim_roles(self, ids: Sequence[str]) -> None:
        if len(self._roles) > 4 * GANG_SCAN + 1000:
            keep = set(ids)
            self._roles = {t: v for t, v in self._roles.items() if t in keep}

    def publish(self, kept: dict[str, tuple[int, list[str]]]) -> None:
        """Write what changed in ``gang_holds`` (one round trip, only on a change)."""
        want = {gid: f"{until}|{','.join(devs)}" for gid, (until, devs) in kept.items()}
        if want == self._written and not self._reset:
            return
        pipe = self.redis.pipeline(transaction=False)
        if self._reset:
            pipe.delete(self.keys.gang_holds)
            self._written, self._reset = {}, False
        gone = [gid for gid in self._written if gid not in want]
        if gone:
            pipe.hdel(self.keys.gang_holds, *gone)
        changed = [x for g, v in want.items() if self._written.get(g) != v for x in (g, v)]
        if changed:
            pipe.hset(self.keys.gang_holds, items=changed)
        pipe.execute()
        self._written = want


def _roles(spec: Any, where: Any = None) -> tuple[Role, ...]:
    roles = decode_roles(spec, None, where) or {}
    return tuple(Role(n, r.driver_type, frozenset(r.tags), parse_all(r.where))
                 for n, r in roles.items())  # fmt: skip


def _int(raw: Any) -> int:
    try:
        return int(float(raw or 0))
    except (TypeError, ValueError):
        return 0


def _csv(raw: Any) -> frozenset[str]:
    return frozenset(x for x in str(raw or "").split(",") if x)
