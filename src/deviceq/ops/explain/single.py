"""``explain`` for a queued single-device task in its bucket: which registered devices could
serve it (the pipeline's filters: `devices.match`), what keeps those from it now (the one
rule: `devices.classify`), its place and wait estimate (`estimate`), its priority's aging,
its tenant and deadlines."""

from __future__ import annotations

from typing import Any

from ...core.connection import PoolConnection
from ...core.fleet import read_attributes, read_devices, read_hosts
from ...core.models import ScheduledTask
from ...core.tenants import parse_tenant
from ...core.where import parse_all, why_none
from ...scheduler.placement.recorder import Need
from ...scheduler.placement.rows import MAX_PRIORITY, aged
from .devices import (
    BLOCKER_TEXT,
    BLOCKERS,
    bookings,
    classify,
    first_reason,
    match,
    prefer_ranking,
)
from .estimate import position
from .limits import limit_reasons
from .model import Explanation, Reason, at, secs
from .preemption import preemption_reason


def explain_queued(admin: PoolConnection, task: ScheduledTask, raw: dict[str, str]) -> Explanation:
    """Why queued task ``task`` (its hash ``raw``) is not placed yet."""
    k = admin.keys
    r = admin.redis
    now = admin.server_time_ms()
    devices = read_devices(admin)
    hosts = {h.host_id: h for h in read_hosts(admin)}
    found = match(Need(task.driver_type, frozenset(task.tags)), devices)
    of_type, matching, missing = found.of_type, found.matching, found.missing
    where_stop: str | None = None
    if task.where and matching:
        matching, where_stop = narrow_where(admin, task, matching)
    counts: dict[str, int] = {"devices": len(devices)}
    counts["of_driver_type"] = len(of_type)
    counts["matching"] = len(matching)
    cls, booked_ends = classify(matching, hosts, bookings(admin))
    counts.update(cls)

    sig = raw.get("sig", "")
    seq = int(raw.get("seq") or 0)
    pipe = r.pipeline(transaction=False)
    pipe.zrank(k.queue(sig), task.id)
    pipe.zcount(k.status("queued"), "-inf", f"({seq}")
    pipe.get(k.leader)
    pipe.pttl(k.leader)
    rank, older, leader, _ = pipe.execute()
    counts["same_constraints_ahead"] = int(rank or 0)
    counts["older_queued"] = int(older or 0)

    reasons: list[Reason] = []
    want = describe(task)
    if task.driver_type and not of_type:
        types = sorted({d.driver_type for d in devices})
        reasons.append(
            Reason(
                "no_driver_type",
                f"no device of driver type {task.driver_type} is registered"
                + (f" (driver types present: {', '.join(types)})" if types else " (no devices)"),
                0,
                {"driver_types": types},
            )
        )
        summary = f"no device of driver type {task.driver_type} exists"
    elif not devices:
        reasons.append(Reason("no_devices", "the pool has no devices; start a host worker"))
        summary = "the pool has no devices"
    elif where_stop is not None:
        reasons.append(Reason("where", where_stop, 0, {"where": list(task.where)}))
        summary = where_stop
    elif not matching:
        lack = ", ".join(f"{t} ({n} lack it)" for t, n in sorted(missing.items()))
        reasons.append(
            Reason(
                "missing_tags",
                f"{len(of_type)} device(s) of {task.driver_type or 'any'} driver type, "
                f"none has every required tag: {lack}",
                len(of_type),
                {"missing": missing},
            )
        )
        summary = f"no device offers {want}"
    else:
        for b in BLOCKERS:
            if b == "booked" and cls[b]:
                until, by, did = booked_ends[0]
                reasons.append(
                    Reason(
                        "booked",
                        f"{cls[b]} matching device(s) {BLOCKER_TEXT[b]}; the first reservation "
                        f"ends at {at(until)} (in {secs(until, now)}: {did}, by {by!r})",
                        cls[b],
                        {"reserved_until": until, "reserved_by": by, "device_id": did},
                    )
                )
            elif cls[b]:
                reasons.append(Reason(b, f"{cls[b]} matching device(s) {BLOCKER_TEXT[b]}", cls[b]))
        if cls["idle"]:
            if not leader:
                reasons.append(
                    Reason(
                        "no_scheduler",
                        f"{cls['idle']} matching device(s) idle, but no scheduler holds the leader "
                        "lease: start `deviceq scheduler run`",
                        cls["idle"],
                    )
                )
                summary = "matching devices are idle but no scheduler is running"
            else:
                reasons.append(
                    Reason(
                        "waiting_turn",
                        f"{cls['idle']} matching device(s) idle; {older} older task(s) queued "
                        f"({rank or 0} with the same constraints ahead): it is assigned at a "
                        "coming scheduler pass",
                        cls["idle"],
                        {"leader": leader},
                    )
                )
                summary = "matching devices are idle; waiting for its turn"
        elif cls["booked"] == len(matching):
            until = booked_ends[0][0]
            summary = (
                f"it can only run on reserved device(s) offering {want}; the first reservation "
                f"ends at {at(until)} (in {secs(until, now)})"
            )
        else:
            busiest = max(BLOCKERS, key=lambda b: cls[b])
            summary = (
                f"all {len(matching)} device(s) offering {want} are unavailable "
                f"(mostly {BLOCKER_TEXT[busiest]})"
            )
        if missing:
            reasons.append(
                Reason(
                    "missing_tags",
                    "other devices of the driver type lack tags: "
                    + ", ".join(f"{t} ({n})" for t, n in sorted(missing.items())),
                    sum(missing.values()),
                    {"missing": missing},
                )
            )
    if cls["idle"]:
        idle = [d for d in matching if first_reason(d, hosts.get(d.host_id or "")) == "idle"]
        for full in reversed(limit_reasons(admin, task.tenant, idle)):
            reasons.insert(0, full)
            if leader and full.count == len(idle):
                setting = next(k for k in full.detail if k != "hosts")
                summary = f"every idle matching device is on a host at {setting}"
    if matching:
        reasons.append(position(admin, task, matching, now, counts))
        ranked = prefer_ranking(admin, matching, hosts)
        if ranked is not None:
            text, setting, order = ranked
            reasons.append(Reason("prefer", text, len(order), {
                "prefer": setting, "ranking": [{"device_id": d, "value": _plain(v)}
                                               for d, v in order]}))  # fmt: skip
    aging = _aging(admin, task, now)
    if aging:
        reasons.append(aging)
    elsewhere = _retry_elsewhere(admin, task, [d.device_id for d in matching], now)
    if elsewhere is not None:
        reasons.insert(0, elsewhere)
        summary = elsewhere.message
    if task.tenant:
        capped = _tenant(admin, task.tenant)
        reasons.insert(0, capped[0]) if capped[1] else reasons.append(capped[0])
        if capped[1]:
            summary = f"its tenant {task.tenant} holds its cap of {capped[1]} device(s)"
    if task.queue_deadline:
        reasons.append(
            Reason(
                "queue_deadline",
                f"fails as unschedulable in {secs(task.queue_deadline, now)} if still queued",
            )
        )
    if task.attempt:
        reasons.append(
            Reason("retry", f"attempt {task.attempt} of {task.max_attempts} ended; queued again")
        )
    pre = preemption_reason(admin, task, raw, cls["idle"]) if matching else None
    if pre is not None:
        reasons.insert(0, pre[0])
        summary = pre[1] or summary
    return Explanation(task.id, task.status.value, summary, reasons, counts)


