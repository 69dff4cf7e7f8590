"""``explain`` and the scheduler agree on the same state, because explain's matching is the
placement pipeline's filter stage (recorded) and its device states the one eligibility rule:
a task whose only candidate lacks a tag is ``missing_tags`` to explain, rejected with
``missing_tag:TAG`` by the pipeline's filters, and no pass places it; once the device has the
tag, explain sees it idle and matching, the pipeline places the task there, and so does a real
scheduler pass. Real Redis."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from deviceq import DeviceReport, TaskStatus
from deviceq.ops.explain import explain
from deviceq.ops.explain.devices import FILTERS
from deviceq.scheduler import TaskScheduler
from deviceq.scheduler.buckets import buckets
from deviceq.scheduler.placement import PROFILES, Need, Recorder, judge, place
from deviceq.scheduler.strategies import DEFAULT_STRATEGY, QueuedTask


def test_every_builtin_profile_has_the_filters_explain_judges_with() -> None:
    assert all(p.filters == FILTERS for p in PROFILES.values())
    assert PROFILES[DEFAULT_STRATEGY].filters is FILTERS


def pipeline_record(fleet: Any, sched: TaskScheduler, task_id: str) -> tuple[list[Any], Recorder]:
    """The pipeline run on the scheduler's own view (`SnapshotReader.make_view`) with just the
    task's bucket (read whether or not a device serves it: the scheduler's view holds only
    buckets some device serves) and the task at its head, over the view's devices (the
    assignable candidates, of every device class: ``every``, as ``TaskScheduler.snapshot``
    reads them). The pairs and the task's record."""
    t = fleet.client.get(task_id)
    raw = fleet.r.hgetall(fleet.admin.keys.task(task_id))
    (b,) = [b for b in buckets(fleet.admin) if b.sig == raw["sig"]]
    head = QueuedTask(task_id, int(raw["seq"]), b.sig, t.priority)
    base, _, heads = sched.reader.read(every=True)
    real = sched.reader.make_view(base, heads)
    view = replace(real, buckets=(replace(b, heads=(head,)),), limit=1)
    rec = Recorder(watch={task_id})
    return place(PROFILES[DEFAULT_STRATEGY], view, rec), rec


def scheduler_plan(sched: TaskScheduler) -> list[Any]:
    """The pairs the scheduler's pass plans (read and planned, not committed)."""
    base, want, heads = sched.reader.read()
    return list(sched.plan_pass(base, want, heads)[1])


def test_explain_and_the_pipeline_agree_on_a_missing_tag_then_on_its_device(
    real_fleet: Any,
) -> None:
    f = real_fleet
    h = f.add_host("h1", ("d1", "android", ("wifi",)))
    tid = f.client.submit("needs a gpu", driver_type="android", tags=["wifi", "gpu"])
    sched = TaskScheduler(f.admin, owner="agree")
    assert sched.try_lead(10_000)

    e = explain(f.admin, tid)
    assert e.reasons[0].code == "missing_tags"
    assert e.reasons[0].detail["missing"] == {"gpu": 1}
    assert (e.counts["of_driver_type"], e.counts["matching"]) == (1, 0)
    pairs, rec = pipeline_record(f, sched, tid)
    assert pairs == []
    got = rec.tasks[tid]
    assert got.outcome == "no_feasible_class"
    assert got.filters.reasons() == {"missing_tag:gpu": 1}
    assert got.filters.devices_with("missing_tag:gpu") == {"d1"}
    # the scheduler's own pass: its plan (the profile over its view), then the commit
    assert scheduler_plan(sched) == []
    assert sched.assign().assigned == 0
    assert f.client.get(tid).status is TaskStatus.queued

    h.heartbeat([DeviceReport("d1", "android", ("wifi", "gpu"))])
    e = explain(f.admin, tid)
    assert (e.counts["matching"], e.counts["idle"]) == (1, 1)
    assert e.reasons[0].code == "waiting_turn"
    pairs, rec = pipeline_record(f, sched, tid)
    assert pairs == [(tid, "d1")]
    got = rec.tasks[tid]
    assert (got.outcome, got.device_id) == ("placed", "d1")
    assert got.filters.rejected == () and got.filters.feasible_devices == ("d1",)
    assert scheduler_plan(sched) == [(tid, "d1")]
    assert sched.assign().assigned == 1
    t = f.client.get(tid)
    assert (t.status, t.device_id) == (TaskStatus.assigned, "d1")
    e = explain(f.admin, tid)
    assert e.status == "assigned" and "device d1" in e.summary
    sched.release()


