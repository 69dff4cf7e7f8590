"""BullMQ's Python client (the same Lua scripts as the Node.js library: a list of waiting
ids, a hash per job, an event stream per queue, completed jobs kept).

Worker: BullMQ has no CLI; ONE process runs ``bullmq.Worker`` with ``concurrency=16``
(asyncio), until SIGTERM (``python -m bench.peers._run bullmq work``)."""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

from bench import COUNTER_KEY
from bench.peers import CONCURRENCY, QUEUE, async_redis, chunks, url

NAME = "bullmq"
DIST = "bullmq"
SETTINGS = f"`bullmq.Worker`, concurrency={CONCURRENCY} (asyncio), one process"


async def incr(job: Any, token: str) -> None:
    """The job."""
    await async_redis().incr(COUNTER_KEY)


def interpreter() -> str:
    return sys.executable


def enqueue(n: int) -> None:
    from bullmq import Queue

    async def go() -> None:
        queue = Queue(QUEUE, {"connection": url()})
        for size in chunks(n):
            await queue.addBulk([{"name": "incr", "data": {}} for _ in range(size)])
        await queue.close()

    asyncio.run(go())


def work() -> None:
    from bullmq import Worker

    async def go() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        worker = Worker(QUEUE, incr, {"connection": url(), "concurrency": CONCURRENCY})
        await stop.wait()
        await worker.close()

    asyncio.run(go())


def worker_argv(python: str, redis_url: str) -> list[str]:
    return [python, "-m", "bench.peers._run", "bullmq", "work"]