def _aging(admin: PoolConnection, task: ScheduledTask, now: int) -> Reason | None:
    """Its priority raised by aging (pool setting ``aging_seconds``): what priority strategies
    order it by now, and when it next rises."""
    period = admin.config().aging_seconds
    if period <= 0 or task.priority >= MAX_PRIORITY or not task.submitted_at:
        return None
    ms = int(period * 1000)
    eff = aged(task.priority, task.submitted_at, now, ms)
    waited = (now - task.submitted_at) / 1000
    text = f"priority {task.priority}, aged to {eff} after waiting {waited:.0f}s"
    text += f" (one level per aging_seconds {period:g})"
    if eff < MAX_PRIORITY:
        nxt = task.submitted_at + (eff - task.priority + 1) * ms
        text += f"; {eff + 1} in {secs(nxt, now)}"
    detail = {"priority": task.priority, "effective_priority": eff, "aging_seconds": period}
    return Reason("aging", text, eff, detail)


def _tenant(admin: PoolConnection, tenant: str) -> tuple[Reason, int]:
    """The task's tenant: its weight and held devices, and whether it is at its cap (then
    the cap is returned: the task waits for one of the tenant's tasks to end)."""
    pipe = admin.redis.pipeline(transaction=False)
    pipe.hget(admin.keys.tenants, tenant)
    pipe.hget(admin.keys.tenant_held, tenant)
    spec, held_raw = pipe.execute()
    weight, cap = parse_tenant(spec)
    held = int(held_raw or 0)
    if cap and held >= cap:
        return (
            Reason(
                "tenant_cap",
                f"tenant {tenant} holds {held} device(s), its cap (max_devices {cap}): it waits "
                "until one of the tenant's tasks ends",
                held,
                {"tenant": tenant, "held": held, "max_devices": cap, "weight": weight},
            ),
            cap,
        )
    text = f"tenant {tenant}: weight {weight}, holds {held} device(s)"
    text += f" of at most {cap}" if cap else ""
    detail = {"tenant": tenant, "held": held, "max_devices": cap, "weight": weight}
    return Reason("tenant", text, held, detail), 0


