"""SAQ: asyncio worker; jobs as keys, a list of queued ids, sorted sets for the rest.

Worker: the ``saq`` CLI with ``concurrency=16`` (concurrent asyncio jobs), one process
(``--workers 1``), ``--quiet`` (no log configuration: no line per job).

Seen here with saq 0.26.4: a few jobs (2-3 of 10,000) run twice. The worker sweeps its active
list as it starts; a job already moved there but not yet marked active counts as stuck and is
retried while the worker also runs it (at-least-once delivery)."""

from __future__ import annotations

import asyncio
import sys
from functools import cache
from typing import Any

from bench import COUNTER_KEY
from bench.peers import CONCURRENCY, QUEUE, async_redis, chunks, script, url

NAME = "saq"
DIST = "saq"
SETTINGS = f"`saq bench.peers.saq.settings --workers 1`, concurrency={CONCURRENCY} (asyncio)"


async def incr(ctx: dict[str, Any]) -> None:
    """The job."""
    await async_redis().incr(COUNTER_KEY)


@cache
def _settings() -> dict[str, Any]:
    from saq import Queue

    return {
        "queue": Queue.from_url(url(), name=QUEUE),
        "functions": [incr],
        "concurrency": CONCURRENCY,
    }


def __getattr__(name: str) -> Any:
    if name == "settings":  # read by the saq CLI; built on first use
        return _settings()
    raise AttributeError(name)


def interpreter() -> str:
    return sys.executable


def enqueue(n: int) -> None:
    from saq import Queue

    async def go() -> None:
        queue = Queue.from_url(url(), name=QUEUE)
        await queue.connect()
        for size in chunks(n, 500):
            await asyncio.gather(*(queue.enqueue("incr") for _ in range(size)))
        await queue.disconnect()

    asyncio.run(go())


def worker_argv(python: str, redis_url: str) -> list[str]:
    return [script(python, "saq"), "bench.peers.saq.settings", "--workers", "1", "--quiet"]
