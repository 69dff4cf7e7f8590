"""A Redis client that follows its pool to the node serving it.

Every key of a pool carries the pool's hash tag (``dq:{POOL}:...``), so on a Redis Cluster all
of them live in one slot, on one node. A client made from any node's URL therefore needs just
one thing to work on a cluster: when a node answers ``MOVED SLOT HOST:PORT`` (the pool's slot
lives elsewhere, or moved there after a failover or a resharding), point the client's
connections at HOST:PORT and send the command again. A ``MOVED`` reply means the node did not
run the command, so sending it again is safe; that holds for whole pipelines and transactions
too (a transaction with a redirected command is aborted by the server as a whole).

On a standalone server nothing changes: no ``MOVED`` ever comes. Compared with redis-py's
``RedisCluster``, the client stays a plain ``redis.Redis`` talking to one node: pipelines may
hold keyless commands (``TIME``, ``INFO``, ``WAIT``), transactions work, and no slot is
computed per command. A client is meant for one pool (or pools on one node); a process
serving pools on different nodes uses one client per pool.

Keyless commands go to whichever node the client points at. `PoolConnection.pin` sends one
keyed read first wherever that matters (``verify``'s ``SCAN``).

Failover: on its first command a client asks its node for the cluster's nodes (``CLUSTER
SLOTS``; a standalone server says it has no cluster, and nothing more is asked). When the
node it points at stops answering (a SIGKILLed primary) or answers ``CLUSTERDOWN``,
``TRYAGAIN``, ``LOADING`` or ``READONLY``, the client tries the other nodes it knows in turn,
with a growing pause, for at most `FAILOVER_WAIT` seconds; the node that answers redirects it
to the pool's new primary once a replica has been promoted. Behind Sentinel the client waits
the same way, asking the sentinels for the primary on every new connection. An ``ASK`` (the
pool's slot is being migrated) is waited out the same way until the node answers ``MOVED``: a
script must see all of the pool's keys, never half of them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.client import Pipeline
from redis.connection import ConnectionPool
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.sentinel import MasterNotFoundError

MAX_REDIRECTS = 5
"""Redirects followed for one command or pipeline before the ``MOVED`` error is raised (a
slot that keeps moving means the cluster is being resharded faster than we can follow)."""


def repoint(pool: ConnectionPool, host: str, port: int) -> None:
    """Point every connection of ``pool`` at ``host:port``: idle ones reconnect there on their
    next use, busy ones when they are released (their command gets its own ``MOVED``)."""
    with pool._lock:
        if (pool.connection_kwargs.get("host"), pool.connection_kwargs.get("port")) == (
            host,
            port,
        ):
            return
        pool.connection_kwargs["host"], pool.connection_kwargs["port"] = host, port
        for conn in list(pool._available_connections):
            conn.host, conn.port = host, port
            conn.disconnect()
        for conn in list(pool._in_use_connections):
            conn.host, conn.port = host, port
            conn.mark_for_reconnect()


FAILOVER_WAIT = 30.0
"""Longest a client waits, trying other nodes, for a failover: above Redis Cluster's default
``cluster-node-timeout`` (15 s) plus an election, and Sentinel's ``down-after-milliseconds``
plus its election."""

_TRANSIENT = ("CLUSTERDOWN", "TRYAGAIN", "LOADING")

UNAVAILABLE: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.BusyLoadingError,
    ClusterDownError,
    TryAgainError,
    ReadOnlyError,
    AskError,  # MOVED or ASK that did not settle within FAILOVER_WAIT
)
"""Errors that mean Redis does not serve the pool right now (unreachable, loading, a cluster
failing over or resharding): a daemon waits and tries again, quietly."""


def _moved_in(results: list[Any]) -> AskError | None:
    """A ``MOVED`` (or ``ASK``: `MovedError` is an `AskError`) among a pipeline's replies."""
    return next((r for r in results if isinstance(r, AskError)), None)


def _failing_over(exc: BaseException) -> bool:
    """An error after which another node of the cluster may answer."""
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, ReadOnlyError)):
        return True
    if isinstance(exc, (ClusterDownError, TryAgainError)):  # redis-py rewords their messages
        return True
    return isinstance(exc, ResponseError) and str(exc).startswith(_TRANSIENT)


