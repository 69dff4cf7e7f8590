"""``explain`` for a task not waiting in its bucket: waiting out its retry backoff, assigned
(waiting for its host to claim it), running, or finished; for a running or assigned task its
host's state (the one liveness rule)."""

from __future__ import annotations

from ...core import liveness
from ...core.connection import PoolConnection
from ...core.models import Attempt, ScheduledTask
from ...core.vocabulary import TaskStatus
from .model import Explanation, Reason, at, secs


def explain_retry_wait(admin: PoolConnection, task: ScheduledTask) -> Explanation:
    """A queued task waiting in ``retries`` (not yet in its bucket): out its retry backoff
    after a failed attempt, or, never run, until its ``not_before`` (delayed)."""
    now = admin.server_time_ms()
    left = max(0.0, ((task.eligible_at or now) - now) / 1000)
    raw_last = admin.redis.lindex(admin.keys.attempts(task.id), -1)
    last = Attempt.model_validate_json(raw_last) if raw_last else None
    if last is None or task.attempt == 0:  # never ran: delayed (not_before), not a retry
        until = at(task.eligible_at or now)
        return Explanation(
            task.id,
            task.status.value,
            f"delayed until {until} ({left:.1f}s from now): it is not assigned before then",
            [
                Reason(
                    "not_before",
                    f"submitted to run no earlier than {until}",
                    detail={"eligible_at": task.eligible_at, "seconds_left": round(left, 3)},
                )
            ],
        )
    why = f"attempt {task.attempt} failed ({last.failure_kind})" if last else "it failed"
    summary = (
        f"{why}; it is retried in {left:.1f}s, once its retry backoff has passed "
        f"(attempt {task.attempt + 1} of {task.max_attempts})"
    )
    reasons = [
        Reason(
            "retry_backoff",
            f"waiting out its retry backoff until {at(task.eligible_at or now)}"
            + (f": {last.retry}" if last and last.retry else ""),
            detail={"eligible_at": task.eligible_at, "seconds_left": round(left, 3)},
        )
    ]
    if task.avoid_devices:
        reasons.append(
            Reason("anti_affinity", "it prefers other devices than " + ",".join(task.avoid_devices))
        )
    return Explanation(task.id, task.status.value, summary, reasons)


def explain_placed(admin: PoolConnection, task: ScheduledTask) -> Explanation:
    """An assigned, running or finished task (a multi-device one role by role)."""
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
        left = secs(task.lease_expires_at, now)
        summary = f"assigned to {where} ({tries}); waiting for the host to claim it"
        reasons.append(
            Reason(
                "awaiting_claim",
                f"the claim window ends in {left}",
                0,
                {"device_id": task.device_id, "host_id": task.host_id},
            )
        )
        reasons += host_state(admin, task.host_id, now)
    elif task.status is TaskStatus.dispatched:
        left = secs(task.lease_expires_at, now)
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
        reasons += host_state(admin, task.host_id, now)
    else:
        kind = f" ({task.failure_kind.value})" if task.failure_kind else ""
        summary = f"it finished: {task.status.value}{kind} after {task.attempt} attempt(s)"
        if task.error and task.status is not TaskStatus.done:
            reasons.append(Reason("error", task.error[:500]))
        if task.device_id:
            reasons.append(Reason("last_device", f"last ran on {where}"))
    return Explanation(task.id, task.status.value, summary, reasons)


def host_state(admin: PoolConnection, host_id: str | None, now: int) -> list[Reason]:
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
