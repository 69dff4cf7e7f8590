"""RQ: jobs in a list per queue, a hash per job, registries as sorted sets.

Worker: ``rq worker --worker-class rq.worker.SimpleWorker`` -- the job runs inside the worker
process. RQ's default ``Worker`` forks one process per job; RQ's performance notes advise
SimpleWorker for jobs of a few milliseconds, which these are. An RQ worker runs one job at a
time (no thread or async concurrency inside a worker)."""

from __future__ import annotations

import sys

from bench import COUNTER_KEY
from bench.peers import QUEUE, chunks, script, sync_redis, url

NAME = "rq"
DIST = "rq"
SETTINGS = "`rq worker --worker-class rq.worker.SimpleWorker` (no fork per job; 1 job at a time)"


def incr() -> None:
    """The job."""
    sync_redis().incr(COUNTER_KEY)


def interpreter() -> str:
    return sys.executable


def enqueue(n: int) -> None:
    from redis import Redis
    from rq import Queue

    queue = Queue(QUEUE, connection=Redis.from_url(url()))
    for size in chunks(n):
        queue.enqueue_many([Queue.prepare_data("bench.peers.rq.incr") for _ in range(size)])


def worker_argv(python: str, redis_url: str) -> list[str]:
    return [
        script(python, "rq"), "worker", "--url", redis_url, "--worker-class",
        "rq.worker.SimpleWorker", "--logging_level", "WARNING", QUEUE,
    ]  # fmt: skip
