"""Read-only views of a pool for operators: the data behind ``deviceq status``, ``device list``,
``host list`` and the scrape-time gauges of the metrics endpoint.

Every read is bounded: queue buckets (constraint signatures) by ``max_queues``, leases and
failures by their limits; devices and hosts are read whole (one pipeline each)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ..core import connection, fleet
from ..core.durability import server_report
from ..core.fleet import effective_state
from ..core.models import Host, PooledDevice
from ..core.vocabulary import TaskStatus
from ..scheduler.buckets import buckets
from .admin import PoolAdmin, Reservation

DEVICE_STATES = fleet.DEVICE_STATES
"""Effective device states (`deviceq.core.eligibility.STATES`)."""


def device_profiles(admin: PoolAdmin) -> list[tuple[str, tuple[str, ...], int]]:
    """Distinct registered device profiles ``(driver_type, tags, count)`` (the ``caps`` hash
    the submit script checks matchability against)."""
    out = []
    caps: dict[str, str] = admin.redis.hgetall(admin.keys.caps)  # type: ignore[assignment]
    for profile, count in caps.items():
        driver, _, tags = profile.partition("|")
        if int(count) > 0:
            out.append((driver, tuple(t for t in tags.split(",") if t), int(count)))
    return out


def hosts_and_devices(admin: PoolAdmin) -> tuple[list[Host], list[tuple[PooledDevice, str]]]:
    """Every host, and every device with its effective state."""
    hosts = admin.hosts()
    by_id = {h.host_id: h for h in hosts}
    devices = [(d, effective_state(d, by_id.get(d.host_id))) for d in admin.devices()]
    return hosts, devices


def fmt_time(ms: int) -> str:
    """Epoch ms as ``YYYY-MM-DD HH:MM:SSZ`` (UTC)."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def device_reason(d: PooledDevice, state: str, resv: Reservation | None = None) -> str | None:
    """Why a device is not an idle candidate, in words (`deviceq.core.fleet.device_reason`,
    and who reserved it until when)."""
    if resv is not None:
        return f"reserved by {resv.reserved_by!r} until {fmt_time(resv.reserved_until)}"
    return fleet.device_reason(d, state)


def device_counts(devices: list[tuple[PooledDevice, str]]) -> dict[str, int]:
    counts = dict.fromkeys(DEVICE_STATES, 0)
    for _, state in devices:
        counts[state] = counts.get(state, 0) + 1
    return counts


def device_json(
    d: PooledDevice,
    state: str,
    host_draining: bool | None = None,
    resv: Reservation | None = None,
) -> dict[str, Any]:
    """A device as JSON: its fields, ``effective_state``, ``why``, ``reservation`` (null, or
    ``{reserved_by: note, reserved_until: ms, reserved_at: ms}``: a person's reservation) and,
    when known, ``host_draining`` (its host is drained or stopping: it gets no new work).
    ``reserved_by`` at the top level stays the task whose lease holds the device."""
    out = {**d.model_dump(mode="json"), "effective_state": state,
           "why": device_reason(d, state, resv)}  # fmt: skip
    out["reservation"] = (
        None
        if resv is None
        else {"reserved_by": resv.reserved_by, "reserved_until": resv.reserved_until,
              "reserved_at": resv.reserved_at}
    )  # fmt: skip
    if host_draining is not None:
        out["host_draining"] = host_draining
    return out


def device_show_json(
    d: PooledDevice,
    state: str,
    host_draining: bool | None,
    resv: Reservation | None,
    past: tuple[list[dict[str, Any]], list[dict[str, Any]]] = ([], []),
) -> dict[str, Any]:
    """``device show --json``: `device_json` with the reservation's names at the top level:
    ``reserved_by`` is the note of a person's reservation (null when none) and
    ``reserved_until`` its end (ms); ``task_id`` is the task whose lease holds the device.
    ``past`` (`PoolAdmin.device_past`) gives ``recent_attempts`` (the last 20 attempt ends
    on it: task, attempt, outcome, failure_kind, when) and ``history`` (its last 20
    quarantine, health and booking changes: event, when and the event's fields), newest
    first, ``when`` in ms."""
    out = device_json(d, state, host_draining, resv)
    out["task_id"] = d.reserved_by
    out["reserved_by"] = resv.reserved_by if resv else None
    out["reserved_until"] = resv.reserved_until if resv else None
    recent, log = past
    out["recent_attempts"] = [
        {"task": e.get("task"), "attempt": e.get("attempt"), "outcome": e.get("outcome"),
         "failure_kind": e.get("failure_kind"), "when": e.get("at")}
        for e in recent
    ]  # fmt: skip
    out["history"] = [
        {"event": e.get("event"), "when": e.get("at"),
         **{k: v for k, v in e.items() if k not in ("event", "at")}}
        for e in log
    ]  # fmt: skip
    return out


