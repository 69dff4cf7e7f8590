"""The fleet as operators and the scheduler's explanations see it, read from Redis: every host
with its liveness (the one rule, `liveness`), every device, and one word for what a device can
do now (`effective_state`) with the reason in words (`device_reason`); and where a
multi-device task's parts are (`read_parts`); devices' attributes (`read_attributes`)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import redis

from . import eligibility
from .attributes import Value, decode_hash
from .connection import PoolConnection
from .gates import cooling_reason
from .keys import Keys
from .liveness import host_alive
from .models import Host, PooledDevice, ScheduledTask
from .vocabulary import LEASED_STATUSES


def read_hosts(conn: PoolConnection) -> list[Host]:
    """Every host of the pool (sorted by id): heartbeat, liveness, flags, session, devices."""
    r, k = conn.redis, conn.keys
    ids = sorted(str(h) for h in r.smembers(k.hosts))
    now = conn.server_time_ms()
    timeout_ms = conn.config().host_timeout * 1000
    pipe = r.pipeline(transaction=False)
    for h in ids:
        pipe.hmget(k.host(h), "last_heartbeat", "draining", "stopping", "suspect", "session",
                   "session_owner")  # fmt: skip
        pipe.smembers(k.host_devices(h))
    res = pipe.execute()
    out = []
    for i, h in enumerate(ids):
        hb, draining, stopping, suspect, session, owner = res[2 * i]
        hb_ms = int(hb or 0)
        out.append(
            Host(
                host_id=h,
                last_heartbeat=hb_ms,
                draining=draining == "1",
                stopping=stopping == "1",
                suspect=bool(suspect),
                alive=host_alive(hb_ms, now, timeout_ms),
                session=session or None,
                session_owner=owner or None,
                devices=sorted(res[2 * i + 1]),
            )
        )
    return out


def read_devices(conn: PoolConnection) -> list[PooledDevice]:
    """Every device of the pool (sorted by id)."""
    r, k = conn.redis, conn.keys
    ids = sorted(str(d) for d in r.smembers(k.devices))
    pipe = r.pipeline(transaction=False)
    for d in ids:
        pipe.hgetall(k.device(d))
    return [PooledDevice.from_hash(h) for h in pipe.execute() if h]


DEVICE_STATES = eligibility.STATES
"""Effective device states, in the order ``status`` shows them (`deviceq.core.eligibility`)."""


def effective_state(device: PooledDevice, host: Host | None) -> str:
    """One word for what a device can do now (see ``DEVICE_STATES``): the first reason of the
    one rule (`deviceq.core.eligibility.verdict`), or ``idle``."""
    return eligibility.verdict(device, host).state


def device_reason(d: PooledDevice, state: str) -> str | None:
    """Why a device is not an idle candidate (or needs attention), in words."""
    if state == "quarantined":
        return d.quarantine_reason or "quarantined"
    if state == "suspect":
        if d.held != "suspect":
            return "a lease of its host expired; back at the host's next heartbeat"
        return "a lease on it expired; back at its host's next heartbeat"
    if state == "held":
        return "its host handed an assignment back; back at the host's next heartbeat"
    if state == "checking":
        return "its host's health check is running or due" + (
            f" (last failure: {d.health_reason})" if d.health_reason else ""
        )
    if state == "unhealthy":
        return d.health_reason or "health check failed"
    if state == "gated":
        # (a cooldown's time left, by this clock: display only)
        why = cooling_reason(d.gated_reason, d.cool_until, int(time.time() * 1000))
        return f"gated ({d.gated}: {why})" if why else f"gated ({d.gated})"
    if d.attention:
        return d.attention
    if state in ("busy", "offline"):
        return d.reason
    return None


def read_parts(conn: PoolConnection, task: ScheduledTask) -> None:
    """Fill in how each role of multi-device ``task`` is doing, from its part tasks
    ``ID.ROLE`` (one round trip): each role's ``status``, and while a part holds a lease its
    device and host (otherwise the roles keep the last placement)."""
    if not task.roles:
        return
    pipe = conn.redis.pipeline(transaction=False)
    for name in task.roles:
        pipe.hmget(conn.keys.task(f"{task.id}.{name}"), "status", "device_id", "host_id")
    for role, (status, device, host) in zip(task.roles.values(), pipe.execute(), strict=True):
        role.__dict__.update(status=status or None)
        if status in LEASED_STATUSES:
            role.__dict__.update(device_id=device or None, host_id=host or None)


def operator_attributes(conn: PoolConnection, device_id: str) -> set[str]:
    """The names of ``device_id``'s attributes an operator set (``device set-attr``): their
    values win over what its host reports until unset (``lua/lib/attrs.lua``)."""
    raw = conn.redis.hget(conn.keys.device(device_id), "attrs_op") or ""
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    return {n for n in text.split(",") if n}


def unknown_attributes(r: Any, keys: Keys, names: Iterable[str]) -> list[str]:
    """One line per attribute name no registered device has (likely a typo: ``no device has
    attribute 'sdkk' (known: model, sdk)``), read from the ``attr_names`` hash (one HKEYS);
    none when it cannot be read (an ACL user without it)."""
    wanted = set(names)
    if not wanted:
        return []
    try:
        known = {str(k) for k in r.hkeys(keys.attr_names)}
    except redis.ResponseError:
        return []
    shown = ", ".join(sorted(known)[:20]) or "none"
    return [f"no device has attribute {n!r} (known: {shown})" for n in sorted(wanted - known)]


def where_keys(texts: Iterable[str]) -> set[str]:
    """The attribute names ``--where`` expressions name (a malformed one names none)."""
    from .errors import InvalidInput
    from .where import parse

    out = set()
    for t in texts:
        try:
            out.add(parse(t).key)
        except InvalidInput:
            continue
    return out


def read_attributes(
    conn: PoolConnection, device_ids: list[str], with_times: bool = False
) -> dict[str, tuple[dict[str, Value], dict[str, int]]]:
    """The attributes of ``device_ids`` (one pipelined round trip): device id -> (values,
    when each was last reported in ms; the times only ``with_times``)."""
    r, k = conn.redis, conn.keys
    pipe = r.pipeline(transaction=False)
    for d in device_ids:
        pipe.hgetall(k.device_attrs(d))
        if with_times:
            pipe.hgetall(k.device_attrs_at(d))
    res = pipe.execute()
    step = 2 if with_times else 1
    out: dict[str, tuple[dict[str, Value], dict[str, int]]] = {}
    for i, d in enumerate(device_ids):
        at = res[i * step + 1] if with_times else {}
        times = {str(a): int(b) for a, b in at.items() if str(b).isdigit()}
        out[d] = (decode_hash(res[i * step]), times)
    return out