class Topology:
    """The nodes of a cluster a client knows: learned once (``CLUSTER SLOTS``), then from
    redirects. ``cluster`` is None until known, False on a standalone server."""

    def __init__(self, host: str, port: int) -> None:
        self.nodes: list[tuple[str, int]] = [(host, port)]
        self.cluster: bool | None = None
        self.sentinel = False  # the pool asks Sentinel for the primary on every connect
        self.outage_since: float | None = None  # when calls began failing over (monotonic)
        self.lock = threading.Lock()

    def add(self, host: str, port: int) -> None:
        with self.lock:
            if (host, port) not in self.nodes:
                self.nodes.append((host, port))

    def learn(self, ask: Callable[[], Any]) -> None:
        """Ask once (``ask`` sends CLUSTER SLOTS) whether this is a cluster, and its nodes."""
        try:
            slots = ask()
        except redis.AuthenticationError:
            raise  # the command would be refused the same way
        except (redis.ConnectionError, redis.TimeoutError):
            return  # ask again on the next command
        except redis.ResponseError:  # "cluster support disabled" (or not allowed to ask)
            self.cluster = False
            return
        self.cluster = True
        for entry in slots or []:
            for node in entry[2:]:
                self.add(str(node[0]), int(node[1]))

    def next_after(self, host: str, port: int) -> tuple[str, int]:
        with self.lock:
            i = self.nodes.index((host, port)) if (host, port) in self.nodes else -1
            return self.nodes[(i + 1) % len(self.nodes)]


def _a_sentinel_answers(pool: ConnectionPool) -> bool:
    manager = getattr(pool, "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", []):
        try:
            sentinel.ping()
            return True
        except redis.RedisError:
            continue
    return False


def _follow(client: FollowingRedis, run: Callable[[], Any]) -> Any:
    """Run ``run`` (a command or a pipeline), following redirects and, on a cluster, failing
    over to the other known nodes; see the module docstring. The `FAILOVER_WAIT` budget is the
    client's, not each call's: once an outage has lasted that long, a call tries each way once
    and fails (a dead primary with no replica costs a command line one wait, not one per
    command), until a call goes through again."""
    pool = client.connection_pool
    topo = client.topology
    redirects, pause = 0, 0.05
    unreachable: set[tuple[str, int]] = set()  # nodes that failed during this call

    def wait_or_raise(exc: BaseException) -> None:
        nonlocal pause
        if topo.outage_since is None:
            topo.outage_since = time.monotonic()
        if time.monotonic() - topo.outage_since > FAILOVER_WAIT:
            raise exc
        time.sleep(pause)
        pause = min(pause * 2, 1.0)

    while True:
        try:
            result = run()
            topo.outage_since = None
            return result
        except MovedError as exc:
            target = (exc.host, exc.port)
            topo.add(*target)
            repoint(pool, *target)
            if target in unreachable:
                wait_or_raise(exc)  # the cluster still names the dead primary: failing over
            else:
                redirects += 1
                if redirects > MAX_REDIRECTS:
                    raise
        except AskError as exc:
            # the pool's slot is being migrated: some of its keys are already on the target.
            # A transition must see all of them, so wait for the migration to end (MOVED)
            # rather than run one command on the target (ASKING)
            wait_or_raise(exc)
        except MasterNotFoundError as exc:
            # the sentinels name no primary while they fail over; none answering at all is
            # not a failover: nothing to wait for
            if not _a_sentinel_answers(pool):
                raise
            wait_or_raise(exc)
        except (redis.RedisError, OSError) as exc:
            if not (topo.cluster or topo.sentinel) or not _failing_over(exc):
                raise
            if topo.cluster:  # try the next node; the next connection asks Sentinel anew
                kw = pool.connection_kwargs
                here = (str(kw.get("host", "")), int(kw.get("port", 0) or 0))
                unreachable.add(here)
                repoint(pool, *topo.next_after(*here))
            wait_or_raise(exc)


class FollowingPipeline(Pipeline):
    """A pipeline that, redirected (or its node gone), follows its pool and runs again."""

    follows: FollowingRedis

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack = list(self.command_stack)

        def run() -> list[Any]:
            self.command_stack = list(stack)  # execute() resets it
            results = super(FollowingPipeline, self).execute(raise_on_error)
            moved = _moved_in(results)
            if moved is not None:
                raise moved
            return results

        return _follow(self.follows, run)


class FollowingRedis(redis.Redis):
    """``redis.Redis`` that follows its pool to the node serving it (``MOVED``) and, on a
    cluster, to the new primary after a failover."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        kw = self.connection_pool.connection_kwargs
        self.topology = Topology(str(kw.get("host", "")), int(kw.get("port", 0) or 0))
        if "host" not in kw:  # a unix socket, or Sentinel's pool
            self.topology.cluster = False
            self.topology.sentinel = hasattr(self.connection_pool, "get_master_address")

    def _learn(self) -> None:
        if self.topology.cluster is None:
            self.topology.learn(lambda: super(FollowingRedis, self).execute_command(
                "CLUSTER SLOTS"))  # fmt: skip

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self._learn()
        return _follow(self, lambda: super(FollowingRedis, self).execute_command(*args, **options))

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> FollowingPipeline:
        self._learn()
        pipe = FollowingPipeline(
            self.connection_pool, self.response_callbacks, transaction, shard_hint
        )
        pipe.follows = self
        return pipe
