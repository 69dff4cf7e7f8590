"""A task pinned to one device (what ``suite submit --each-device`` makes): the scheduler gives
it that device only, waits for it while it is busy (never another device), places pinned
tasks of different devices in one pass, assign.lua refuses any other device, and explain
says what it waits for."""

from __future__ import annotations

from typing import Any

import pytest

from deviceq import InvalidInput, TaskStatus
from deviceq.ops.explain import explain
from deviceq.scheduler.task_scheduler import TaskScheduler

PHONES = [(f"p{i}", "android", ()) for i in range(1, 4)]


def test_a_pinned_task_waits_for_its_device_and_never_runs_elsewhere(real_fleet: Any) -> None:
    f = real_fleet
    h = f.add_host("h1", *PHONES)
    blocker = f.client.submit("busy", driver_type="android")
    assert f.store.commit([(blocker, "p1")])[0].startswith("ok:")
    (pinned,) = f.client.submit_many([{"goal": "on p1", "driver_type": "android", "pin": "p1"}])
    other = f.client.submit("anywhere", driver_type="android")
    sched = TaskScheduler(f.admin, owner="pin-test")
    sched.assign()
    assert f.client.get(pinned).status is TaskStatus.queued  # p2 and p3 are idle: not for it
    assert f.client.get(other).status is TaskStatus.assigned  # the task behind it is not held
    exp = explain(f.admin, pinned)
    assert exp.reasons[0].code == "pinned"
    assert exp.summary.startswith(f"pinned to device p1 (it runs task {blocker})")
    assert exp.constraints["pin"] == "p1"
    # a commit to another device is refused by the script, whoever proposes it
    assert f.store.commit([(pinned, "p2")]) == ["err:task_pinned"]
    (a,) = [x for x in h.claim(5) if x.task.id == blocker]
    h.report(blocker, a.lease_id, "done", payload="ok")
    sched.assign()
    t = f.client.get(pinned)
    assert (t.status, t.device_id) == (TaskStatus.assigned, "p1")


def test_tasks_pinned_to_each_device_are_placed_in_one_pass(real_fleet: Any) -> None:
    f = real_fleet
    f.add_host("h1", *PHONES)
    ids = f.client.submit_many(
        [{"goal": f"on {d}", "driver_type": "android", "pin": d} for d, _, _ in PHONES]
    )
    TaskScheduler(f.admin, owner="pin-test").assign()
    assert [f.client.get(t).device_id for t in ids] == ["p1", "p2", "p3"]


def test_a_suite_on_every_device_pins_one_shard_to_each(real_fleet: Any) -> None:
    f = real_fleet
    f.add_host("h1", *PHONES)
    s = f.client.submit_suite("flash", ["check#a", "check#b"], command="check {tests}",
                              driver_type="android", each_device=True)  # fmt: skip
    assert [(sh.pin, sh.tests) for sh in s.shards] == [
        (d, ["check#a", "check#b"]) for d, _, _ in PHONES
    ]
    exp = explain(f.admin, s.shards[1].task_id)
    assert exp.reasons[0].code == "pinned" and "pinned to device p2 (it is idle)" in exp.summary
    assert exp.reasons[-1].message.startswith(f"shard 1 of suite {s.id} (flash, running)")
    TaskScheduler(f.admin, owner="pin-test").assign()
    assert [f.client.get(sh.task_id).device_id for sh in s.shards] == ["p1", "p2", "p3"]


def test_a_bad_pin_is_refused_and_nothing_is_written(real_fleet: Any) -> None:
    f = real_fleet
    for spec, msg in [
        ({"goal": "x", "pin": "no such/device"}, "device id"),
        ({"goal": "x", "pin": "p1", "roles": {"a": "android"}}, "cannot be pinned"),
    ]:
        with pytest.raises(InvalidInput, match=msg):
            f.client.submit_many([spec])
    assert f.client.list() == []