def test_explain_and_the_pipeline_agree_on_a_driver_type_mismatch(real_fleet: Any) -> None:
    f = real_fleet
    f.add_host("h1", ("i1", "ios", ()))
    tid = f.client.submit("android only", driver_type="android")
    sched = TaskScheduler(f.admin, owner="agree")
    e = explain(f.admin, tid)
    assert e.reasons[0].code == "no_driver_type" and e.counts["of_driver_type"] == 0
    pairs, rec = pipeline_record(f, sched, tid)
    assert pairs == []
    assert rec.tasks[tid].filters.reasons() == {"driver_type_mismatch": 1}
    assert sched.assign().assigned == 0


def test_a_busy_matching_device_is_a_state_blocker_not_a_filter_one(real_fleet: Any) -> None:
    """The filters accept the busy device (explain: matching, busy); the scheduler's view
    does not hold it (not assignable), so the pipeline has nothing to offer."""
    f = real_fleet
    h = f.add_host("h1", ("d1", "android", ()))
    h.heartbeat([DeviceReport("d1", "android", state="busy")])
    tid = f.client.submit("g", driver_type="android")
    sched = TaskScheduler(f.admin, owner="agree")
    e = explain(f.admin, tid)
    assert (e.counts["matching"], e.counts["busy"], e.counts["idle"]) == (1, 1, 0)
    pairs, rec = pipeline_record(f, sched, tid)
    assert pairs == [] and rec.tasks[tid].outcome == "no_feasible_class"
    assert rec.tasks[tid].filters.rejected == ()  # no filter rejected anything: no device
    assert sched.assign().assigned == 0


def test_explain_and_the_gang_placement_agree_role_by_role(real_fleet: Any) -> None:
    """A multi-device task: explain judges each role with the filters the gang placement
    (`deviceq.scheduler.placement.gang`) picks a role's devices with."""
    f = real_fleet
    ha = f.add_host("ha", ("p1", "android", ()))
    f.add_host("hb", ("w1", "browser", ()))
    tid = f.client.submit("both", roles={"phone": "android:sim", "web": "browser"})
    sched = TaskScheduler(f.admin, owner="agree")
    assert sched.try_lead(10_000)
    e = explain(f.admin, tid)
    assert e.summary == "no registered device could run role(s) phone"
    assert (e.counts["phone_matching"], e.counts["web_matching"]) == (0, 1)
    base, _, heads = sched.reader.read()
    devices = sched.reader.make_view(base, heads).devices
    phone = judge(FILTERS, Need("android", frozenset({"sim"})), devices)
    assert phone.feasible == ()
    assert phone.reasons() == {"missing_tag:sim": 1, "driver_type_mismatch": 1}
    assert judge(FILTERS, Need("browser"), devices).feasible_devices == ("w1",)
    assert sched.assign().assigned == 0
    assert f.client.get(tid).status is TaskStatus.queued

    ha.heartbeat([DeviceReport("p1", "android", ("sim",))])
    e = explain(f.admin, tid)
    assert e.summary == "every role has an idle matching device: placed at a coming scheduler pass"
    assert (e.counts["phone_idle"], e.counts["web_idle"]) == (1, 1)
    sched.assign()
    t = f.client.get(tid)
    assert t.status is TaskStatus.assigned
    assert {n: r.device_id for n, r in (t.roles or {}).items()} == {"phone": "p1", "web": "w1"}
    sched.release()
