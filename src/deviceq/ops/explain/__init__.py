"""``explain(task_id)``: why is a task not running (or where is it)?

For a queued task every registered device is judged by the placement pipeline's filter stage
for the task's constraints (`deviceq.scheduler.placement.recorder.judge` with the profiles'
filters, so explain and the scheduler agree on what could serve it), which gives:

* ``no_driver_type`` — no device of the task's driver type is registered (every device was
  rejected with ``driver_type_mismatch``);
* ``missing_tags`` — devices of that driver type exist but lack required tags (counted per
  tag: the filter's ``missing_tag:TAG`` reasons);
* the devices the filters accept, by what keeps them from this task, in this order of
  precedence (the one rule, ``deviceq.core.eligibility.REASONS``): ``quarantined``,
  ``host_dead`` (no heartbeat within ``host_timeout``), ``reserved`` (running or assigned
  another task), ``booked``, ``suspect`` (a lease on it expired) or ``held`` (its host refused
  an assignment) until its host's next heartbeat, ``checking`` (a health check runs on it) or
  ``unhealthy`` (its last health check failed), ``busy`` (the host reports it busy),
  ``offline``, ``host_draining``, ``host_suspect``, else ``idle`` (assignable);
* ``booked`` — reserved for a person (``deviceq reserve``): the reason says when the first of
  those reservations ends (``detail.reserved_until``, ms) and by whom; a task that could only
  run on reserved devices says so in its summary, with that time;
* with assignable devices: ``waiting_turn`` (older tasks are queued ahead) or ``no_scheduler``
  (no scheduler holds the leader lease) — the scheduler assigns at its next pass;
* its position among the tasks competing for its devices and a wait estimate (`estimate`).

While the pool is paused (``deviceq pause``) a queued task's first reason is
``pool_paused`` (since when and why) and its summary starts with it: nothing is assigned
until ``deviceq resume``, whatever the devices.

A queued multi-device task (roles) is explained role by role (`gang`), each role judged by
the same filters. Other states are explained from the task hash (`status`): a retry's
backoff, assigned (waiting for its host to claim it), dispatched (running on device D), or
finished (done / failed with its failure kind / cancelled)."""

from __future__ import annotations

import json
from typing import Any

from ...core.connection import PoolConnection
from ...core.errors import DeviceqError, NotFound
from ...core.fleet import read_parts
from ...core.models import ScheduledTask
from ...core.validation import validate_id
from ...core.vocabulary import TaskStatus
from .devices import BLOCKERS
from .gang import explain_gang
from .model import Explanation, Reason, at
from .single import explain_queued
from .status import explain_placed, explain_retry_wait

__all__ = ["BLOCKERS", "Explanation", "Reason", "explain"]


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
        exp = explain_retry_wait(admin, task)
    elif task.status is TaskStatus.queued and raw.get("roles"):
        exp = explain_gang(admin, task)
    elif task.status is TaskStatus.queued:
        exp = explain_queued(admin, task, raw)
    else:
        exp = explain_placed(admin, task)
    exp.constraints = cons
    if raw.get("pin"):
        exp.constraints["pin"] = raw["pin"]
        if task.status is TaskStatus.queued:
            _pinned(admin, exp, raw["pin"])
    if task.status is TaskStatus.queued:
        _paused(admin, exp)
    _suite(admin, exp, raw.get("idempotency_key") or "")
    return exp


def _suite(admin: PoolConnection, exp: Explanation, key: str) -> None:
    """Say which suite a shard's task belongs to (its idempotency key ``suite.ID.N[.r]``,
    `deviceq.suites.submission`), and the suite's status, last in ``exp``."""
    parts = key.split(".")
    if len(parts) not in (3, 4) or parts[0] != "suite" or not parts[2].isdigit():
        return
    try:
        suite_id = validate_id(parts[1], "suite id")
    except DeviceqError:
        return
    got = admin.redis.hmget(admin.keys.suite(suite_id), "name", "status")
    name, status = (None if v is None else str(v) for v in got)
    if status is None:
        return
    what = "a retry of the failed tests of shard" if len(parts) == 4 else "shard"
    text = (
        f"{what} {parts[2]} of suite {suite_id} ({name}, {status}): deviceq suite show {suite_id}"
    )
    exp.reasons.append(Reason("suite", text, 0, {"suite_id": suite_id}))


def _pinned(admin: PoolConnection, exp: Explanation, pin: str) -> None:
    """Put first in ``exp`` of a queued task pinned to device ``pin`` that it waits for that
    device alone (never runs elsewhere), and what that device is doing now."""
    raw = admin.redis.hmget(admin.keys.device(pin), "state", "reserved_by", "quarantined")
    state, task, quarantined = (None if v is None else str(v) for v in raw)
    if state is None:
        now = "it is not registered (removed, or not seen yet)"
    elif task:
        now = f"it runs task {task}"
    elif quarantined == "1":
        now = "it is quarantined"
    else:
        now = f"it is {state}"
    text = f"pinned to device {pin}: it runs there only and waits for it; {now}"
    exp.reasons.insert(0, Reason("pinned", text, 0, {"device_id": pin}))
    exp.summary = f"pinned to device {pin} ({now}); " + exp.summary


def _paused(admin: PoolConnection, exp: Explanation) -> None:
    """Put the pool's pause first in ``exp`` of a queued task when the pool is paused."""
    raw = admin.redis.get(admin.keys.paused)
    if raw is None:
        return
    try:
        info = json.loads(raw)
    except ValueError:
        info = {}
    since, why = info.get("at"), str(info.get("reason") or "")
    text = "the pool is paused" + (f" since {at(int(since))}" if since else "")
    text += (f" ({why})" if why else "") + ": nothing new is assigned until `deviceq resume`"
    exp.reasons.insert(0, Reason("pool_paused", text, 0, {"at": since, "reason": why}))
    exp.summary = "the pool is paused" + (f" ({why})" if why else "") + "; then: " + exp.summary