def narrow_where(
    admin: PoolConnection, task: ScheduledTask, matching: list[Any]
) -> tuple[list[Any], str | None]:
    """The devices of ``matching`` whose attributes satisfy the task's --where clauses (one
    pipelined read of their attributes), or none and where matching stops: ``3 device(s)
    have driver type android and tags wifi; none has sdk>=35 (highest: 34)``."""
    clauses = parse_all(list(task.where))
    return where_narrowed(admin, describe(task), clauses, matching)


def where_narrowed(
    admin: PoolConnection, want: str, clauses: Any, matching: list[Any]
) -> tuple[list[Any], str | None]:
    """`narrow_where` for any requirement described as ``want`` (a role's too)."""
    attrs = {d: a for d, (a, _) in read_attributes(admin, [d.device_id for d in matching]).items()}
    kept, passed = list(matching), [want] if want != "any device" else []
    for c in clauses:
        ok = [d for d in kept if c.matches(attrs[d.device_id])]
        if not ok:
            have = " and ".join(passed) or "any driver type"
            why = why_none(c, [attrs[d.device_id] for d in kept])
            n = len(kept)
            some = f"{n} devices have" if n != 1 else "1 device has"
            return [], f"{some} {have}; {why}"
        kept = ok
        passed.append(str(c))
    return kept, None


def _plain(v: object) -> object:
    """A ranked value as JSON holds it (a version as its text)."""
    return v if v is None or isinstance(v, bool | int | float | str) else str(v)


def describe(task: ScheduledTask) -> str:
    """What the task asks for, in words (``driver type X and tags a,b``)."""
    parts = []
    if task.driver_type:
        parts.append(f"driver type {task.driver_type}")
    if task.tags:
        parts.append("tags " + ",".join(task.tags))
    return " and ".join(parts) or "any device"


def _retry_elsewhere(
    admin: PoolConnection, task: ScheduledTask, matching: list[str], now: int
) -> Reason | None:
    """A retry after a failure blamed on the device waits for another matching device (the
    scheduler's `RetryElsewhere`): up to ``retry_elsewhere_wait`` after the failure, unless
    the devices it failed on are the pool's only matches."""
    from ...scheduler.inputs import blamed_at

    failed_on = [d for d in task.avoid_devices if d in matching]
    if not failed_on or len(matching) <= len(failed_on):
        return None
    wait_ms = int(admin.config().retry_elsewhere_wait * 1000)
    since = blamed_at(admin.redis.lindex(admin.keys.attempts(task.id), -1), now)
    if not since or wait_ms <= 0 or since + wait_ms <= now:
        return None
    until = since + wait_ms
    names = ",".join(failed_on)
    return Reason(
        "retry_elsewhere",
        f"waiting up to {(until - now) / 1000:.0f}s for a device other than {names} it failed "
        f"on (until {at(until)}; then it may take {names} again)",
        len(failed_on),
        {"devices": failed_on, "until": until, "retry_elsewhere_wait": wait_ms / 1000},
    )
