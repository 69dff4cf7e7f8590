"""The goal runner of ``bench.fleet_daemons``: every task holds its device for
``TASK_S`` seconds, then does one ``INCR`` of the counter key (``bench.runners.incr``), so that
device utilization can be read as counter increments x ``TASK_S`` / (devices x time)."""

from __future__ import annotations

import time

from bench.runners import incr

TASK_S = 0.5
"""Seconds every task runs (sleeping: the host daemon's own CPU is what is measured)."""


def hold(task: object) -> None:
    """Run one task: sleep ``TASK_S`` seconds, then ``INCR`` the counter."""
    time.sleep(TASK_S)
    incr(task)
