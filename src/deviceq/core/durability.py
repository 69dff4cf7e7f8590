"""Durable mode: the pool setting ``durability`` (``none`` | ``aof`` | ``replica``) after which
a submission and a host's report are confirmed durable before the call returns, and the
server checks every process makes at start.

- ``none`` (default): a call returns when Redis applied it; with AOF ``everysec`` a crash of
  Redis can lose the last second of writes, and an asynchronous replica promoted after a
  failover can lose what it had not received yet.
- ``aof``: the write must be fsynced to the primary's AOF: ``WAITAOF 1 0`` where the server
  has it (Redis >= 7.2); on an older server ``WAIT 1`` for a replica instead.
- ``replica``: at least one replica must have acknowledged the write (``WAIT 1``; with
  ``WAITAOF 0 1`` on Redis >= 7.2: fsynced to a replica's AOF).

The wait runs on the same connection as the write (one pipeline), bounded by
``durability_timeout``. When it is not confirmed in time the call raises `NotConfirmed`: the
write was applied but may be lost if Redis crashes now; the caller decides (a producer can
resubmit with the same idempotency key; a host keeps the report and sends it again, which is
answered ``dup:`` once it is in)."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import redis
from redis.exceptions import NoScriptError

from .errors import NotConfirmed, from_reply
from .scripts import sha, source

if TYPE_CHECKING:
    from .connection import PoolConnection

LOG = logging.getLogger("deviceq")
MODES = ("none", "aof", "replica")
_SETTING_TTL = 1.0  # seconds a connection keeps the pool's durability setting


def _waitaof_supported(conn: PoolConnection) -> bool:
    cached = getattr(conn, "_dq_waitaof", None)
    if cached is None:
        try:
            version = str(conn.redis.info("server").get("redis_version", "0"))
            major, minor = (int(x) for x in version.split(".")[:2])
            cached = (major, minor) >= (7, 2)  # WAITAOF arrived in Redis 7.2
        except (redis.ResponseError, ValueError):
            cached = False
        conn._dq_waitaof = cached  # type: ignore[attr-defined]
    return bool(cached)


def mode_of(conn: PoolConnection) -> tuple[str, float]:
    """The pool's ``durability`` and ``durability_timeout`` (cached for a second)."""
    now = time.monotonic()
    cached = getattr(conn, "_dq_durability", None)
    if cached is None or now - cached[2] > _SETTING_TTL:
        raw = conn.redis.hmget(conn.keys.config, "durability", "durability_timeout")
        mode = str(raw[0]) if raw[0] in MODES else "none"
        try:
            timeout = min(60.0, max(0.01, float(raw[1]))) if raw[1] else 1.0
        except ValueError:
            timeout = 1.0
        cached = (mode, timeout, now)
        conn._dq_durability = cached  # type: ignore[attr-defined]
    return cached[0], cached[1]


def wait_command(conn: PoolConnection, mode: str, timeout_s: float) -> list[Any]:
    """The command that confirms ``mode`` for the writes of this connection."""
    ms = str(max(1, int(timeout_s * 1000)))
    if _waitaof_supported(conn):
        return ["WAITAOF", "1", "0", ms] if mode == "aof" else ["WAITAOF", "0", "1", ms]
    return ["WAIT", "1", ms]


def confirmed(mode: str, reply: Any, waitaof: bool) -> bool:
    if waitaof:
        local, replicas = int(reply[0]), int(reply[1])
        return local >= 1 if mode == "aof" else replicas >= 1
    return int(reply) >= 1


def run_durably(conn: PoolConnection, name: str, args: list[Any]) -> Any:
    """Run script ``name`` and, when the pool's durability asks for it, confirm the write on
    the same connection. Raises the script's typed error, or NotConfirmed (carrying the
    script's answer as ``.result``) when the write could not be confirmed in time."""
    mode, timeout = mode_of(conn)
    if mode == "none":
        return conn._run(name, args)
    wait = wait_command(conn, mode, timeout)
    pipe = conn.redis.pipeline(transaction=False)
    pipe.evalsha(sha(name), 1, conn.keys.prefix, *args)
    pipe.execute_command(*wait)
    result, ack = pipe.execute(raise_on_error=False)
    if isinstance(result, NoScriptError):  # a restarted server: send the body (it is cached)
        pipe = conn.redis.pipeline(transaction=False)
        pipe.eval(source(name), 1, conn.keys.prefix, *args)
        pipe.execute_command(*wait)
        result, ack = pipe.execute(raise_on_error=False)
    if isinstance(result, Exception):
        typed = from_reply(str(result)) if isinstance(result, redis.ResponseError) else None
        raise typed or result
    if isinstance(ack, Exception) or not confirmed(mode, ack, _waitaof_supported(conn)):
        raise NotConfirmed(
            f"{name}: applied, but durability={mode} not confirmed within {timeout:g}s "
            f"({'no answer' if isinstance(ack, Exception) else f'acknowledged {ack}'})",
            result,
        )
    return result


def server_report(r: redis.Redis) -> dict[str, Any]:
    """The persistence settings in force on the server (from INFO: needs no CONFIG)."""
    out: dict[str, Any] = {}
    try:
        info = r.info()
    except redis.RedisError as exc:
        return {"error": str(exc)}
    out["redis_version"] = info.get("redis_version")
    out["maxmemory_policy"] = info.get("maxmemory_policy")
    out["aof_enabled"] = bool(info.get("aof_enabled"))
    out["rdb_changes_since_last_save"] = info.get("rdb_changes_since_last_save")
    out["role"] = info.get("role")
    out["connected_replicas"] = info.get("connected_slaves", 0)
    return out


def warn_if_unsafe(r: redis.Redis, what: str, log: logging.Logger | None = LOG) -> str | None:
    """At a process's start: warn loudly unless ``maxmemory-policy`` is ``noeviction`` (an
    evicted key would be a lost task). Returns the warning, or None."""
    try:
        policy = r.info("memory").get("maxmemory_policy")
    except redis.RedisError:
        return None
    if policy and policy != "noeviction":
        msg = (
            f"WARNING: Redis maxmemory-policy is {policy!r}, not 'noeviction': under memory "
            f"pressure Redis may evict deviceq's keys and tasks would be lost ({what})"
        )
        if log is not None:
            log.warning(msg)
        return msg
    return None
