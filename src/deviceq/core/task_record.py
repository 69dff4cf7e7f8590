"""A task as stored (its hash ``task:ID``, the long goal in ``task:ID:goal``, its attempt
records in ``task:ID:attempts``) read into plain JSON values, without pydantic: the one
reading of those keys. `ScheduledTask.from_hash` types these values (enums, tuples, models);
``deviceq task show`` prints them as they are, so that it starts without building the models
(``tests/cli/test_task_show_plain.py`` checks both give the same JSON)."""

from __future__ import annotations

import json
from typing import Any

import redis

from .keys import Keys
from .where import decompile

ATTEMPT_DEFAULTS: dict[str, Any] = {
    "attempt": 0,
    "lease_id": "",
    "host_id": "",
    "device_id": "",
    "assigned_at": 0,
    "dispatched_at": None,
    "ended_at": None,
    "outcome": "active",
    "failure_kind": None,
    "error": None,
    "expired_in": None,
    "retry": None,
    "eligible_at": None,
    "preempted_by": None,
}
"""The fields of an attempt record, in order, with the value of one a record leaves out
(`Attempt` has the same fields and defaults; the first five are in every record)."""


def with_goal(h: dict[str, str], goal: str | None) -> dict[str, str]:
    """The hash with its goal: goals over 64 bytes live in ``task:ID:goal`` so that the task
    hash stays a compact listpack."""
    if goal is not None and not h.get("goal"):
        h["goal"] = goal
    return h


def read_task(
    r: redis.Redis, keys: Keys, task_id: str, *, attempts: bool = True
) -> tuple[dict[str, str], list[str] | None] | None:
    """A task's hash (with its goal) and attempt records in one round trip; None when there
    is no such task. ``task_id`` must be validated already."""
    pipe = r.pipeline(transaction=False)
    pipe.hgetall(keys.task(task_id))
    pipe.get(keys.goal(task_id))
    if attempts:
        pipe.lrange(keys.attempts(task_id), 0, -1)
    res = pipe.execute()
    if not res[0]:
        return None
    return with_goal(res[0], res[1]), (res[2] if attempts else None)


def _opt_int(v: Any) -> int | None:
    return None if v in (None, "") else int(v)


def _csv(v: str | None) -> list[str]:
    return [x for x in (v or "").split(",") if x]


def is_multi_device(h: dict[str, str]) -> bool:
    """A multi-device task's hash (its roles, or the placement of each, are in it)."""
    return bool(h.get("roles") or h.get("peers"))


def progress_value(h: dict[str, str]) -> dict[str, Any] | None:
    """The task's progress ``{"fraction", "text", "at"}`` as its current (or, once finished,
    last) attempt's runner said it (``lua/progress.lua``); None when that attempt said
    nothing: the fields of an earlier attempt (another lease) do not count."""
    lease = h.get("lease_id")
    if not lease or h.get("progress_lease") != lease or not h.get("progress"):
        return None
    try:
        fraction = float(h["progress"])
    except ValueError:
        return None
    return {
        "fraction": fraction,
        "text": h.get("progress_text") or "",
        "at": _opt_int(h.get("progress_at")),
    }


def task_values(h: dict[str, str]) -> dict[str, Any]:
    """The task's fields as JSON values, in `ScheduledTask`'s order: enums as their strings,
    lists for tuples; ``roles`` None and ``attempts`` empty (see `task_json`). (A text field
    stored empty reads as None: ``g(name) or None``.)"""
    g = h.get
    return {
        "id": h["id"],
        "status": h["status"],
        "kind": g("kind", "goal"),
        "goal": g("goal") or None,
        "workflow": g("workflow") or None,
        "driver_type": g("driver_type") or None,
        "tags": _csv(g("tags")),
        "priority": int(g("priority") or 0),
        "attempt": int(g("attempt") or 0),
        "max_attempts": int(g("max_attempts") or 1),
        "host_id": g("host_id") or None,
        "device_id": g("device_id") or None,
        "lease_id": g("lease_id") or None,
        "lease_expires_at": _opt_int(g("lease_expires_at")),
        "failure_kind": g("failure_kind") or None,
        "error": g("error") or None,
        "result": g("result") or None,
        "cancel_requested": g("cancel_requested") == "1",
        "handbacks": int(g("handbacks") or 0),
        "session": g("session") or None,
        "avoid_devices": _csv(g("avoid_devices")),
        "avoid_hosts": _csv(g("avoid_hosts")),
        "idempotency_key": g("idempotency_key") or None,
        "queue_deadline": _opt_int(g("queue_deadline")),
        "timeout": float(h["timeout"]) if g("timeout") else None,
        "retry_on": g("retry_on") or None,
        "retry_backoff": g("retry_backoff") or None,
        "eligible_at": _opt_int(g("eligible_at")),
        "tenant": g("tenant") or None,
        "priority_class": g("class") or None,
        "preempted_by": g("preempted_by") or g("preempt_by") or None,
        "preemptions": int(g("preemptions") or 0),
        "preempting": (g("preempting_task") or None) if g("preempting") else None,
        "retry_of": g("retry_of") or None,
        "rerun_by": g("rerun_by") or None,
        "submitted_by": g("submitted_by") or None,
        "progress": progress_value(h),
        "traceparent": g("traceparent") or None,
        "where": [str(c) for c in decompile(g("where") or "")],
        "roles": None,
        "gang": g("gang") or None,
        "role": g("role") or None,
        "leader": g("leader") == "1",
        "seq": int(g("seq") or 0),
        "submitted_at": int(g("submitted_at") or 0),
        "updated_at": int(g("updated_at") or 0),
        "assigned_at": _opt_int(g("assigned_at")),
        "dispatched_at": _opt_int(g("dispatched_at")),
        "finished_at": _opt_int(g("finished_at")),
        "attempts": [],
    }


def attempt_values(raw: list[str] | None, dispatched_at: int | None) -> list[dict[str, Any]]:
    """The attempt records as JSON values (every field of `ATTEMPT_DEFAULTS`, in order). The
    claim does not rewrite the attempt record: the live attempt's dispatch time is the
    task's."""
    out = []
    for rec in raw or []:
        stored = json.loads(rec)
        out.append({name: stored.get(name, d) for name, d in ATTEMPT_DEFAULTS.items()})
    if out and out[-1]["outcome"] == "active" and out[-1]["dispatched_at"] is None:
        out[-1]["dispatched_at"] = dispatched_at
    return out


def task_json(h: dict[str, str], attempts: list[str] | None) -> dict[str, Any] | None:
    """What ``deviceq task show --json`` prints for a single-device task (or a part of a
    multi-device one); None for a multi-device task, whose roles and parts need the models
    (``Client.get``)."""
    if is_multi_device(h):
        return None
    values = task_values(h)
    values["attempts"] = attempt_values(attempts, values["dispatched_at"])
    return values
