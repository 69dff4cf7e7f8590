"""A short path for the hot calls: a command sent on a connection kept for it, and its reply
read, with none of the per-command machinery of a redis-py client in between (the pool's
checkout and its liveness poll, the retry wrapper, the redirect follower, the observability
hooks, the response callbacks). On this project's 2-core machine a script call through the
client costs about 110 µs of the caller's CPU, of which a raw socket round trip is 40.

The short path is only ever an attempt. A reply, error replies included, is what the client
would have returned or raised (the same connection class and parser make it). Anything else (a
dropped or refused connection, a timeout, ``LOADING``) closes the connection and sends the
command again through the client, which rides out outages and raises exactly what it raised
before; sending again is what the client's own retry does on a dropped connection too. (The
error replies the client's path acts on, ``MOVED`` and the failover ones, come only from a
cluster or from behind Sentinel, where no lane is used.)

A lane exists only for a plain client on a standalone server (`redis.Redis` or
`deviceq.core.redirects.FollowingRedis` on a plain ``ConnectionPool``, once the latter knows it
is not on a cluster): Sentinel, Redis Cluster, fakeredis and custom clients keep the client's
path for everything. Connections are checked out one per thread at a time (a few per process:
as many as calls run at once) and made like the pool's own (its class and settings: TLS,
password, timeouts, the health check of a connection idle for a while); one pointed elsewhere
or made before a fork is dropped instead of reused.

A command is packed by hiredis's C packer where the connection encodes as it does (UTF-8,
strict): redis-py's packer encodes every argument in Python first, about 45 µs for a report
of five tasks (33 arguments) against 5.5 µs. An argument it refuses (``None``, a bool: not a
str, int, float or bytes) goes through redis-py's packer, which raises what it always did."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.connection import AbstractConnection, ConnectionPool
from redis.exceptions import NoScriptError

from .redirects import FollowingRedis

_hiredis_pack: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - redis[hiredis] is a dependency
    _hiredis_pack = None

MAX_IDLE = 8
"""Connections kept for reuse at most (more run at once only while calls overlap)."""


class Lane:
    """Connections of one client's pool for `call`; see the module docstring."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.pool: ConnectionPool = client.connection_pool
        self._idle: list[AbstractConnection] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self.fallbacks = 0  # calls sent again through the client (diagnostics, tests)
        kw = self.pool.connection_kwargs
        self._c_pack = (
            _hiredis_pack is not None
            and kw.get("encoding", "utf-8").lower().replace("_", "-") in ("utf-8", "utf8")
            and kw.get("encoding_errors", "strict") == "strict"
        )

    def _pack(self, conn: AbstractConnection, args: tuple[Any, ...]) -> bytes:
        """One command as the bytes redis-py would send for it (see the module docstring)."""
        if self._c_pack and _hiredis_pack is not None:
            try:
                return _hiredis_pack(args)
            except TypeError:
                pass
        return b"".join(conn.pack_command(*args))

    def _packed(self, conn: AbstractConnection, commands: Sequence[tuple[Any, ...]]) -> bytes:
        """``commands`` packed for ``conn``; arguments no client could send (``None``, a
        bool) raise as the client raises them, and nothing is sent."""
        try:
            return b"".join(self._pack(conn, c) for c in commands)
        except BaseException:
            self._checkin(conn)
            raise

    def _where(self) -> tuple[Any, Any]:
        kw = self.pool.connection_kwargs
        return kw.get("host"), kw.get("port")

    def _checkout(self) -> AbstractConnection:
        if os.getpid() != self._pid:  # a forked child: never share the parent's sockets
            with self._lock:
                self._idle, self._pid = [], os.getpid()
        while True:
            with self._lock:
                if not self._idle:
                    break
                conn = self._idle.pop()
            if getattr(conn, "_dq_where", None) == self._where():
                return conn  # (idle past its health-check interval: it PINGs first)
            conn.disconnect()
        conn = self.pool.connection_class(**self.pool.connection_kwargs)
        conn._dq_where = self._where()
        return conn

    def _checkin(self, conn: AbstractConnection) -> None:
        with self._lock:
            if len(self._idle) < MAX_IDLE and os.getpid() == self._pid:
                self._idle.append(conn)
                return
        conn.disconnect()

    def call(self, *args: Any) -> Any:
        """Send one command and return its raw reply (no response callback). An error reply
        is raised as the client raises it (the same parser makes it: `redis.ResponseError`,
        `NoScriptError`, ... with its text untouched); a connection that fails, times out or
        answers ``LOADING`` sends the command again through the client instead."""
        conn = self._checkout()
        packed = self._packed(conn, [args])
        try:
            conn.send_packed_command([packed])
            reply = conn.read_response()
        except redis.ResponseError:
            self._checkin(conn)  # an error reply: the connection is fine
            raise
        except Exception:  # noqa: BLE001 - the client's path rides it out or raises it
            conn.disconnect()
            self.fallbacks += 1
            return self.client.execute_command(*args)
        except BaseException:
            conn.disconnect()
            raise
        self._checkin(conn)
        return reply

    def call_many(self, *commands: tuple[Any, ...]) -> list[Any]:
        """Send ``commands`` in one write and read their replies in order: one round trip.
        The server runs them in order, so a command after a blocking one (``BLPOP``) runs as
        soon as the wait ends. An error reply comes back in its place as the exception the
        client would raise; a connection that fails sends the commands again, one by one,
        through the client (with the same error replies in place)."""
        out = self._exchange(commands)
        if out is None:
            out = []
            for command in commands:
                try:
                    out.append(self.client.execute_command(*command))
                except redis.ResponseError as exc:
                    out.append(exc)
        return out

    def pipeline(
        self, commands: Sequence[tuple[Any, ...]], raise_on_error: bool = True
    ) -> list[Any]:
        """What a pipeline of the client (``transaction=False``) answers for ``commands``:
        their replies in order, each through the client's response callback for its command
        (an ``HGETALL`` a dict, ``TIME`` a pair of ints); the first error reply raised
        (``raise_on_error``), else left in its place. A connection that fails sends them
        again through such a pipeline."""
        replies = self._exchange(commands)
        if replies is None:
            pipe = self.client.pipeline(transaction=False)
            for c in commands:
                pipe.execute_command(*c)
            return pipe.execute(raise_on_error=raise_on_error)
        callbacks = self.client.response_callbacks
        out = []
        for c, r in zip(commands, replies, strict=True):
            if isinstance(r, redis.ResponseError):
                if raise_on_error:
                    raise r
                out.append(r)
                continue
            cb = callbacks.get(c[0])
            out.append(r if cb is None else cb(r))
        return out

    def _exchange(self, commands: Sequence[tuple[Any, ...]]) -> list[Any] | None:
        """Send ``commands`` in one write and read their raw replies (error replies as
        exceptions in place); None when the connection failed (it is closed)."""
        conn = self._checkout()
        packed = self._packed(conn, commands)
        out: list[Any] = []
        try:
            conn.send_packed_command([packed])
            for _ in commands:
                try:
                    out.append(conn.read_response())
                except redis.ResponseError as exc:
                    out.append(exc)
        except Exception:  # noqa: BLE001 - the client's path rides it out or raises it
            conn.disconnect()
            self.fallbacks += 1
            return None
        except BaseException:
            conn.disconnect()
            raise
        self._checkin(conn)
        return out

    def evalsha(self, sha: str, body: str, *args: Any) -> Any:
        """``EVALSHA`` of ``sha``, or ``EVAL`` of ``body`` when the server does not have it."""
        try:
            return self.call("EVALSHA", sha, *args)
        except NoScriptError:
            return self.call("EVAL", body, *args)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.disconnect()


