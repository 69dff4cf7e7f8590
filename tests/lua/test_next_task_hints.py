"""Next-task hints (plan_ahead.lua) and the report that takes them (report.lua): a busy device's
next task, named ahead by the scheduler, is assigned by the report that frees the device, in
that call and by every check of assign.lua, or dropped. Run on the real private redis-server
and on fakeredis (``fleet``)."""

from __future__ import annotations

from typing import Any

import pytest

from deviceq import Fenced, InvalidInput
from deviceq.core.script_args import PLAN_AHEAD
from deviceq.host.link import Report


def hint(fleet: Any, pairs: list[tuple[str, str]], fence: int | str = "") -> Any:
    """plan_ahead.lua's call, as the scheduler makes it."""
    packed = PLAN_AHEAD.pack({"task_id": t, "device_id": d} for t, d in pairs)
    return fleet.store._run("plan_ahead", [str(fence), str(len(pairs)), packed])


def running(fleet: Any, device: str = "d1") -> tuple[Any, Any, int]:
    """A host h1 with android devices d1, d2, a task running on ``device`` and the leader's
    epoch: (host, the running assignment, epoch)."""
    h = fleet.add_host("h1", ("d1", "android", ()), ("d2", "android", ()))
    epoch = fleet.store.lead("s1", 30_000).epoch
    first = fleet.client.submit("first", driver_type="android")
    assert fleet.store.commit([(first, device)], epoch)[0].startswith("ok:")
    (a,) = h.claim(1)
    return h, a, epoch


def hint_of(fleet: Any, device: str) -> str | None:
    return fleet.r.hget(fleet.admin.keys.device(device), "next_task")


def test_the_report_that_frees_the_device_assigns_and_claims_its_hint(fleet: Any) -> None:
    h, a, epoch = running(fleet)
    nxt = fleet.client.submit("next", driver_type="android")
    assert hint(fleet, [(nxt, "d1")], epoch) == 1
    assert hint_of(fleet, "d1") == f"{epoch}|{nxt}"
    answers, claimed = h.report_and_claim([Report(a.task.id, a.lease_id, "done")], 2)
    assert answers == ["ok:done"]
    assert [(c.task.id, c.device_id) for c in claimed] == [(nxt, "d1")]
    t = fleet.client.get(nxt)
    assert (t.status, t.device_id, t.attempt) == ("dispatched", "d1", 1)
    assert hint_of(fleet, "d1") is None  # taken
    assert fleet.r.smembers(fleet.admin.keys.ahead_want) == {"d1"}
    # the event stream tells the assignment as assign.lua's
    (ev,) = [e for e in fleet.client.events() if e.type == "assigned" and e.task == nxt]
    assert ev.fields["device"] == "d1"


def test_without_a_claim_the_hint_waits_in_the_inbox_and_the_host_is_woken(fleet: Any) -> None:
    h, a, epoch = running(fleet)
    nxt = fleet.client.submit("next", driver_type="android")
    hint(fleet, [(nxt, "d1")], epoch)
    fleet.r.delete(fleet.admin.keys.host_wake("h1"))
    assert h.report(a.task.id, a.lease_id, "failed", "runner_failed", "boom") == "ok:failed"
    assert fleet.client.get(nxt).status == "assigned"
    assert fleet.r.llen(fleet.admin.keys.host_wake("h1")) == 1
    assert [c.task.id for c in h.claim(1)] == [nxt]


@pytest.mark.parametrize(
    "why", ["cancelled", "placed_elsewhere", "wrong_driver", "fence", "paused"]
)
def test_a_hint_no_longer_valid_is_dropped_and_the_device_goes_idle(fleet: Any, why: str) -> None:
    h, a, epoch = running(fleet)
    driver = "web" if why == "wrong_driver" else "android"
    nxt = fleet.client.submit("next", driver_type=driver)
    hint(fleet, [(nxt, "d1")], epoch)
    if why == "cancelled":
        fleet.client.cancel(nxt)
    elif why == "placed_elsewhere":
        assert fleet.store.commit([(nxt, "d2")], epoch)[0].startswith("ok:")
    elif why == "fence":
        fleet.store.step_down("s1")
        fleet.store.lead("s2", 30_000)  # a new leader: the old one's hints are void
    elif why == "paused":
        fleet.admin.pause("maintenance")
    answers, claimed = h.report_and_claim([Report(a.task.id, a.lease_id, "done")], 2)
    assert answers == ["ok:done"]
    assert [c.task.id for c in claimed] == ([nxt] if why == "placed_elsewhere" else [])
    assert hint_of(fleet, "d1") is None
    assert fleet.r.hget(fleet.admin.keys.device("d1"), "reserved_by") == ""
    assert fleet.r.zscore(fleet.admin.keys.idle, "d1") is not None
    assert not fleet.r.smembers(fleet.admin.keys.ahead_want)
    if why in ("fence", "paused", "wrong_driver"):
        assert fleet.client.get(nxt).status == "queued"


