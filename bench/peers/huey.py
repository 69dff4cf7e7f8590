"""Huey with ``RedisHuey`` (a list per queue; results of None are not stored).

Worker: ``huey_consumer -k thread -w 16`` (Huey's docs: threads or greenlets for I/O-bound
tasks), one process, ``--quiet``."""

from __future__ import annotations

import sys
from functools import cache
from typing import Any

from bench import COUNTER_KEY
from bench.peers import CONCURRENCY, QUEUE, script, sync_redis, url

NAME = "huey"
DIST = "huey"
SETTINGS = f"`huey_consumer -k thread -w {CONCURRENCY}`, RedisHuey (blocking reads)"


def incr() -> None:
    """The job."""
    sync_redis().incr(COUNTER_KEY)


@cache
def _huey() -> tuple[Any, Any]:
    """The Huey instance and the task wrapper of ``incr`` (calling it enqueues a job)."""
    from huey import RedisHuey

    huey = RedisHuey(QUEUE, url=url())
    return huey, huey.task(name="incr")(incr)


def __getattr__(name: str) -> Any:
    if name == "huey":  # ``huey_consumer bench.peers.huey.huey``; built on first use
        return _huey()[0]
    raise AttributeError(name)


def interpreter() -> str:
    return sys.executable


def enqueue(n: int) -> None:
    _, task = _huey()
    for _ in range(n):
        task()


def worker_argv(python: str, redis_url: str) -> list[str]:
    return [
        script(python, "huey_consumer"), "bench.peers.huey.huey", "-k", "thread",
        "-w", str(CONCURRENCY), "--quiet",
    ]  # fmt: skip