def lane_of(client: Any) -> Lane | None:
    """The lane of ``client`` (made on first use), or None when it must keep the client's
    path (see the module docstring)."""
    lane = getattr(client, "_dq_lane", None)
    if lane is not None:
        return lane if lane.pool is client.connection_pool else None
    if type(client) not in (redis.Redis, FollowingRedis):
        return None
    if type(client.connection_pool) is not ConnectionPool:
        return None
    if isinstance(client, FollowingRedis):
        topo = client.topology
        if topo.sentinel or topo.cluster is not False:  # (None: its first command will tell)
            return None
    lane = Lane(client)
    client._dq_lane = lane
    return lane


class Batch:
    """Commands queued as on a redis-py pipeline (``transaction=False``) and sent in one round
    trip through a lane (`Lane.pipeline`): the few read commands the scheduler's passes
    queue, by the same names and arguments, answering what the pipeline answers."""

    def __init__(self, lane: Lane) -> None:
        self.lane = lane
        self.commands: list[tuple[Any, ...]] = []

    def execute_command(self, *args: Any) -> Batch:
        self.commands.append(args)
        return self

    def time(self) -> Batch:
        return self.execute_command("TIME")

    def get(self, name: str) -> Batch:
        return self.execute_command("GET", name)

    def hget(self, name: str, key: str) -> Batch:
        return self.execute_command("HGET", name, key)

    def hmget(self, name: str, keys: Any, *args: Any) -> Batch:
        fields = [*keys, *args] if isinstance(keys, (list, tuple)) else [keys, *args]
        return self.execute_command("HMGET", name, *fields)

    def hgetall(self, name: str) -> Batch:
        return self.execute_command("HGETALL", name)

    def exists(self, *names: str) -> Batch:
        return self.execute_command("EXISTS", *names)

    def hlen(self, name: str) -> Batch:
        return self.execute_command("HLEN", name)

    def zcard(self, name: str) -> Batch:
        return self.execute_command("ZCARD", name)

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Batch:
        return self.execute_command("EVALSHA", sha, numkeys, *keys_and_args)

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        commands, self.commands = self.commands, []
        return self.lane.pipeline(commands, raise_on_error) if commands else []


def batch(client: Any) -> Any:
    """A pipeline (``transaction=False``) for ``client``: a `Batch` through its lane where it
    has one, else the client's own pipeline."""
    lane = lane_of(client)
    return Batch(lane) if lane is not None else client.pipeline(transaction=False)
