"""A task as stored (its hash ``task:ID``, the long goal in ``task:ID:goal``, its attempt
records in ``task:ID:attempts``) read into plain JSON values, without pydantic: the one
reading of those keys. `ScheduledTask.from_hash` types these values (enums, tuples, models);
``deviceq task show`` prints them as they are, so that it starts without building the models
(``tests/cli/test_task_show_plain.py`` checks both give the same JSON)."""

from __future__ import annotations

import json
from collections.abc import Callable
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


def _text(v: str) -> str | None:
    return v or None


def _int(v: str) -> int:
    return int(v or 0)


def _int1(v: str) -> int:
    return int(v or 1)


def _flag(v: str) -> bool:
    return v == "1"


def _seconds(v: str) -> float | None:
    return float(v) if v else None


def _same(v: str) -> str:
    return v


_EMPTY: dict[str, Any] = {
    "id": None, "status": None, "kind": "goal", "goal": None, "workflow": None,
    "driver_type": None, "tags": None, "priority": 0, "attempt": 0, "max_attempts": 1,
    "host_id": None, "device_id": None, "lease_id": None, "lease_expires_at": None,
    "failure_kind": None, "error": None, "result": None, "cancel_requested": False,
    "handbacks": 0, "session": None, "avoid_devices": None, "avoid_hosts": None,
    "idempotency_key": None, "queue_deadline": None, "timeout": None, "retry_on": None,
    "retry_backoff": None, "eligible_at": None, "tenant": None, "priority_class": None,
    "preempted_by": None, "preemptions": 0, "preempting": None, "retry_of": None,
    "rerun_by": None, "submitted_by": None, "progress": None, "traceparent": None,
    "where": None, "roles": None, "gang": None, "role": None, "leader": False, "seq": 0,
    "submitted_at": 0, "updated_at": 0, "assigned_at": None, "dispatched_at": None,
    "finished_at": None, "attempts": None,
}  # fmt: skip
"""`task_values` of a hash without any of its fields, in `ScheduledTask`'s order (the lists,
None here, are made per call)."""

_FIELDS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "kind": ("kind", _same), "goal": ("goal", _text), "workflow": ("workflow", _text),
    "driver_type": ("driver_type", _text), "tags": ("tags", _csv),
    "priority": ("priority", _int), "attempt": ("attempt", _int),
    "max_attempts": ("max_attempts", _int1), "host_id": ("host_id", _text),
    "device_id": ("device_id", _text), "lease_id": ("lease_id", _text),
    "lease_expires_at": ("lease_expires_at", _opt_int),
    "failure_kind": ("failure_kind", _text), "error": ("error", _text),
    "result": ("result", _text), "cancel_requested": ("cancel_requested", _flag),
    "handbacks": ("handbacks", _int), "session": ("session", _text),
    "avoid_devices": ("avoid_devices", _csv), "avoid_hosts": ("avoid_hosts", _csv),
    "idempotency_key": ("idempotency_key", _text),
    "queue_deadline": ("queue_deadline", _opt_int), "timeout": ("timeout", _seconds),
    "retry_on": ("retry_on", _text), "retry_backoff": ("retry_backoff", _text),
    "eligible_at": ("eligible_at", _opt_int), "tenant": ("tenant", _text),
    "class": ("priority_class", _text), "preemptions": ("preemptions", _int),
    "retry_of": ("retry_of", _text), "rerun_by": ("rerun_by", _text),
    "submitted_by": ("submitted_by", _text), "traceparent": ("traceparent", _text),
    "gang": ("gang", _text), "role": ("role", _text), "leader": ("leader", _flag),
    "seq": ("seq", _int), "submitted_at": ("submitted_at", _int),
    "updated_at": ("updated_at", _int), "assigned_at": ("assigned_at", _opt_int),
    "dispatched_at": ("dispatched_at", _opt_int), "finished_at": ("finished_at", _opt_int),
}  # fmt: skip
"""The hash's fields read one each: field -> (value's name, its reading of the stored text).
The values read from several fields (``preempted_by``, ``preempting``, ``progress``,
``where``) are `task_values`' own."""


def task_values(h: dict[str, str]) -> dict[str, Any]:
    """The task's fields as JSON values, in `ScheduledTask`'s order: enums as their strings,
    lists for tuples; ``roles`` None and ``attempts`` empty (see `task_json`). (A text field
    stored empty reads as None.) Only the fields the hash holds are read (`_FIELDS`): the
    others keep their value for a missing field (`_EMPTY`)."""
    out = dict(_EMPTY)
    out["id"], out["status"] = h["id"], h["status"]
    out["tags"], out["avoid_devices"], out["avoid_hosts"] = [], [], []
    out["where"], out["attempts"] = [], []
    fields = _FIELDS
    for name, value in h.items():
        f = fields.get(name)
        if f is not None:
            out[f[0]] = f[1](value)
    g = h.get
    out["preempted_by"] = g("preempted_by") or g("preempt_by") or None
    if g("preempting"):
        out["preempting"] = g("preempting_task") or None
    if g("progress"):
        out["progress"] = progress_value(h)
    where = g("where")
    if where:
        out["where"] = [str(c) for c in decompile(where)]
    return out


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