def host_draining(h: Host) -> bool:
    """True while a host gets no new work because it drains: an operator drained it
    (``deviceq host drain``, kept across restarts), or its daemon got SIGTERM and is finishing
    its running tasks (``stopping`` with its session still open: a daemon that has stopped
    has none)."""
    return h.draining or (h.stopping and bool(h.session))


def host_json(h: Host, now_ms: int) -> dict[str, Any]:
    """A host as JSON: its fields and ``heartbeat_age_ms``; ``draining`` is `host_draining`
    (with ``stopping`` true too while its daemon drains after SIGTERM)."""
    return {
        **h.model_dump(mode="json"),
        "draining": host_draining(h),
        "heartbeat_age_ms": now_ms - h.last_heartbeat if h.last_heartbeat else None,
    }


def leader(admin: PoolAdmin) -> dict[str, Any] | None:
    """The scheduler leader lease: owner, epoch and remaining ms, or None."""
    pipe = admin.redis.pipeline(transaction=False)
    pipe.get(admin.keys.leader)
    pipe.pttl(admin.keys.leader)
    value, ttl = pipe.execute()
    if not value:
        return None
    owner, _, epoch = str(value).rpartition(":")
    return {"owner": owner, "epoch": int(epoch or 0), "ttl_ms": int(ttl)}


def strategy_json(admin: PoolAdmin) -> dict[str, Any]:
    """The strategy in force (the last elected leader's, else the default): its name,
    whether it orders by priority, whether a leader recorded it, and the line ``status``
    shows."""
    name, honors, recorded = connection.in_force(admin.redis, admin.keys)
    return {
        "name": name,
        "orders_by_priority": honors,
        "recorded": recorded,
        "text": connection.describe(name, honors, recorded)
        + ("" if honors else f" (to order by priority: {connection.HOW_TO_CHANGE})"),
    }


def expiring_leases(admin: PoolAdmin, now_ms: int, limit: int = 10) -> list[dict[str, Any]]:
    """The next ``limit`` leases to expire, soonest first."""
    r, k = admin.redis, admin.keys
    due: list[tuple[str, float]] = r.zrange(  # type: ignore[assignment]
        k.leases, 0, limit - 1, withscores=True
    )
    pipe = r.pipeline(transaction=False)
    for task_id, _ in due:
        pipe.hmget(
            k.task(task_id), "status", "lease_id", "host_id", "device_id", "attempt", "max_attempts"
        )
    out = []
    for (task_id, score), fields in zip(due, pipe.execute(), strict=True):
        status, lease_id, host_id, device_id, attempt, max_attempts = fields
        out.append(
            {
                "task": task_id,
                "status": status,
                "lease_id": lease_id,
                "host_id": host_id,
                "device_id": device_id,
                "attempt": int(attempt or 0),
                "max_attempts": int(max_attempts or 0),
                "expires_at": int(score),
                "expires_in_ms": int(score) - now_ms,
            }
        )
    return out


def recent_failures(admin: PoolAdmin, limit: int = 10) -> list[dict[str, Any]]:
    """The newest ``limit`` failed tasks, newest first."""
    r, k = admin.redis, admin.keys
    ids: list[str] = r.zrevrange(  # type: ignore[assignment]
        k.status(TaskStatus.failed.value), 0, limit - 1
    )
    pipe = r.pipeline(transaction=False)
    for task_id in ids:
        pipe.hmget(
            k.task(task_id),
            "failure_kind",
            "error",
            "finished_at",
            "attempt",
            "max_attempts",
            "host_id",
            "device_id",
            "goal",
            "workflow",
        )
    out = []
    for task_id, f in zip(ids, pipe.execute(), strict=True):
        kind, error, finished, attempt, max_attempts, host_id, device_id, goal, wf = f
        out.append(
            {
                "task": task_id,
                "failure_kind": kind or None,
                "error": error or None,
                "finished_at": int(finished) if finished else None,
                "attempt": int(attempt or 0),
                "max_attempts": int(max_attempts or 0),
                "host_id": host_id or None,
                "device_id": device_id or None,
                "what": (f"workflow:{wf}" if wf else goal) or None,
            }
        )
    return out


