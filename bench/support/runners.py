"""The goal runners of the deviceq drain benchmark: every task does one ``INCR`` of the counter
key, like the peers' jobs. The host daemon runs `incr` in threads
(``--goal-runner bench.support.runners:incr --isolation thread``), `incr_async` on its event
loop (``python -m bench --runner async``), and finds the measured redis-server in the
``BENCH_REDIS_URL`` environment variable."""

from __future__ import annotations

import asyncio
import os
import threading

import redis
import redis.asyncio as aredis

from bench import COUNTER_KEY, URL_ENV

_client: redis.Redis | None = None
_lock = threading.Lock()


def _redis() -> redis.Redis:
    """One client for the whole process (its connection pool is thread-safe)."""
    global _client
    if _client is None:
        with _lock:
            if _client is None:
                _client = redis.Redis.from_url(os.environ[URL_ENV])
    return _client


def incr(task: object) -> None:
    """Run one task: ``INCR`` the counter (returning None reports success)."""
    _redis().incr(COUNTER_KEY)


def noop(task: object) -> None:
    """Run one task: do nothing (the scale-out benchmark measures deviceq alone)."""


_aclients: dict[asyncio.AbstractEventLoop, aredis.Redis] = {}


async def incr_async(task: object) -> None:
    """`incr` as an async runner: the host runs it on its event loop, no thread a run (one
    ``redis.asyncio`` client an event loop)."""
    loop = asyncio.get_running_loop()
    client = _aclients.get(loop)
    if client is None:
        client = _aclients[loop] = aredis.Redis.from_url(os.environ[URL_ENV])
    await client.incr(COUNTER_KEY)
