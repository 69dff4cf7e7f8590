"""Scheduling controls: `deviceq pause` / `resume` (a paused pool assigns nothing new: the
scheduler skips its passes and assign.lua / gang_assign.lua refuse a fenced batch, while
running tasks go on; a manual dispatch still works; status shows it) and `task retry --rerun`
(a done task run again as a new task)."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from deviceq import TaskStatus
from harness import Deployment, deviceq, wait_for


def test_a_paused_pool_runs_what_runs_and_assigns_nothing_new(deploy: Deployment) -> None:
    d = deploy
    d.scheduler()
    d.command_host("h1", "d1:x", "d2:x")
    running = d.client.submit("sleep 2; echo finished", driver_type="x")
    wait_for(lambda: d.status(running) == TaskStatus.dispatched, 30, "the first task running")
    out = deviceq(d.url, d.pool, "pause", "--reason", "lab power work")
    assert out.returncode == 0 and "paused: nothing new is assigned" in out.stdout, out.stderr
    assert "already paused" in deviceq(d.url, d.pool, "pause").stdout
    waiting = d.client.submit("echo second", driver_type="x")
    # the running task ends normally; the new one stays queued though d2 (then d1) is idle
    t = d.client.wait(running, timeout=30)
    assert t.status == TaskStatus.done and "finished" in (t.result or "")
    time.sleep(2)
    assert d.status(waiting) == TaskStatus.queued
    shown = deviceq(d.url, d.pool, "status")
    assert re.search(r"PAUSED( by \S+)? \(lab power work\)", shown.stdout), shown.stdout
    why = json.loads(deviceq(d.url, d.pool, "explain", waiting, "--json").stdout)
    assert why["summary"].startswith("the pool is paused (lab power work); then: ")
    assert why["reasons"][0]["code"] == "pool_paused", why["reasons"]
    assert why["reasons"][0]["detail"]["reason"] == "lab power work"
    data = json.loads(deviceq(d.url, d.pool, "status", "--json").stdout)
    assert data["paused"]["reason"] == "lab power work" and data["paused"]["at"] > 0
    out = deviceq(d.url, d.pool, "resume")
    assert out.returncode == 0 and "resumed" in out.stdout
    assert d.client.wait(waiting, timeout=30).status == TaskStatus.done
    assert "was not paused" in deviceq(d.url, d.pool, "resume").stdout
    status = json.loads(deviceq(d.url, d.pool, "status", "--json").stdout)
    assert status["paused"] is None


def test_a_fenced_commit_is_refused_while_paused_and_a_manual_dispatch_is_not(
    real_fleet: Any,
) -> None:
    f = real_fleet
    f.add_host("h1", ("d1", "x", ()), ("d2", "x", ()))
    epoch = f.store.lead("sched-a", 30_000).epoch
    a = f.client.submit("one", driver_type="x")
    b = f.client.submit("two", driver_type="x")
    assert f.admin.pause("maintenance") == "paused"
    assert f.store.commit([(a, "d1"), (b, "d2")], epoch) == ["err:pool_paused"] * 2
    assert f.client.get(a).status == TaskStatus.queued
    assert f.store.commit([(a, "d1")])[0].startswith("ok:")  # an operator's dispatch
    assert f.admin.resume() == "resumed"
    assert f.store.commit([(b, "d2")], epoch)[0].startswith("ok:")
    kinds = [x["type"] for _, x in f.r.xrange(f.admin.keys.events)]
    assert "pool_paused" in kinds and "pool_resumed" in kinds


def test_task_retry_rerun_runs_a_done_task_again(deploy: Deployment) -> None:
    d = deploy
    d.scheduler()
    d.command_host("h1", "d1:x")
    tid = d.client.submit("echo pass", driver_type="x", priority=3)
    assert d.client.wait(tid, timeout=30).status == TaskStatus.done
    refused = deviceq(d.url, d.pool, "task", "retry", tid)
    assert refused.returncode != 0 and "(a done task with --rerun)" in refused.stderr
    out = deviceq(d.url, d.pool, "task", "retry", "--rerun", tid, "--json")
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)
    assert row["retry_of"] == tid and row["id"] != tid and row["task"]["priority"] == 3
    assert d.client.wait(row["id"], timeout=30).status == TaskStatus.done
    assert d.client.get(tid).status == TaskStatus.done  # the old task is not changed


def test_a_delayed_task_waits_then_runs_and_bad_times_are_refused(deploy: Deployment) -> None:
    d = deploy
    d.scheduler()
    d.command_host("h1", "d1:x")
    # (6 s: the checks below run before it is due, with room for a slow, busy machine)
    out = deviceq(d.url, d.pool, "submit", "echo later", "--driver-type", "x", "--delay", "6s")
    assert out.returncode == 0, out.stderr
    tid = out.stdout.strip()
    t = d.client.get(tid)
    assert t.eligible_at is not None
    assert t.status == TaskStatus.queued or d.admin.server_time_ms() >= t.eligible_at, t
    soon = d.client.submit("echo now", driver_type="x")  # submitted after, runs first
    assert d.client.wait(soon, timeout=30).status == TaskStatus.done
    time.sleep(1)
    status, now = d.status(tid), d.admin.server_time_ms()  # (in this order)
    # the device is idle, the task not yet due: still queued (unless a slow machine took
    # past its time meanwhile)
    assert status == TaskStatus.queued or now >= t.eligible_at, (status, now, t.eligible_at)
    done = d.client.wait(tid, timeout=30)
    assert done.status == TaskStatus.done
    assert done.assigned_at is not None and done.assigned_at >= t.eligible_at
    # a time in the past: at once; ISO times; bad input refused with nothing queued
    past = deviceq(d.url, d.pool, "submit", "echo past", "--driver-type", "x",
                   "--not-before", "2020-01-01T00:00:00Z")  # fmt: skip
    assert d.client.wait(past.stdout.strip(), timeout=30).status == TaskStatus.done
    before = d.client.counts()
    for args, why in [
        (("--delay", "3s", "--not-before", "2030-01-01T00:00:00Z"), "not both"),
        (("--not-before", "tomorrow"), "not an ISO 8601 time"),
        (("--delay", "ten"), "not a duration"),
        (("--not-before", "2999-01-01T00:00:00Z"), "at most a year ahead"),
    ]:
        bad = deviceq(d.url, d.pool, "submit", "echo x", "--driver-type", "x", *args)
        assert bad.returncode != 0 and why in bad.stderr, (args, bad.stderr)
    assert d.client.counts() == before


def test_set_priority_moves_a_queued_task_to_its_new_bucket(
    real_fleet: Any, redis_url: str
) -> None:
    from deviceq import TaskScheduler
    from deviceq.ops.verify import verify

    f = real_fleet
    f.add_host("h1", ("d1", "x", ()))
    first = f.client.submit("first", driver_type="x")
    second = f.client.submit("second", driver_type="x")
    urgent = f.client.submit("urgent", driver_type="x")
    out = deviceq(redis_url, f.pool, "task", "set-priority", urgent, "9")
    assert out.returncode == 0 and f"{urgent} priority 9" in out.stdout, out.stderr
    assert f.admin.set_priority([urgent, second], 9) == {urgent: "same", second: "ok"}
    assert f.client.get(urgent).priority == 9
    assert verify(f.admin).ok  # buckets, heads and indexes still agree
    sched = TaskScheduler(f.admin, strategy="priority_match")
    res = sched.assign()
    # one device: the oldest task of the highest priority gets it (second, then urgent)
    assert [a[0] for a in res.assignments] == [second]
    assert f.admin.set_priority([second, "nope"], 1) == {
        second: "err:task_not_queued",
        "nope": "err:task_not_found",
    }
    bad = deviceq(redis_url, f.pool, "task", "set-priority", first, "12")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert f.client.get(first).priority == 0
    assert verify(f.admin).ok