def status_counts(admin: PoolAdmin) -> dict[str, int]:
    pipe = admin.redis.pipeline(transaction=False)
    for st in TaskStatus:
        pipe.zcard(admin.keys.status(st.value))
    return {st.value: int(n) for st, n in zip(TaskStatus, pipe.execute(), strict=True)}


def tenant_summary(admin: PoolAdmin, queues: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per tenant: weight, cap, devices held and tasks queued in its buckets (tasks without
    a tenant are not listed). Bounded by the buckets read and the tenants configured."""
    queued: dict[str, int] = {}
    for q in queues:
        if q["tenant"]:
            queued[q["tenant"]] = queued.get(q["tenant"], 0) + int(q["depth"] or 0)
    infos = {t.tenant: t for t in admin.tenants()}
    out = []
    for name in sorted(set(infos) | set(queued)):
        t = infos.get(name)
        out.append(
            {
                "tenant": name,
                "weight": t.weight if t else 1,
                "max_devices": t.max_devices if t else 0,
                "held": t.held if t else 0,
                "queued": queued.get(name, 0),
            }
        )
    return out


def pool_status(
    admin: PoolAdmin, *, leases: int = 10, failures: int = 10, max_queues: int = 1000
) -> dict[str, Any]:
    """Everything ``deviceq status`` shows, as plain data (its ``--json`` output)."""
    now = admin.server_time_ms()
    hosts, devices = hosts_and_devices(admin)
    queues = pool_queues(admin, devices, max_queues)
    return {
        "pool": admin.pool,
        "time_ms": now,
        "counts": status_counts(admin),
        "queues": queues,
        "unmatchable_tasks": sum(q["depth"] for q in queues if q["unmatchable"]),
        "tenants": tenant_summary(admin, queues),
        "devices": {"total": len(devices), "by_state": device_counts(devices)},
        "hosts": [host_json(h, now) for h in hosts],
        "reservations": [
            x.as_dict()
            for x in sorted(admin.reservations().values(), key=lambda x: x.reserved_until)
        ],
        "attention": [
            {"device_id": d.device_id, "host_id": d.host_id, "why": d.attention}
            for d, _ in devices
            if d.attention
        ],
        "leases": expiring_leases(admin, now, leases),
        "failures": recent_failures(admin, failures),
        "leader": leader(admin),
        "strategy": strategy_json(admin),
        "paused": admin.paused(),
        "redis": server_report(admin.redis),
        "durability": admin.config().durability,
    }


def pool_queues(
    admin: PoolAdmin,
    devices: list[tuple[PooledDevice, str]] | None = None,
    max_queues: int = 1000,
) -> list[dict[str, Any]]:
    """The queue buckets as ``status`` shows them: constraints, tenant, depth, oldest wait,
    matching and idle matching devices."""
    now = admin.server_time_ms()
    if devices is None:
        devices = hosts_and_devices(admin)[1]
    profiles = device_profiles(admin)
    idle_devices = [d for d, state in devices if state == "idle"]
    queues = []
    for b in buckets(admin, max_queues):
        c = b.constraints
        matching = sum(n for drv, tags, n in profiles if c.matches(drv, tags))
        idle = sum(1 for d in idle_devices if c.matches(d.driver_type, d.tags))
        queues.append(
            {
                "sig": b.sig,
                "driver_type": b.driver_type,
                "tags": sorted(b.tags),
                "priority": b.priority,
                "tenant": b.tenant,
                "depth": b.depth,
                "head_task": b.head_task,
                "oldest_wait_ms": now - b.head_submitted_at if b.head_submitted_at else None,
                "matching_devices": matching,
                "idle_matching": idle,
                "unmatchable": matching == 0,
            }
        )
    return queues
