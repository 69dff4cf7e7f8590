"""How the snapshot reader reads each optional view input a placement plugin may need
(`placement.view.INPUTS`): one `Input` per name, in `INPUTS`. The reader reads, for a
pass, only the inputs its strategy needs (`strategies.strategy_needs`: the union of a profile's
plugins' ``needs``), so a plugin that needs a new kind of state adds its reader here (with its
view field in `View`), never an edit to the reader or the pass.

An input's ``read`` returns the `View` fields it fills (usually one, named as the input). It
may name pool settings (``settings``): they are read with the pass's base, in the same round
trip, and handed to it in ``SnapshotReader.settings``. ``per_pass`` inputs depend on the base
only and are read once per pass; the others are read for each view (a pass that reads deeper
makes several), from what the heads carry or a cache."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import redis

from ..core.attributes import decode_hash, parse_prefer
from ..core.keys import Keys
from ..core.lane import batch
from ..core.limits import SETTINGS as LIMIT_SETTINGS
from ..core.limits import setting_bound
from ..core.tenants import parse_tenant
from .device_cache import tagset
from .idle_classes import Base
from .limit_load import read_limits
from .placement.builtin.anti_affinity import DEVICE_BLAMED
from .placement.rows import Bucket, QueuedTask, TenantShare
from .placement.view import Avoid

Read = Callable[["InputReading", Base, list[Bucket]], dict[str, Any]]


@dataclass(frozen=True)
class Input:
    """How one optional view input is read."""

    name: str
    read: Read
    settings: tuple[str, ...] = ()  # pool settings it uses, read with the base
    per_pass: bool = False  # depends on the base only: read once per pass


INPUTS: dict[str, Input] = {}
"""Every readable view input, by name."""


def register_input(
    name: str, *, settings: tuple[str, ...] = (), per_pass: bool = False
) -> Callable[[Read], Read]:
    """Decorator registering ``read`` as the reader of view input ``name``."""

    def deco(read: Read) -> Read:
        INPUTS[name] = Input(name, read, settings, per_pass)
        return read

    return deco


def settings_needed(needs: frozenset[str]) -> tuple[str, ...]:
    """The pool settings the inputs in ``needs`` use (sorted, each once)."""
    return tuple(sorted({s for n in needs if n in INPUTS for s in INPUTS[n].settings}))


@register_input("tenants", per_pass=True)
def read_tenants(r: InputReading, base: Base, buckets: list[Bucket]) -> dict[str, Any]:
    """The weight, cap and held devices of the tenants of the servable buckets (one round
    trip, only when some bucket has a tenant; bounded by the buckets read)."""
    names = sorted({b.tenant for b in base.shells if b.tenant and base.matching.get(b.sig)})
    if not names:
        return {"tenants": {}}
    pipe = batch(r.redis)
    pipe.hmget(r.keys.tenants, names)
    pipe.hmget(r.keys.tenant_held, names)
    specs, held = pipe.execute()
    out = {}
    for name, spec, h in zip(names, specs, held, strict=True):
        weight, cap = parse_tenant(spec)
        out[name] = TenantShare(weight, cap, int(h or 0))
    return {"tenants": out}


ALWAYS_READ = frozenset({"attributes"})
"""The inputs every reader reads whatever its strategy's plugins need (a task's --where is
judged in every strategy); each costs nothing when no bucket uses it."""


DAY_MS = 86_400_000


@register_input("attributes", settings=("prefer",))
def read_attributes(r: InputReading, base: Base, buckets: list[Bucket]) -> dict[str, Any]:
    """The attributes of the devices read, only when a servable bucket has --where clauses or
    the pool prefers by an attribute (``prefer``); with ``prefer`` least_used, each device's
    runs in the last 24 h (its recent attempts, at most 20). One pipelined round trip over the
    devices this pass read (bounded by what it reads; those `idle_classes.where_short` read
    this pass are not read again), none when nothing needs it. Read for each view: a pass that
    reads deeper sees more devices."""
    prefer = parse_prefer(r.settings.get("prefer"))
    where = any(b.where for b in base.shells if base.matching.get(b.sig))
    ids = [d.device_id for d in base.devices]
    out: dict[str, Any] = {"attributes": {}, "prefer": prefer}
    if not ids or (not where and prefer[0] not in ("max", "min", "least_used")):
        return out
    if prefer[0] == "least_used":
        pipe = batch(r.redis)
        for d in ids:
            pipe.execute_command("LRANGE", r.keys.device_history(d), 0, -1)
        since = base.now - DAY_MS
        out["runs"] = {d: sum(1 for e in rows if _at(e) >= since)
                       for d, rows in zip(ids, pipe.execute(), strict=True)}  # fmt: skip
        if not where:
            return out
    out["attributes"] = _attributes_of(r, ids)
    return out


def _attributes_of(r: InputReading, ids: list[str]) -> dict[str, Any]:
    """The attributes of ``ids``: those read this pass already (`where_short`'s) and the rest
    in one pipelined round trip (kept for the pass's next view)."""
    seen: dict[str, Any] = r.__dict__.setdefault("_where_attrs", {})
    new = [d for d in ids if d not in seen]
    if new:
        pipe = batch(r.redis)
        for d in new:
            pipe.hgetall(r.keys.device_attrs(d))
        seen.update(zip(new, (decode_hash(h) for h in pipe.execute()), strict=True))
    return {d: seen[d] for d in ids}


def _at(entry: Any) -> int:
    """The ``at`` (ms) of a device history record (0 when it has none)."""
    try:
        return int(json.loads(entry).get("at") or 0)
    except (ValueError, TypeError, AttributeError):
        return 0


@register_input("submit_times")
def read_submit_times(r: InputReading, base: Base, buckets: list[Bucket]) -> dict[str, Any]:
    """The heads' submission times and the pool's aging, when aging can change the order
    (`aging_applies`); else none (an aging sort then keeps plain priorities)."""
    if not aging_applies(r, buckets):
        return {"submit_times": {}, "aging_ms": 0}
    return {"submit_times": r.submitted.of(r, buckets), "aging_ms": r.aging_ms}


def aging_applies(r: InputReading, buckets: list[Bucket]) -> bool:
    """Whether aging can change this pass's order: it is on, the strategy reads submit
    times, and the buckets have more than one priority (with one, older is higher)."""
    return r.aging_ms > 0 and "submit_times" in r.needs and len({b.priority for b in buckets}) > 1


class SubmitTimes:
    """The submission times (ms) of the heads a reader has seen, kept between passes (the
    heads' own reads note them; `of` reads the rest)."""

    def __init__(self) -> None:
        self.known: dict[str, int] = {}

    def note(self, task_id: str, ms: int) -> None:
        self.known[task_id] = ms

    def of(self, r: InputReading, buckets: list[Bucket]) -> dict[str, int]:
        """The submission times of the buckets' heads: those not seen before are read
        (one pipelined round trip; a task's is read once while it stays a head: the cache
        keeps only the current heads)."""
        ids = [t.task_id for b in buckets for t in b.heads]
        known = self.known
        new = [t for t in ids if t not in known]
        if new:
            pipe = batch(r.redis)
            for t in new:
                pipe.hget(r.keys.task(t), "submitted_at")
            for t, v in zip(new, pipe.execute(), strict=True):
                known[t] = int(float(v or 0))
        if len(known) > 2 * len(ids) + 1000:
            self.known = known = {t: known[t] for t in ids}
        return {t: known[t] for t in ids}


class InputReading(Protocol):
    """What the input readers use of a snapshot reader (`snapshot.SnapshotReader`): its
    connection, the inputs its strategy needs, and what it read with its last base."""

    redis: redis.Redis
    keys: Keys
    needs: frozenset[str]
    settings: dict[str, Any]
    aging_ms: int
    avoiding: int
    faulty: bool
    submitted: SubmitTimes
    retry_wait_ms: int  # the pool's retry_elsewhere_wait, read with the last base
    blamed: dict[tuple[str, frozenset[str]], int]  # (task, devices failed on) -> ms of the failure

    def constraints(self, sig: str) -> tuple[str | None, frozenset[str]]:
        """The driver type and tags of bucket ``sig`` (read with the heads)."""
        ...


@register_input("avoid")
def read_avoid(r: InputReading, base: Base, buckets: list[Bucket]) -> dict[str, Any]:
    """The anti-affinity records of the heads that have one (they ride on the heads, read
    with them while some queued task has one: `SnapshotReader.avoiding`)."""
    if not r.avoiding:
        return {"avoid": {}}
    return {
        "avoid": {
            t.task_id: Avoid(t.avoid_devices, t.avoid_hosts)
            for b in buckets
            for t in b.heads
            if t.avoid_devices or t.avoid_hosts
        }
    }


@register_input("faults", per_pass=True)
def read_faults(r: InputReading, base: Base, buckets: list[Bucket]) -> dict[str, Any]:
    """The idle devices' consecutive device faults (read with the base: `IdleDevice.faults`)."""
    if not r.faulty:
        return {"faults": {}}
    return {"faults": {d.device_id: d.faults for d in base.devices if d.faults}}


@register_input("limits", settings=LIMIT_SETTINGS, per_pass=True)
def read_limit_loads(r: InputReading, base: Base, buckets: list[Bucket]) -> dict[str, Any]:
    """The declared limits bounded by a setting (read with the base): for those set, the
    leases counted on the idle devices' hosts for the servable buckets' tenants
    (`limit_load.read_limits`); nothing more read while no bound is set. (A tenant's own cap
    comes with the tenants' shares: ``tenants``.)"""
    if not any(setting_bound(r.settings.get(s)) > 0 for s in LIMIT_SETTINGS):
        return {"limits": {}}
    hosts = {d.host_id for d in base.devices}
    tenants = {b.tenant for b in base.shells if b.tenant and base.matching.get(b.sig)}
    return {"limits": read_limits(r.redis, r.keys, r.settings, hosts, tenants)}


def blamed_at(raw: Any, now: int) -> int:
    """When a task's last attempt (its JSON record, ``raw``) failed for a reason blamed on the
    device (`DEVICE_BLAMED`): its end (Redis ms; ``now`` when not recorded); else 0."""
    try:
        rec = json.loads(raw) if raw else {}
    except ValueError:
        return 0
    if not isinstance(rec, dict) or rec.get("failure_kind") not in DEVICE_BLAMED:
        return 0
    ended = rec.get("ended_at")
    return int(ended) if isinstance(ended, int | float) and ended > 0 else now


def with_wait(
    r: InputReading, heads: dict[str, tuple[QueuedTask, ...]], now: int
) -> dict[str, tuple[QueuedTask, ...]]:
    """Heads that are retries after a failure blamed on the device, with the time until
    which they wait for another device (`QueuedTask.avoid_until`: the failure plus
    ``retry_elsewhere_wait``), unless the pool has no other device matching them (its
    registered device profiles, ``caps``). One round trip for the failures not seen
    before, one for ``caps`` while some head waits; nothing while no head has an
    anti-affinity record."""
    if not r.avoiding or r.retry_wait_ms <= 0:
        return heads
    retries = [t for hs in heads.values() for t in hs if t.avoid_devices]
    todo = [t for t in retries if (t.task_id, t.avoid_devices) not in r.blamed]
    if todo:
        pipe = batch(r.redis)
        for t in todo:
            pipe.execute_command("LINDEX", r.keys.attempts(t.task_id), -1)
        if len(r.blamed) > 10_000:
            r.blamed.clear()
        for t, raw in zip(todo, pipe.execute(), strict=True):
            r.blamed[(t.task_id, t.avoid_devices)] = blamed_at(raw, now)
    waiting = {
        t.task_id: until
        for t in retries
        if (until := r.blamed[(t.task_id, t.avoid_devices)] + r.retry_wait_ms) > now
        and r.blamed[(t.task_id, t.avoid_devices)] > 0
    }
    if not waiting:
        return heads
    profiles = [
        (d, tagset(tags), int(n))
        for p, n in (r.redis.hgetall(r.keys.caps) or {}).items()
        for d, _, tags in [str(p).partition("|")]
        if str(n).lstrip("-").isdigit()
    ]
    out = {}
    for sig, hs in heads.items():
        drv, tags = r.constraints(sig)
        matching = sum(n for d, ts, n in profiles if (not drv or d == drv) and tags <= ts)
        out[sig] = tuple(
            replace(t, avoid_until=waiting[t.task_id])
            if t.task_id in waiting and matching > len(t.avoid_devices)
            else t
            for t in hs
        )
    return out
