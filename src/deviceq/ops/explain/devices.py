"""The device side of ``explain``: which registered devices could serve a requirement at all
(the placement pipeline's filter stage, recorded: `deviceq.scheduler.placement.recorder.judge`, so
what explain says of driver types and tags is what the scheduler's filters decide), and what
keeps each of those from taking work now (the one rule, `deviceq.core.eligibility.verdict`:
device state is not the filters' concern, a placement view holds only assignable devices)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...core.connection import PoolConnection
from ...core.eligibility import verdict
from ...core.models import Host, PooledDevice
from ...scheduler.placement.builtin.matching import DRIVER_TYPE_MISMATCH, MISSING_TAG
from ...scheduler.placement.plugins import Filter, Requirement
from ...scheduler.placement.profiles import PROFILES
from ...scheduler.placement.recorder import FilterRecord, judge
from ...scheduler.placement.rows import IdleDevice
from ...scheduler.placement.view import DeviceClass
from ...scheduler.strategies import DEFAULT_STRATEGY

FILTERS: tuple[Filter, ...] = PROFILES[DEFAULT_STRATEGY].filters
"""The filter stage explain judges with: the default profile's (every built-in profile has
the same filters; tests/scheduler/test_explain_agrees.py holds that)."""

BLOCKERS = (
    "booked",
    "reserved",
    "quarantined",
    "host_dead",
    "suspect",
    "held",
    "unhealthy",
    "gated",
    "checking",
    "host_draining",
    "host_suspect",
    "offline",
    "busy",
)
"""The reasons of the one rule (`deviceq.core.eligibility.REASONS`) in the order explain
lists them."""

BLOCKER_TEXT = {
    "booked": "reserved for a person (deviceq reserve)",
    "reserved": "reserved by other tasks",
    "quarantined": "quarantined",
    "host_dead": "on a host that stopped heartbeating",
    "suspect": "suspect after a lost lease (until their host's next heartbeat)",
    "held": "held after their host refused an assignment (until its next heartbeat)",
    "unhealthy": "unhealthy: their last health check failed; out of service until one passes",
    "checking": "running (or due) a health check",
    "gated": "held by a gate (deviceq gate list)",
    "host_draining": "on a draining host",
    "host_suspect": "on a host one of whose leases expired (until its next heartbeat)",
    "offline": "offline",
    "busy": "reported busy by their host",
}


def candidate(d: PooledDevice) -> IdleDevice:
    """A registered device as the filters see one (its id, host, driver type and tags)."""
    return IdleDevice(d.device_id, d.host_id or "", d.driver_type or "", frozenset(d.tags or ()))


@dataclass
class Matching:
    """The filter stage for one requirement over every registered device: the devices of its
    driver type (not rejected with ``driver_type_mismatch``), those that pass (``matching``,
    in ``devices`` order) and per tag how many devices of the driver type lack it."""

    of_type: list[PooledDevice]
    matching: list[PooledDevice]
    missing: dict[str, int] = field(default_factory=dict)
    record: FilterRecord = field(default_factory=FilterRecord)


def match(need: Requirement, devices: Iterable[PooledDevice]) -> Matching:
    """Judge ``devices`` for ``need`` with `FILTERS` (see the module doc)."""
    devs = list(devices)
    rec = judge(FILTERS, need, (candidate(d) for d in devs))
    wrong = rec.devices_with(DRIVER_TYPE_MISMATCH)
    ok = frozenset(rec.feasible_devices)
    missing = {
        why.removeprefix(MISSING_TAG): n
        for why, n in sorted(rec.reasons().items())
        if why.startswith(MISSING_TAG)
    }
    return Matching(
        [d for d in devs if d.device_id not in wrong],
        [d for d in devs if d.device_id in ok],
        missing,
        rec,
    )


def classes(devices: Iterable[PooledDevice]) -> list[DeviceClass]:
    """The distinct device classes (driver type, tags) of ``devices``, as the filters see
    them."""
    return list(dict.fromkeys((d.driver_type or "", frozenset(d.tags or ())) for d in devices))


def serves(need: Requirement, device_classes: Iterable[DeviceClass]) -> bool:
    """Whether the filters accept one of ``device_classes`` for ``need`` (as a pass asks: a
    class passes when every filter accepts it)."""
    return any(all(f.feasible(need, c) for f in FILTERS) for c in device_classes)


def first_reason(d: PooledDevice, host: Host | None) -> str:
    """What keeps a device from work now (the first reason of the one rule), or ``idle``."""
    v = verdict(d, host)
    return v.reasons[0] if v.reasons else "idle"


def bookings(admin: PoolConnection) -> dict[str, tuple[int, str]]:
    """Reserved devices (``bookings``): device id -> (end ms, note)."""
    r, k = admin.redis, admin.keys
    ends: list[tuple[str, float]] = r.zrange(k.bookings, 0, -1, withscores=True)  # type: ignore[assignment]
    pipe = r.pipeline(transaction=False)
    for did, _ in ends:
        pipe.hget(k.device(did), "booked_by")
    return {
        did: (int(end), str(by or "")) for (did, end), by in zip(ends, pipe.execute(), strict=True)
    }


def classify(
    matching: Iterable[PooledDevice],
    hosts: Mapping[str, Host],
    books: Mapping[str, tuple[int, str]],
) -> tuple[dict[str, int], list[tuple[int, str, str]]]:
    """The matching devices counted by their first reason (`BLOCKERS` and ``idle``), and the
    booked ones' reservations (end ms, by whom, device id), soonest end first."""
    cls = dict.fromkeys((*BLOCKERS, "idle"), 0)
    booked_ends: list[tuple[int, str, str]] = []
    for d in matching:
        first = first_reason(d, hosts.get(d.host_id))
        if first == "booked" and d.device_id in books:
            booked_ends.append((*books[d.device_id], d.device_id))
        cls[first] += 1
    booked_ends.sort()
    return cls, booked_ends