def test_a_preempted_run_does_not_take_its_devices_hint(fleet: Any) -> None:
    """The device of a preempted run is held for the urgent task, never given a hint."""
    fleet.admin.add_priority_class("low", 1)
    fleet.admin.add_priority_class("high", 9, preempts=True)
    h = fleet.add_host("h1", ("d1", "web", ()))
    epoch = fleet.store.lead("s1", 30_000).epoch
    low = fleet.client.submit("low", driver_type="web", priority_class="low")
    fleet.store.commit([(low, "d1")], epoch)
    (a,) = h.claim(1)
    other = fleet.client.submit("other", driver_type="web")
    hint(fleet, [(other, "d1")], epoch)
    high = fleet.client.submit("urgent", driver_type="web", priority_class="high")
    assert fleet.store.preempt(high, low, "d1", epoch) == "ok"
    assert h.report(low, a.lease_id, "preempted") == "ok:queued"
    assert fleet.client.get(other).status == "queued"
    assert fleet.r.hget(fleet.admin.keys.device("d1"), "preempt_for") == high
    assert fleet.store.commit([(high, "d1")], epoch)[0].startswith("ok:")


def test_a_hint_respects_the_declared_limits(fleet: Any) -> None:
    h, a, epoch = running(fleet)
    second = fleet.client.submit("second", driver_type="android")
    assert fleet.store.commit([(second, "d2")], epoch)[0].startswith("ok:")
    fleet.admin.set_config("max_tasks_per_host", 1)  # h1 holds 2 leases: the hint would be a 2nd
    nxt = fleet.client.submit("next", driver_type="android")
    hint(fleet, [(nxt, "d1")], epoch)
    assert h.report(a.task.id, a.lease_id, "done") == "ok:done"
    assert fleet.client.get(nxt).status == "queued"


def test_plan_ahead_refuses_a_stale_fence_and_bad_ids_and_writes_nothing(fleet: Any) -> None:
    _, _, epoch = running(fleet)
    nxt = fleet.client.submit("next", driver_type="android")
    with pytest.raises(Fenced):
        hint(fleet, [(nxt, "d1")], epoch + 1)
    with pytest.raises(InvalidInput):
        hint(fleet, [(nxt, "d1"), ("bad id", "d2")], epoch)
    assert hint_of(fleet, "d1") is None and hint_of(fleet, "d2") is None
    assert hint(fleet, [(nxt, "nosuch"), (nxt, "d2")], epoch) == 1  # an unknown device: none
    assert not fleet.r.exists(fleet.admin.keys.device("nosuch"))
    assert hint(fleet, [], epoch) == 0


def test_a_hint_and_a_pass_racing_for_a_task_give_it_one_lease(real_fleet: Any) -> None:
    """Reports taking hints and a scheduler's commit of the same tasks to idle devices, from
    two threads on the real server: every task ends with one lease on one device."""
    import threading

    f = real_fleet
    n = 12
    devices = [(f"d{i:02}", "android", ()) for i in range(2 * n)]
    h = f.add_host("h1", *devices)
    epoch = f.store.lead("s1", 30_000).epoch
    first = f.client.submit_many([{"goal": f"run {i}", "driver_type": "android"} for i in range(n)])
    assert all(x.startswith("ok:") for x in f.store.commit(
        [(t, f"d{i:02}") for i, t in enumerate(first)], epoch))  # fmt: skip
    runs = h.claim(n)
    nxt = f.client.submit_many([{"goal": f"next {i}", "driver_type": "android"} for i in range(n)])
    hint(f, [(t, f"d{i:02}") for i, t in enumerate(nxt)], epoch)
    start = threading.Barrier(2)

    def report() -> None:
        start.wait()
        for a in runs:
            f.host("h1").report(a.task.id, a.lease_id, "done")

    def commit() -> None:
        start.wait()
        for i, t in enumerate(nxt):
            f.store.commit([(t, f"d{n + i:02}")], epoch)

    threads = [threading.Thread(target=report), threading.Thread(target=commit)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    held: dict[str, str] = {}
    for t in nxt:
        task = f.client.get(t)
        assert task.status == "assigned" and task.attempt == 1, (t, task.status)
        assert task.device_id not in held, "two tasks on one device"
        held[task.device_id] = t
        assert f.r.hget(f.admin.keys.device(task.device_id), "reserved_by") == t
    assert len(f.r.lrange(f.admin.keys.inbox("h1"), 0, -1)) == n
