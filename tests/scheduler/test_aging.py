"""Priority with aging: a queued task's effective priority rises one level every
``aging_seconds`` it waits (at most 9), so a low-priority task is never starved by a steady
stream of high-priority ones. Real Redis; the starvation case through the real daemons."""

from __future__ import annotations

import time

import pytest

from deviceq import TaskScheduler, TaskStatus
from deviceq.scheduler.strategies import aged
from harness import Deployment, wait_for


def test_aged_rises_one_level_per_period_and_stops_at_nine() -> None:
    assert aged(0, 1_000, 1_000, 100) == 0
    assert aged(0, 1_000, 1_099, 100) == 0
    assert aged(0, 1_000, 1_100, 100) == 1
    assert aged(3, 1_000, 1_450, 100) == 7
    assert aged(3, 1_000, 99_000, 100) == 9
    assert aged(9, 1_000, 99_000, 100) == 9
    assert aged(2, 1_000, 99_000, 0) == 2  # aging off
    assert aged(2, 0, 99_000, 100) == 2  # submission time unknown: not aged


@pytest.mark.parametrize("aging", [0.1, 0.0])
def test_an_aged_low_priority_task_goes_before_a_fresh_high_one(real_fleet, aging) -> None:
    """One device. A priority-0 task has waited ten aging periods when a priority-9 task
    arrives: aged to 9, it ties and wins by age. With aging off the 9 wins."""
    real_fleet.admin.set_config("aging_seconds", aging)
    real_fleet.add_host("h1", ("d1", "x", ()))
    low = real_fleet.client.submit("low", priority=0)
    time.sleep(1.0)
    high = real_fleet.client.submit("high", priority=9)
    res = TaskScheduler(real_fleet.admin, strategy="priority_match").assign()
    assert res.assigned == 1
    got = {t: real_fleet.client.get(t, attempts=False).status for t in (low, high)}
    first, second = (low, high) if aging else (high, low)
    assert got == {first: TaskStatus.assigned, second: TaskStatus.queued}


def test_aging_applies_only_across_priorities_and_keeps_fifo_within_one(real_fleet) -> None:
    """All tasks at one priority: aging changes nothing (oldest first, as without it)."""
    real_fleet.admin.set_config("aging_seconds", 0.05)
    real_fleet.add_host("h1", ("d1", "x", ()), ("d2", "x", ()))
    ids = [real_fleet.client.submit(f"t{i}", priority=4) for i in range(4)]
    time.sleep(0.3)
    TaskScheduler(real_fleet.admin, strategy="priority_match").assign()
    got = [real_fleet.client.get(t, attempts=False).status for t in ids]
    assert got == [TaskStatus.assigned] * 2 + [TaskStatus.queued] * 2


def test_a_low_priority_task_is_not_starved_by_a_stream_of_high_ones(
    deploy: Deployment,
) -> None:
    """Real daemons, one device kept saturated by a stream of priority-9 tasks submitted
    after a priority-0 one (faster than the device runs them): the priority-0 task is
    assigned within its aging bound (9 levels x aging_seconds, plus scheduling slack), while
    priority-9 tasks that arrived after it still wait. Without aging it would wait for the
    stream to stop. (Aging never puts a task before higher-priority tasks submitted before
    it: those age too.)"""
    aging = 0.2
    deploy.configure(aging_seconds=aging)
    deploy.command_host("h1", "d1:x")
    deploy.spawn("scheduler", "scheduler", "run", "--tick", "0.2", "--strategy", "priority_match")
    wait_for(lambda: deploy.alive("h1"), 20, "host h1 alive")
    spec = {"goal": "sleep 0.05", "priority": 9}
    deploy.client.submit_many([spec] * 3)
    low = deploy.client.submit("sleep 0.01", priority=0)
    submitted = deploy.client.get(low, attempts=False).submitted_at
    stream: list[str] = []
    deadline = time.monotonic() + 30
    while deploy.status(low) == TaskStatus.queued and time.monotonic() < deadline:
        stream += deploy.client.submit_many([spec] * 5)  # ~50/s: more than the device runs
        time.sleep(0.1)
    t = deploy.client.wait(low, timeout=30)
    assert t.status == TaskStatus.done and t.assigned_at is not None
    waited = (t.assigned_at - submitted) / 1000
    assert waited <= 9 * aging + 1.5, f"the priority-0 task waited {waited:.2f} s"
    later = [deploy.client.get(x, attempts=False).assigned_at for x in stream]
    before = [a for a in later if a is not None and a < t.assigned_at]
    after = [a for a in later if a is None or a > t.assigned_at]
    assert before, "no priority-9 task of the stream went first: priority did not apply"
    assert len(after) >= 10, "the stream did not saturate the device"
