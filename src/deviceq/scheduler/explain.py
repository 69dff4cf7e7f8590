"""``explain(task_id)``: why is a task not running (or where is it)?

For a queued task every device of the pool is classified against the task's constraints:

* ``no_driver_type`` — no device of the task's driver type is registered;
* ``missing_tags`` — devices of that driver type exist but lack required tags (counted per tag);
* the devices that do satisfy the constraints, by what keeps them from this task, in this
  order of precedence (the one rule, ``deviceq.core.eligibility.REASONS``): ``quarantined``,
  ``host_dead`` (no heartbeat within ``host_timeout``), ``reserved`` (running or assigned
  another task), ``booked``, ``suspect`` (a lease on it expired) or ``held`` (its host refused
  an assignment) until its host's next heartbeat, ``checking`` (a health check runs on it) or
  ``unhealthy`` (its last health check failed), ``busy`` (the host reports it busy),
  ``offline``, ``host_draining``, ``host_suspect``, else ``idle`` (assignable);
* ``booked`` — reserved for a person (``deviceq reserve``): the reason says when the first of
  those reservations ends (``detail.reserved_until``, ms) and by whom; a task that could only
  run on reserved devices says so in its summary, with that time;
* with assignable devices: ``waiting_turn`` (older tasks are queued ahead) or ``no_scheduler``
  (no scheduler holds the leader lease) — the scheduler assigns at its next pass.

A queued multi-device task (roles) is explained role by role (`explain_gang`).

Other states are explained from the task hash: assigned (waiting for its host to claim it),
dispatched (running on device D), or finished (done / failed with its failure kind / cancelled).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..core import liveness
from ..core.connection import PoolConnection
from ..core.eligibility import verdict
from ..core.errors import NotFound
from ..core.fleet import read_devices, read_hosts, read_parts
from ..core.models import Attempt, ScheduledTask, TaskStatus, validate_id
from ..core.tenants import parse_tenant
from .buckets import buckets
from .strategies import MAX_PRIORITY, IdleDevice, aged

BLOCKERS = (
    "booked",
    "reserved",
    "quarantined",
    "host_dead",
    "suspect",
    "held",
    "unhealthy",
    "checking",
    "host_draining",
    "host_suspect",
    "offline",
    "busy",
)
"""The reasons of the one rule (`deviceq.core.eligibility.REASONS`) in the order explain
lists them."""

_BLOCKER_TEXT = {
    "booked": "reserved for a person (deviceq reserve)",
    "reserved": "reserved by other tasks",
    "quarantined": "quarantined",
    "host_dead": "on a host that stopped heartbeating",
    "suspect": "suspect after a lost lease (until their host's next heartbeat)",
    "held": "held after their host refused an assignment (until its next heartbeat)",
    "unhealthy": "unhealthy: their last health check failed; out of service until one passes",
    "checking": "running (or due) a health check",
    "host_draining": "on a draining host",
    "host_suspect": "on a host one of whose leases expired (until its next heartbeat)",
    "offline": "offline",
    "busy": "reported busy by their host",
}


@dataclass
class Reason:
    """One reason, machine-readable ``code`` plus a sentence and a count where it applies."""

    code: str
    message: str
    count: int = 0
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Explanation:
    """Why a task is where it is. ``summary`` is one sentence; ``reasons`` the details;
    ``counts`` the device classification (queued tasks only)."""

    task_id: str
    status: str
    summary: str
    reasons: list[Reason] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    constraints: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        lines = [f"{self.task_id} {self.status}: {self.summary}"]
        for r in self.reasons:
            lines.append(f"  - [{r.code}] {r.message}")
        return "\n".join(lines)


def explain(admin: PoolConnection, task_id: str) -> Explanation:
    """Explain task ``task_id`` of the pool ``admin`` is connected to (a PoolAdmin, Client
    or any PoolConnection). Raises NotFound for an unknown task."""
    validate_id(task_id, "task id")
    raw: dict[str, str] = admin.redis.hgetall(admin.keys.task(task_id))  # type: ignore[assignment]
    if not raw:
        raise NotFound(f"no task {task_id} in pool {admin.pool}")
    task = ScheduledTask.from_hash(raw)
    cons: dict[str, Any] = {
        "driver_type": task.driver_type,
        "tags": list(task.tags),
        "priority": task.priority,
    }
    if task.roles and raw.get("roles"):
        if task.status in (TaskStatus.assigned, TaskStatus.dispatched):
            read_parts(admin, task)  # how each part is doing
        cons = {
            name: {"driver_type": r.driver_type, "tags": list(r.tags)}
            for name, r in task.roles.items()
        }
    if task.status is TaskStatus.queued and task.eligible_at is not None:
        exp = _explain_retry_wait(admin, task)
    elif task.status is TaskStatus.queued and raw.get("roles"):
        from .explain_gang import explain_gang  # (it builds on this module)

        exp = explain_gang(admin, task)
    elif task.status is TaskStatus.queued:
        exp = _explain_queued(admin, task, raw)
    else:
        exp = _explain_other(admin, task)
    exp.constraints = cons
    return exp


def _explain_retry_wait(admin: PoolConnection, task: ScheduledTask) -> Explanation:
    """A queued task waiting out its retry backoff (in ``retries``, not yet in its bucket)."""
    now = admin.server_time_ms()
    left = max(0.0, ((task.eligible_at or now) - now) / 1000)
    raw_last = admin.redis.lindex(admin.keys.attempts(task.id), -1)
    last = Attempt.model_validate_json(raw_last) if raw_last else None
    why = f"attempt {task.attempt} failed ({last.failure_kind})" if last else "it failed"
    summary = (
        f"{why}; it is retried in {left:.1f}s, once its retry backoff has passed "
        f"(attempt {task.attempt + 1} of {task.max_attempts})"
    )
    reasons = [
        Reason(
            "retry_backoff",
            f"waiting out its retry backoff until {_at(task.eligible_at or now)}"
            + (f": {last.retry}" if last and last.retry else ""),
            detail={"eligible_at": task.eligible_at, "seconds_left": round(left, 3)},
        )
    ]
    if task.avoid_devices:
        reasons.append(
            Reason("anti_affinity", "it prefers other devices than " + ",".join(task.avoid_devices))
        )
    return Explanation(task.id, task.status.value, summary, reasons)


def _explain_other(admin: PoolConnection, task: ScheduledTask) -> Explanation:
    now = admin.server_time_ms()
    where = f"device {task.device_id} on host {task.host_id}"
    tries = f"attempt {task.attempt} of {task.max_attempts}"
    reasons: list[Reason] = []
    if task.roles and task.status in (TaskStatus.assigned, TaskStatus.dispatched):
        placed = ", ".join(f"{n} on {r.device_id} ({r.host_id})" for n, r in task.roles.items())
        waiting = task.status is TaskStatus.assigned
        summary = f"multi-device task ({tries}): {placed}; " + (
            "waiting for every host to claim its part" if waiting else "running"
        )
        for name, r in task.roles.items():
            reasons.append(
                Reason(
                    "role",
                    f"role {name}: {r.status or '?'} on device {r.device_id} of host {r.host_id}",
                    0,
                    {
                        "role": name,
                        "device_id": r.device_id,
                        "host_id": r.host_id,
                        "status": r.status,
                    },
                )  # fmt: skip
            )
        return Explanation(task.id, task.status.value, summary, reasons)
    if task.status is TaskStatus.assigned:
        left = _secs(task.lease_expires_at, now)
        summary = f"assigned to {where} ({tries}); waiting for the host to claim it"
        reasons.append(
            Reason(
                "awaiting_claim",
                f"the claim window ends in {left}",
                0,
                {"device_id": task.device_id, "host_id": task.host_id},
            )
        )
        reasons += _host_state(admin, task.host_id, now)
    elif task.status is TaskStatus.dispatched:
        left = _secs(task.lease_expires_at, now)
        summary = f"it is running on {where} ({tries})"
        reasons.append(
            Reason(
                "running",
                f"lease {task.lease_id} expires in {left} unless renewed",
                0,
                {"device_id": task.device_id, "host_id": task.host_id},
            )
        )
        if task.cancel_requested:
            reasons.append(Reason("cancel_requested", "cancel requested: its host will stop it"))
        reasons += _host_state(admin, task.host_id, now)
    else:
        kind = f" ({task.failure_kind.value})" if task.failure_kind else ""
        summary = f"it finished: {task.status.value}{kind} after {task.attempt} attempt(s)"
        if task.error and task.status is not TaskStatus.done:
            reasons.append(Reason("error", task.error[:500]))
        if task.device_id:
            reasons.append(Reason("last_device", f"last ran on {where}"))
    return Explanation(task.id, task.status.value, summary, reasons)


def _host_state(admin: PoolConnection, host_id: str | None, now: int) -> list[Reason]:
    """Why a running task's host may not finish it (the one liveness rule)."""
    if not host_id:
        return []
    raw = admin.redis.hmget(admin.keys.host(host_id), *liveness.HOST_FIELDS)
    row = liveness.row([None if v is None else str(v) for v in raw])
    if row["last_heartbeat"] is None:
        return [Reason("host_missing", f"host {host_id} no longer exists")]
    timeout_ms = admin.config().host_timeout * 1000
    why = liveness.unplaceable(row, now, timeout_ms)
    if why == "host_dead":
        age = now - int(row["last_heartbeat"] or 0)
        return [
            Reason(
                "host_dead",
                f"host {host_id} last heartbeat {age / 1000:.1f}s ago: "
                "the lease will expire and the task be retried",
            )
        ]
    if why == "host_draining":
        return [Reason("host_draining", f"host {host_id} is draining")]
    if why == "host_suspect":
        return [
            Reason(
                "host_suspect", f"host {host_id} lost a lease: no new work until its next heartbeat"
            )
        ]
    return []


