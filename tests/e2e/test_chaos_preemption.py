"""Preemption under faults: ``bench/faults/chaos.py --preempt`` (routine tasks of a
preemptible class, every tenth an urgent one of a class that preempts) on 4 hosts x 4 devices
while host daemons are SIGKILLed and SIGSTOPped, the leading scheduler is SIGKILLed (the
standby takes over) and redis-server is SIGKILLed and restarted. Urgent tasks preempt routine
ones throughout; no task is lost, every task ends, no device or task ran two things at once
(the runners' locks and logged intervals: a preempted run ended before the next on its device
began), no preemption cost a task an attempt, and ``deviceq verify`` finds nothing."""

from __future__ import annotations

import pytest
from bench.faults.chaos import parse, soak


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_urgent_tasks_preempt_routine_ones_under_chaos() -> None:
    fig = soak(parse(["--tasks", "200", "--every", "2", "--max-seconds", "200", "--preempt"]))
    print(fig.text())
    assert fig.ok, fig.text()
    assert fig.tasks == 200 and sum(fig.statuses.values()) == 200, fig.text()
    assert fig.preempted >= 5 and fig.preempted_tasks >= 5, fig.text()
    assert fig.faults.get("host_kill", 0) >= 1 and fig.faults.get("scheduler_kill", 0) >= 1
