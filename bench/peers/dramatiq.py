"""Dramatiq with the Redis broker (Lua scripts: a list per queue, a hash of messages, acks
per worker).

Worker: the ``dramatiq`` CLI with ONE worker process (``--processes 1``; the CLI also keeps a
supervising parent) and ``--threads 16`` (Dramatiq's docs: more threads for I/O-bound
actors), default middleware, log lines only for warnings (``--skip-logging``)."""

from __future__ import annotations

import sys
from functools import cache
from typing import Any

from bench import COUNTER_KEY
from bench.peers import CONCURRENCY, QUEUE, script, sync_redis, url

NAME = "dramatiq"
DIST = "dramatiq"
SETTINGS = f"`dramatiq --processes 1 --threads {CONCURRENCY}`, RedisBroker, default middleware"


def incr() -> None:
    """The job."""
    sync_redis().incr(COUNTER_KEY)


@cache
def _broker() -> Any:
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=url())
    dramatiq.set_broker(broker)
    dramatiq.actor(actor_name="incr", queue_name=QUEUE, broker=broker)(incr)
    return broker


def __getattr__(name: str) -> Any:
    if name == "broker":  # ``dramatiq bench.peers.dramatiq:broker``; built on first use
        return _broker()
    raise AttributeError(name)


def interpreter() -> str:
    return sys.executable


def enqueue(n: int) -> None:
    actor = _broker().get_actor("incr")
    for _ in range(n):
        actor.send()


def worker_argv(python: str, redis_url: str) -> list[str]:
    return [
        script(python, "dramatiq"), "bench.peers.dramatiq:broker", "--processes", "1",
        "--threads", str(CONCURRENCY), "--skip-logging",
    ]  # fmt: skip