def _explain_queued(admin: PoolConnection, task: ScheduledTask, raw: dict[str, str]) -> Explanation:
    k = admin.keys
    r = admin.redis
    now = admin.server_time_ms()
    devices = read_devices(admin)
    hosts = {h.host_id: h for h in read_hosts(admin)}
    need = set(task.tags)
    counts: dict[str, int] = {"devices": len(devices)}
    of_type = [d for d in devices if not task.driver_type or d.driver_type == task.driver_type]
    counts["of_driver_type"] = len(of_type)
    missing: dict[str, int] = {}
    matching = []
    for d in of_type:
        lacks = need - set(d.tags)
        for t in lacks:
            missing[t] = missing.get(t, 0) + 1
        if not lacks:
            matching.append(d)
    counts["matching"] = len(matching)
    cls = dict.fromkeys((*BLOCKERS, "idle"), 0)
    books = _bookings(admin)
    booked_ends: list[tuple[int, str, str]] = []
    for d in matching:
        v = verdict(d, hosts.get(d.host_id))
        first = v.reasons[0] if v.reasons else "idle"
        if first == "booked" and d.device_id in books:
            booked_ends.append((*books[d.device_id], d.device_id))
        cls[first] += 1
    counts.update(cls)
    booked_ends.sort()

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
    want = _describe(task)
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
                        f"{cls[b]} matching device(s) {_BLOCKER_TEXT[b]}; the first reservation "
                        f"ends at {_at(until)} (in {_secs(until, now)}: {did}, by {by!r})",
                        cls[b],
                        {"reserved_until": until, "reserved_by": by, "device_id": did},
                    )
                )
            elif cls[b]:
                reasons.append(Reason(b, f"{cls[b]} matching device(s) {_BLOCKER_TEXT[b]}", cls[b]))
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
                f"ends at {_at(until)} (in {_secs(until, now)})"
            )
        else:
            busiest = max(BLOCKERS, key=lambda b: cls[b])
            summary = (
                f"all {len(matching)} device(s) offering {want} are unavailable "
                f"(mostly {_BLOCKER_TEXT[busiest]})"
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
    if matching:
        reasons.append(_position(admin, task, matching, now, counts))
    aging = _aging(admin, task, now)
    if aging:
        reasons.append(aging)
    if task.tenant:
        capped = _tenant(admin, task.tenant)
        reasons.insert(0, capped[0]) if capped[1] else reasons.append(capped[0])
        if capped[1]:
            summary = f"its tenant {task.tenant} holds its cap of {capped[1]} device(s)"
    if task.queue_deadline:
        reasons.append(
            Reason(
                "queue_deadline",
                f"fails as unschedulable in {_secs(task.queue_deadline, now)} if still queued",
            )
        )
    if task.attempt:
        reasons.append(
            Reason("retry", f"attempt {task.attempt} of {task.max_attempts} ended; queued again")
        )
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
        text += f"; {eff + 1} in {_secs(nxt, now)}"
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


RATE_EVENTS = 5000  # recent events read to estimate the matching devices' throughput


def _position(
    admin: PoolConnection,
    task: ScheduledTask,
    matching: list[Any],
    now: int,
    counts: dict[str, int],
) -> Reason:
    """The task's place among the queued tasks that compete for its devices (buckets some
    matching device could serve: higher priority ones ahead in full, equal priority ones by
    submission order; aging and tenants' shares are not modelled) and an estimate of its wait
    from how many tasks those devices finished recently (the last RATE_EVENTS events)."""

    r, k = admin.redis, admin.keys
    seq = task.seq
    rivals = [
        b
        for b in buckets(admin)
        if any(b.accepts(_idle(d)) for d in matching) and b.priority >= task.priority
    ]
    pipe = r.pipeline(transaction=False)
    for b in rivals:
        if b.priority > task.priority:
            pipe.zcard(k.queue(b.sig))
        else:
            pipe.zcount(k.queue(b.sig), "-inf", f"({seq}")
    pipe.xrevrange(k.events, "+", "-", count=RATE_EVENTS)
    res = pipe.execute()
    ahead = sum(int(n) for n in res[:-1])
    ids = {d.device_id for d in matching}
    ended = [
        int(str(eid).split("-")[0])
        for eid, f in res[-1]
        if f.get("type") in ("done", "failed", "cancelled") and f.get("device") in ids
    ]
    counts["competing_ahead"] = ahead
    detail: dict[str, Any] = {"position": ahead + 1, "rate_per_s": None, "estimated_wait_s": None}
    text = f"position {ahead + 1} among the queued tasks competing for its {len(ids)} device(s)"
    if len(ended) >= 2 and now > min(ended):
        span = (now - min(ended)) / 1000
        rate = len(ended) / span
        eta = (ahead + 1) / rate
        detail.update(rate_per_s=round(rate, 3), estimated_wait_s=round(eta, 1))
        text += (
            f"; those devices finished {len(ended)} task(s) in the last {span:.0f}s "
            f"({rate:.2f}/s): it should start in about {eta:.0f}s"
        )
    else:
        text += "; too few recent runs on those devices to estimate its wait"
    return Reason("position", text, ahead + 1, detail)


def _idle(d: Any) -> IdleDevice:
    return IdleDevice(d.device_id, d.host_id or "", d.driver_type or "", frozenset(d.tags or ()))


def _describe(task: ScheduledTask) -> str:
    parts = []
    if task.driver_type:
        parts.append(f"driver type {task.driver_type}")
    if task.tags:
        parts.append("tags " + ",".join(task.tags))
    return " and ".join(parts) or "any device"


def _bookings(admin: PoolConnection) -> dict[str, tuple[int, str]]:
    """Reserved devices (``bookings``): device id -> (end ms, note)."""
    r, k = admin.redis, admin.keys
    ends: list[tuple[str, float]] = r.zrange(k.bookings, 0, -1, withscores=True)  # type: ignore[assignment]
    pipe = r.pipeline(transaction=False)
    for did, _ in ends:
        pipe.hget(k.device(did), "booked_by")
    return {
        did: (int(end), str(by or "")) for (did, end), by in zip(ends, pipe.execute(), strict=True)
    }


def _at(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _secs(at_ms: int | None, now: int) -> str:
    if not at_ms:
        return "-"
    return f"{(at_ms - now) / 1000:.1f}s"
