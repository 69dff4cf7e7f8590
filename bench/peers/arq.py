"""arq: asyncio worker; jobs in a sorted set per queue, a key per job, results kept.

arq 0.28 requires redis-py < 6 while bullmq needs >= 6.2, so arq runs from a virtualenv of its
own (``bench.peers.side_venv``; ``DEVICEQ_BENCH_ARQ_PYTHON`` names another interpreter) unless
arq is importable here. Worker: the ``arq`` CLI with ``max_jobs=16`` (concurrent asyncio
jobs), other settings default."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
from typing import Any

from bench import COUNTER_KEY
from bench.peers import CONCURRENCY, chunks, script, side_venv, url

NAME = "arq"
DIST = "arq"
REQUIREMENT = "arq==0.28.0"
SETTINGS = f"`arq bench.peers.arq.WorkerSettings`, max_jobs={CONCURRENCY} (asyncio)"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"err": {"class": "logging.StreamHandler", "level": "WARNING"}},
    "loggers": {"arq": {"handlers": ["err"], "level": "WARNING"}},
}
"""``--custom-log-dict``: no log line per job (the other peers run at WARNING too)."""


async def incr(ctx: dict[str, Any]) -> None:
    """The job (``ctx['redis']`` is the worker's own connection pool)."""
    await ctx["redis"].incr(COUNTER_KEY)


def __getattr__(name: str) -> Any:
    if name == "WorkerSettings":  # built on first use: arq is not installed in every env
        from arq.connections import RedisSettings

        return type(
            "WorkerSettings",
            (),
            {
                "functions": [incr],
                "redis_settings": RedisSettings.from_dsn(url()),
                "max_jobs": CONCURRENCY,
                "log_results": False,
            },
        )
    raise AttributeError(name)


def interpreter() -> str:
    if python := os.environ.get("DEVICEQ_BENCH_ARQ_PYTHON"):
        return python
    if importlib.util.find_spec("arq") is not None:
        return sys.executable
    return side_venv("arq", REQUIREMENT)


def enqueue(n: int) -> None:
    from arq.connections import RedisSettings, create_pool

    async def go() -> None:
        pool = await create_pool(RedisSettings.from_dsn(url()))
        for size in chunks(n, 500):
            await asyncio.gather(*(pool.enqueue_job("incr") for _ in range(size)))
        await pool.aclose()

    asyncio.run(go())


def worker_argv(python: str, redis_url: str) -> list[str]:
    return [
        script(python, "arq"), "--custom-log-dict", "bench.peers.arq.LOGGING",
        "bench.peers.arq.WorkerSettings",
    ]  # fmt: skip
