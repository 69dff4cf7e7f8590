"""Celery with the Redis broker (kombu: a list per queue, an ``unacked`` hash and index),
results ignored.

Worker: ``celery worker --pool solo`` (one job at a time in the worker process; no prefork
children), prefetch and everything else default, log level WARNING."""

from __future__ import annotations

import sys
from functools import cache
from typing import Any

from bench import COUNTER_KEY
from bench.peers import QUEUE, script, sync_redis, url

NAME = "celery"
DIST = "celery"
SETTINGS = "`celery worker --pool solo` (1 job at a time), redis broker, results ignored"
TASK = "bench.incr"


def incr() -> None:
    """The job."""
    sync_redis().incr(COUNTER_KEY)


@cache
def _app() -> Any:
    from celery import Celery

    app = Celery("bench", broker=url())
    app.conf.update(
        task_default_queue=QUEUE,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
    )
    app.task(name=TASK)(incr)
    return app


def __getattr__(name: str) -> Any:
    if name == "app":  # ``celery -A bench.peers.celery:app``; built on first use
        return _app()
    raise AttributeError(name)


def interpreter() -> str:
    return sys.executable


def enqueue(n: int) -> None:
    task = _app().tasks[TASK]
    for _ in range(n):
        task.delay()


def worker_argv(python: str, redis_url: str) -> list[str]:
    return [
        script(python, "celery"), "-A", "bench.peers.celery:app", "worker", "--pool", "solo",
        "--loglevel", "WARNING", "-Q", QUEUE,
    ]  # fmt: skip
