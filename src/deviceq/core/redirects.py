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
keyed read first wherever that matters (``verify``'s ``SCAN``)."""

from __future__ import annotations

from typing import Any

import redis
from redis.client import Pipeline
from redis.connection import ConnectionPool
from redis.exceptions import MovedError

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


def _moved_in(results: list[Any]) -> MovedError | None:
    return next((r for r in results if isinstance(r, MovedError)), None)


class FollowingPipeline(Pipeline):
    """A pipeline that, redirected, points its client at the new node and runs again."""

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        stack = list(self.command_stack)
        for attempt in range(MAX_REDIRECTS + 1):
            try:
                results = super().execute(raise_on_error)
            except MovedError as exc:
                if attempt == MAX_REDIRECTS:
                    raise
                moved = exc
            else:
                found = _moved_in(results)
                if found is None or attempt == MAX_REDIRECTS:
                    return results
                moved = found
            repoint(self.connection_pool, moved.host, moved.port)
            self.command_stack = list(stack)  # execute() reset it
        raise AssertionError("unreachable")


class FollowingRedis(redis.Redis):
    """``redis.Redis`` that follows ``MOVED`` redirects to the node serving its pool."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        for attempt in range(MAX_REDIRECTS + 1):
            try:
                return super().execute_command(*args, **options)
            except MovedError as exc:
                if attempt == MAX_REDIRECTS:
                    raise
                repoint(self.connection_pool, exc.host, exc.port)
        raise AssertionError("unreachable")

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> FollowingPipeline:
        return FollowingPipeline(
            self.connection_pool, self.response_callbacks, transaction, shard_hint
        )
