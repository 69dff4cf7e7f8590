"""The goal runners of ``bench.fleet.daemons`` (`hold`: every task holds its device for
``TASK_S`` seconds) and ``bench.fleet.lab`` (`hold_goal`: for the seconds its goal says), each
also as an async runner (`hold_async`, `hold_goal_async`: the wait awaited on the host's event
loop). They do nothing else (no Redis call of their own: the host daemon's CPU measured around
them is deviceq's alone; the tasks done are read from the pool's ``status:done`` index)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

TASK_S = 0.5
"""Seconds every task runs (sleeping: the host daemon's own CPU is what is measured)."""


def hold(task: object) -> None:
    """Run one task: sleep ``TASK_S`` seconds."""
    time.sleep(TASK_S)


def hold_goal(task: Any) -> None:
    """Run one task: sleep the seconds its goal gives (``"0.750"``)."""
    time.sleep(float(task.goal))


async def hold_async(task: object) -> None:
    """`hold` as an async runner: await ``TASK_S`` seconds."""
    await asyncio.sleep(TASK_S)


async def hold_goal_async(task: Any) -> None:
    """`hold_goal` as an async runner: await the seconds its goal gives."""
    await asyncio.sleep(float(task.goal))


def hold_goal_stoppable(task: Any) -> Any:
    """Run one task: wait the seconds its goal gives, or until it is told to stop (a cancel or
    a preemption: then it fails at once, as a stopped run does)."""
    from deviceq.host.runners import Outcome

    if task.cancel.wait(float(task.goal)):
        return Outcome.failure("stopped")
    return None
