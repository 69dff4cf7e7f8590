"""Priority classes and preemption on real Redis: the scheduler's decision (the shortest-running
preemptible task of a strictly lower priority on a matching device), preempt.lua's atomic
re-checks, the host's side through renew / report (``preempted``: queued again at its place,
no attempt used, no device failure), and the hand-over only once the preempted run has ended."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import Fleet
from deviceq import TaskScheduler
from deviceq.core.errors import Fenced, InvalidInput, NotFound
from deviceq.host.link import Report


def busy_lab(
    fleet: Fleet, n: int = 3, cls: str = "nightly"
) -> tuple[TaskScheduler, dict[str, str]]:
    """A host h1 with phones p1..pn, each running a task of class ``cls`` (claimed): returns
    the leading scheduler and device -> task."""
    fleet.admin.add_priority_class("nightly", 1, grace=5)
    fleet.admin.add_priority_class("pinned", 1, preemptible=False)
    fleet.admin.add_priority_class("release-blocker", 9, preempts=True)
    fleet.admin.add_priority_class("urgent-pinned", 5, preempts=True, preemptible=False)
    fleet.add_host("h1", *[(f"p{i}", "android", ("wifi",)) for i in range(1, n + 1)])
    sched = TaskScheduler(fleet.admin)
    assert sched.try_lead()
    running = {}
    for i in range(n):
        tid = fleet.client.submit(f"nightly {i}", driver_type="android", priority_class=cls)
        sched.assign()
        running[fleet.client.get(tid).device_id] = tid
    assert len(fleet.host("h1").claim(n)) == n
    return sched, running


def renewals(fleet: Fleet, *tids: str) -> dict[str, str]:
    h = fleet.host("h1")
    leases = [(t, fleet.client.get(t).lease_id or "") for t in tids]
    return {r.task_id: r.status for r in h.renew(leases)}


def test_priority_class_add_list_remove_and_submit(fleet: Fleet) -> None:
    fleet.admin.add_priority_class(
        "release-blocker", 9, preempts=True, preemptible=False, grace=2.5
    )
    fleet.admin.add_priority_class("nightly", 1)
    assert [(c.name, c.priority, c.preempts, c.preemptible, c.grace)
            for c in fleet.admin.priority_classes()] == [
        ("release-blocker", 9, True, False, 2.5), ("nightly", 1, False, True, 30.0)]  # fmt: skip
    tid = fleet.client.submit("x", priority_class="release-blocker")
    raw = fleet.r.hgetall(fleet.admin.keys.task(tid))
    assert (raw["class"], raw["priority"]) == ("release-blocker", "9")
    with pytest.raises(NotFound, match="no priority class 'nope'"):
        fleet.client.submit("x", priority_class="nope")
    with pytest.raises(InvalidInput, match="contradicts"):
        fleet.client.submit("x", priority_class="nightly", priority=4)
    with pytest.raises(InvalidInput, match="priority must be"):
        fleet.admin.add_priority_class("bad", 10)
    with pytest.raises(InvalidInput, match="priority above 0"):
        fleet.admin.add_priority_class("bad", 0, preempts=True)
    assert fleet.admin.remove_priority_class("nightly")
    assert not fleet.admin.remove_priority_class("nightly")
    assert [c.name for c in fleet.admin.priority_classes()] == ["release-blocker"]


def test_urgent_task_preempts_the_shortest_running_and_gets_its_device_after_the_stop(
    real_fleet: Fleet,
) -> None:
    fleet = real_fleet
    sched, running = busy_lab(fleet)
    newest = running["p3"]  # assigned last: it has run the shortest
    urgent = fleet.client.submit(
        "release smoke", driver_type="android", priority_class="release-blocker"
    )
    res = sched.assign()
    assert res.preemptions == [(urgent, newest, "p3")]
    v = fleet.client.get(newest)
    assert v.status.value == "dispatched" and v.attempt == 1  # still running: in its grace
    # its host learns it at the next renewal (and is told at once on its control list)
    assert renewals(fleet, *running.values())[newest] == "preempt:5000"
    assert fleet.r.lrange(fleet.admin.keys.host_ctl("h1"), 0, -1) == ["preempt"]
    # nothing is given p3 while the run has not stopped, and no second preemption for it
    res = sched.assign()
    assert (res.assigned, res.preempted) == (0, 0)
    assert fleet.client.get(urgent).status.value == "queued"
    # the run stopped: reported preempted -> queued again, attempt not used, device free
    assert fleet.host("h1").report_many(
        [Report(newest, v.lease_id or "", "preempted", None, "stopped (signal 15)")]
    ) == ["ok:queued"]
    v = fleet.client.get(newest)
    assert v.status.value == "queued"
    assert fleet.r.hget(fleet.admin.keys.task(newest), "preempted_by") == urgent
    assert v.attempts[-1].outcome == "preempted"
    assert fleet.r.hget(fleet.admin.keys.device("p3"), "consecutive_failures") in (None, "0")
    res = sched.assign()
    assert res.handed_over == 1
    u = fleet.client.get(urgent)
    assert (u.status.value, u.device_id) == ("assigned", "p3")
    assert fleet.r.hget(fleet.admin.keys.device("p3"), "preempt_for") is None
    assert fleet.r.zcard(fleet.admin.keys.preempt_handover) == 0


def test_preempted_attempt_is_not_used_up(real_fleet: Fleet) -> None:
    fleet = real_fleet
    fleet.admin.add_priority_class("nightly", 1)
    fleet.admin.add_priority_class("release-blocker", 9, preempts=True)
    fleet.add_host("h1", ("p1", "android", ()))
    sched = TaskScheduler(fleet.admin)
    assert sched.try_lead()
    victim = fleet.client.submit("n", priority_class="nightly", max_attempts=1,
                                 retry_on="runner_failed")  # fmt: skip
    sched.assign()
    (a,) = fleet.host("h1").claim(1)
    urgent = fleet.client.submit("u", priority_class="release-blocker")
    assert sched.assign().preempted == 1
    fleet.host("h1").report(victim, a.lease_id, "preempted")
    fleet.host("h1").report(urgent, sched.assign().assignments[0][2], "failed", "runner_failed")
    # the victim runs again: its one attempt was not used by the preemption
    sched.assign()
    (b,) = fleet.host("h1").claim(1)
    assert (b.task.id, b.attempt) == (victim, 2)
    assert fleet.host("h1").report(victim, b.lease_id, "failed", "runner_failed") == "ok:failed"


def test_never_preempted(real_fleet: Fleet) -> None:
    """Not-preemptible classes, tasks without a class, equal priorities, booked devices."""
    fleet = real_fleet
    sched, running = busy_lab(fleet, 2, cls="pinned")
    urgent = fleet.client.submit("u", driver_type="android", priority_class="release-blocker")
    assert sched.assign().preempted == 0
    assert (
        fleet.store.preempt(urgent, running["p1"], "p1", sched.epoch)
        == "err:victim_not_preemptible"
    )
    plain = fleet.client.submit("plain")  # no class: never preempts (an idle device: none)
    assert fleet.store.preempt(plain, running["p1"], "p1", sched.epoch) == "err:urgent_no_class"
    mid = fleet.client.submit("m", driver_type="android", priority_class="urgent-pinned")
    assert (
        fleet.store.preempt(mid, running["p1"], "p1", sched.epoch) == "err:victim_not_preemptible"
    )


def test_preempt_script_checks(real_fleet: Fleet) -> None:
    fleet = real_fleet
    sched, running = busy_lab(fleet, 2)
    urgent = fleet.client.submit("u", driver_type="android", priority_class="release-blocker")
    ios = fleet.client.submit("i", driver_type="ios", priority_class="release-blocker")
    same = fleet.client.submit("s", driver_type="android", priority_class="nightly")
    p = fleet.store.preempt
    e = sched.epoch
    assert e is not None
    with pytest.raises(Fenced):
        p(urgent, running["p1"], "p1", e + 1)
    with pytest.raises(InvalidInput):
        p(urgent, running["p1"], "p1", "")
    assert p(urgent, running["p1"], "p2", e) == "err:victim_not_on_device"
    assert p(ios, running["p1"], "p1", e) == "err:driver_type_mismatch"
    assert p(same, running["p1"], "p1", e) == "err:urgent_cannot_preempt"
    fleet.admin.set_config("max_preemptions_per_minute", 1)
    assert p(urgent, running["p1"], "p1", e) == "ok"
    assert p(urgent, running["p2"], "p2", e) == "err:urgent_pending"
    other = fleet.client.submit("u2", driver_type="android", priority_class="release-blocker")
    assert p(other, running["p1"], "p1", e) == "err:victim_in_grace"
    assert p(other, running["p2"], "p2", e) == "err:rate_limited"
    fleet.admin.set_config("max_preemptions_per_minute", 10)
    fleet.r.hset(fleet.admin.keys.task(running["p2"]), "preemptions", "3")
    assert p(other, running["p2"], "p2", e) == "err:victim_preempted_enough"
    fleet.r.hset(fleet.admin.keys.task(running["p2"]), "preemptions", "0")
    fleet.admin.set_config("max_preemptions_per_task", 0)
    assert p(other, running["p2"], "p2", e) == "err:victim_preempted_enough"


def test_a_preempted_run_whose_host_dies_is_recovered_by_expiry(real_fleet: Fleet) -> None:
    fleet = real_fleet
    fleet.admin.set_config("lease_ttl", 1)
    sched, running = busy_lab(fleet, 1)
    urgent = fleet.client.submit("u", driver_type="android", priority_class="release-blocker")
    assert sched.assign().preempted == 1
    import time

    time.sleep(1.3)  # the host died: no report, the lease runs out
    sched.assign()
    assert fleet.client.get(running["p1"]).status.value == "queued"
    assert fleet.client.get(urgent).status.value == "queued"  # p1 is suspect until h1 beats
    fleet.beat("h1")
    res = sched.assign()
    assert res.handed_over == 1
    assert fleet.client.get(urgent).device_id == "p1"


def test_explain_task_show_events_and_metric(real_fleet: Fleet) -> None:
    from deviceq.cli.render import task_text
    from deviceq.core.task_record import read_task, task_json
    from deviceq.ops.explain import explain

    fleet = real_fleet
    sched, running = busy_lab(fleet, 2)
    pinned = fleet.client.submit("p", driver_type="ios", priority_class="release-blocker")
    urgent = fleet.client.submit("u", driver_type="android", priority_class="release-blocker")
    e = explain(fleet.admin, urgent)
    assert f"it will preempt task {running['p2']} on p2" in e.summary
    assert "no running task can be preempted" not in e.summary
    assert "no device of driver type ios" in explain(fleet.admin, pinned).summary
    res = sched.assign()
    assert res.preemptions == [(urgent, running["p2"], "p2")]
    assert f"it preempted task {running['p2']} on p2" in explain(fleet.admin, urgent).summary
    data = task_json(*read_task(fleet.r, fleet.admin.keys, running["p2"]))
    assert data is not None and data["preempted_by"] == urgent
    assert f"being preempted by {urgent}" in task_text(data)
    lease = data["lease_id"]
    fleet.host("h1").report(running["p2"], lease, "preempted")
    data = task_json(*read_task(fleet.r, fleet.admin.keys, running["p2"]))
    assert data is not None
    assert (data["preempted_by"], data["preemptions"]) == (urgent, 1)
    assert data["attempts"][-1]["outcome"] == "preempted"
    assert data["attempts"][-1]["preempted_by"] == urgent
    assert f"preempted by {urgent}" in task_text(data)
    events = [ev for ev in fleet.client.events() if ev.type == "preempted"]
    assert [(ev.fields["task"], ev.fields["by"], ev.fields["device"]) for ev in events] == [
        (running["p2"], urgent, "p2")
    ]
    # a second urgent task: the only other run is not preemptible any more (in its grace no
    # longer; p1's task is of class nightly, but the rate limit is reached)
    fleet.admin.set_config("max_preemptions_per_minute", 1)
    other = fleet.client.submit("u2", driver_type="android", priority_class="release-blocker")
    sched.assign()  # the hand-over of p2
    assert "max_preemptions_per_minute 1" in explain(fleet.admin, other).summary
    fleet.admin.set_config("max_preemptions_per_minute", 10)
    fleet.admin.add_priority_class("nightly", 1, preemptible=False)
    assert "no running task can be preempted" in explain(fleet.admin, other).summary


def test_the_dashboard_marks_both_tasks(real_fleet: Fleet, redis_url: str) -> None:
    import threading
    import time
    import urllib.request

    import uvicorn

    from deviceq import Client
    from deviceq.dashboard import create_app
    from harness import free_port

    fleet = real_fleet
    sched, running = busy_lab(fleet, 1)
    urgent = fleet.client.submit("u", driver_type="android", priority_class="release-blocker")
    assert sched.assign().preempted == 1
    victim = running["p1"]
    port = free_port()
    app = create_app(Client(redis_url, fleet.pool))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline, "the dashboard did not start"
            time.sleep(0.05)

        def get(path: str) -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
                return str(resp.read().decode())

        assert f'id="preempting" href="/tasks/{victim}"' in get(f"/tasks/{urgent}")
        assert f'id="preempted-by" href="/tasks/{urgent}"' in get(f"/tasks/{victim}")
        rows = get("/tasks")
        assert f'title="preempting task {victim}"' in rows
        assert f'title="preempted by task {urgent}"' in rows
    finally:
        server.should_exit = True
        thread.join(10)


def test_the_command_line(cli: Any, real_r: Any, pool: str) -> None:
    import json

    from deviceq.core.keys import Keys

    out = cli("priority-class", "add", "release-blocker", "--priority", "9", "--preempts",
              "--not-preemptible", "--grace", "2.5")  # fmt: skip
    assert out.exit_code == 0, out.output
    assert "priority 9, preempts lower priorities, not preemptible" in out.output
    assert cli("priority-class", "add", "nightly", "--priority", "1").exit_code == 0
    listed = json.loads(cli("priority-class", "list", "--json").output)
    assert [(c["name"], c["priority"], c["preempts"], c["preemptible"], c["grace"])
            for c in listed] == [("release-blocker", 9, True, False, 2.5),
                                 ("nightly", 1, False, True, 30.0)]  # fmt: skip
    table = cli("priority-class", "list").output
    assert table.splitlines()[0].split() == ["NAME", "PRIORITY", "PREEMPTS", "PREEMPTIBLE", "GRACE"]
    tid = cli("submit", "hello", "--class", "release-blocker").output.strip().splitlines()[-1]
    assert real_r.hget(Keys(pool).task(tid), "class") == "release-blocker"
    shown = json.loads(cli("task", "show", tid, "--json").output)
    assert (shown["priority_class"], shown["priority"]) == ("release-blocker", 9)
    added = cli("schedule", "add", "nightly-run", "soak", "--cron", "@daily", "--class", "nightly",
                "--json")  # fmt: skip
    assert added.exit_code == 0 and json.loads(added.output)["spec"]["priority_class"] == "nightly"
    # bad input: one line, exit 2, nothing written
    before = real_r.hgetall(Keys(pool).pclasses)
    for args in (("add", "x", "--priority", "10"), ("add", "x"), ("add", "bad name", "--priority",
                 "1"), ("add", "x", "--priority", "0", "--preempts"), ("add", "x", "--priority",
                 "1", "--grace", "-1")):  # fmt: skip
        res = cli("priority-class", *args)
        assert res.exit_code == 2, (args, res.output)
    assert real_r.hgetall(Keys(pool).pclasses) == before
    res = cli("submit", "x", "--class", "nope")
    assert res.exit_code != 0 and "no priority class 'nope'" in res.output
    assert cli("priority-class", "remove", "nightly").exit_code == 0
    assert cli("priority-class", "remove", "nightly").exit_code != 0
