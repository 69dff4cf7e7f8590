"""The goal runner of the deviceq drain benchmark: every task does one ``INCR`` of the counter
key, like the peers' jobs. The host daemon runs it in threads
(``--goal-runner bench.support.runners:incr --isolation thread``) and finds the measured
redis-server in the ``BENCH_REDIS_URL`` environment variable."""

from __future__ import annotations

import os
import threading

import redis

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