RANKED_SHOWN = 10
"""How many of the ranked candidates ``explain`` lists (the pool's ``prefer``)."""


def prefer_ranking(
    admin: PoolConnection,
    devices: list[PooledDevice],
    hosts: Mapping[str, Host],
    role: str | None = None,
) -> tuple[str, str, list[tuple[str, object]]] | None:
    """The order the pool's ``prefer`` setting (`deviceq.core.attributes.parse_prefer`) gives
    ``devices`` (those idle now when some are, else all): (message, setting, [(device, value
    ranked by)...], the first `RANKED_SHOWN`), or None when the pool prefers nothing. The same
    order as the scheduler's `Prefer` score: the best first, devices without the attribute
    last, then by device id."""
    from ...core.attributes import parse_prefer, shown
    from ...core.fleet import read_attributes
    from ...scheduler.inputs import DAY_MS, _at
    from ...scheduler.placement.builtin.prefer import _sort_key

    raw = admin.redis.hget(admin.keys.config, "prefer")
    kind, key = parse_prefer(str(raw) if raw else None)
    if kind == "none" or not devices:
        return None
    idle = [d for d in devices if first_reason(d, hosts.get(d.host_id or "")) == "idle"]
    pool = sorted(idle or devices, key=lambda d: d.device_id)
    ids = [d.device_id for d in pool]
    values: dict[str, Any] = {}
    if kind == "least_used":
        pipe = admin.redis.pipeline(transaction=False)
        for d in ids:
            pipe.lrange(admin.keys.device_history(d), 0, -1)
        since = admin.server_time_ms() - DAY_MS
        for d, rows in zip(ids, pipe.execute(), strict=True):
            values[d] = sum(1 for e in rows if _at(e) >= since)
        order = sorted(ids, key=lambda d: int(values[d]))
        what, setting = "runs in the last 24 h", "least_used"
    else:
        attrs = read_attributes(admin, ids)
        values = {d: attrs[d][0][key] for d in ids if key in attrs[d][0]}
        have = sorted((d for d in ids if d in values), key=lambda d: _sort_key(values[d]),
                      reverse=kind == "max")  # fmt: skip
        order = have + [d for d in ids if d not in values]
        what, setting = key, f"{kind}:{key}"
    first = order[:RANKED_SHOWN]

    def value(d: str) -> str:
        if d not in values:
            return "none"
        return str(values[d]) if kind == "least_used" else shown(values[d])

    listed = ", ".join(f"{d} ({what} {value(d)})" for d in first)
    more = f", {len(order) - len(first)} more" if len(order) > len(first) else ""
    whose = "idle" if idle else "matching"
    head = f"role {role}: " if role else ""
    text = f"{head}prefer {setting} ranks its {len(order)} {whose} device(s): {listed}{more}"
    return text, setting, [(d, values.get(d)) for d in first]
