"""The goal runners of ``bench.fleet.daemons`` (`hold`: every task holds its device for
``TASK_S`` seconds) and ``bench.fleet.lab`` (`hold_goal`: for the seconds its goal says). They
do nothing else (no Redis call of their own: the host daemon's CPU measured around them is
deviceq's alone; the tasks done are read from the pool's ``status:done`` index)."""

from __future__ import annotations

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


def hold_goal_stoppable(task: Any) -> Any:
    """Run one task: wait the seconds its goal gives, or until it is told to stop (a cancel or
    a preemption: then it fails at once, as a stopped run does)."""
    from deviceq.host.runners import Outcome

    if task.cancel.wait(float(task.goal)):
        return Outcome.failure("stopped")
    return None
