"""Fewer round trips per task, on a host daemon: a run's report also claims the assignments
waiting for the host's free devices and the daemon starts them at once; the renewals due
before the next heartbeat ride on it (no renew call of their own), while a lease shorter than
three heartbeat intervals is still renewed on time by the renew loop; and a SIGKILLed
daemon's leases, renewed by its heartbeats until then, still expire."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import pytest

from deviceq import TaskStatus
from deviceq.host.daemon import HostWorker
from deviceq.host.runners import RunnerSpec, Task
from deviceq.host.settings import WorkerSettings
from harness import Deployment, wait_for
from runner_kinds import KINDS, host_flags

RELEASE: dict[str, threading.Event] = {}


def held(task: Task) -> str:
    """A runner that runs until its goal's event is set (a goal ``quick`` ends at once)."""
    if task.goal != "quick":
        RELEASE.setdefault(task.goal, threading.Event()).wait(60)
    return f"ran {task.goal}"


def _worker(deploy: Deployment, devices: list[str], **kw: Any) -> tuple[HostWorker, Any]:
    token = deploy.admin.add_host("h1")
    settings = WorkerSettings("h1", devices, RunnerSpec("test_round_trips_host:held"),
                              grace=5, poll_interval=0.5, isolation="thread", **kw)  # fmt: skip
    worker = HostWorker(deploy.url, deploy.pool, settings, token)
    t = threading.Thread(target=worker.run, daemon=True)
    t.start()
    wait_for(lambda: deploy.alive("h1"), 20, "h1 alive")
    return worker, t


def _stop(worker: HostWorker, t: threading.Thread) -> None:
    for ev in RELEASE.values():
        ev.set()
    worker.stop()
    t.join(20)


def test_a_report_claims_the_next_assignment_and_the_host_starts_it(
    deploy: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The main loop's own claims are taken away once the first run started: the second
    assignment can only reach the host through the first run's report."""
    RELEASE["first"] = threading.Event()
    worker, t = _worker(deploy, ["d1:sim", "d2:sim"])
    try:
        first = deploy.client.submit("first")
        assert deploy.store.commit([(first, "d1")])[0].startswith("ok:")
        wait_for(lambda: deploy.status(first) is TaskStatus.dispatched, 20, "the first run")
        main_claims: list[int] = []

        def no_claim(*args: Any) -> list[Any]:
            main_claims.append(1)
            return []

        def wait_only(timeout: float, max_count: int) -> list[Any]:
            worker.waiter.wait_for_work(timeout)
            return no_claim()

        monkeypatch.setattr(worker.host, "claim", no_claim)
        monkeypatch.setattr(worker.waiter, "wait_and_claim", wait_only)
        worker.host.nudge()  # (ends the wait and claim in flight: the next ones claim nothing)
        wait_for(lambda: bool(main_claims), 10, "the main loop's next wait")
        nxt = deploy.client.submit("quick")
        assert deploy.store.commit([(nxt, "d2")])[0].startswith("ok:")
        time.sleep(0.3)  # (the main loop woke for it, and claimed nothing)
        assert deploy.status(nxt) is TaskStatus.assigned
        RELEASE["first"].set()  # its report claims `nxt`, which runs and is reported
        done = deploy.client.wait(nxt, timeout=20)
        assert done.status is TaskStatus.done and done.result == "ran quick"
        assert done.host_id == "h1" and done.device_id == "d2" and done.attempt == 1
        assert deploy.status(first) is TaskStatus.done
        assert worker.executor.reporter.claimed >= 1
    finally:
        _stop(worker, t)


def _counting(monkeypatch: pytest.MonkeyPatch, obj: Any, name: str) -> list[Any]:
    calls: list[Any] = []
    real = getattr(obj, name)

    def counted(*args: Any, **kw: Any) -> Any:
        calls.append((args, kw))
        return real(*args, **kw)

    monkeypatch.setattr(obj, name, counted)
    return calls


def test_renewals_ride_on_the_heartbeat_and_keep_a_lease_past_its_length(
    deploy: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    deploy.configure(lease_ttl=3, claim_ttl=3)
    RELEASE["long"] = threading.Event()
    worker, t = _worker(deploy, ["d1:sim"], heartbeat_interval=0.3)
    renews = _counting(monkeypatch, worker.host, "renew")
    beats = _counting(monkeypatch, worker.host, "heartbeat_call")
    try:
        tid = deploy.client.submit("long")
        assert deploy.store.commit([(tid, "d1")])[0].startswith("ok:")
        wait_for(lambda: deploy.status(tid) is TaskStatus.dispatched, 20, "the run")
        time.sleep(4.5)  # 1.5 lease lengths: renewed (on heartbeats), still running
        task = deploy.client.get(tid)
        assert task.status is TaskStatus.dispatched and task.attempt == 1
        key = deploy.admin.keys.task(tid)
        assert deploy.r.hget(key, "renewed_at")
        assert renews == []  # none of its own: each rode on a heartbeat
        assert any(kw.get("leases") for _, kw in beats)  # (a heartbeat carried the lease)
        RELEASE["long"].set()
        assert deploy.client.wait(tid, timeout=20).status is TaskStatus.done
    finally:
        _stop(worker, t)


def test_a_lease_shorter_than_the_heartbeats_is_renewed_without_waiting_for_one(
    deploy: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Heartbeats every 30 s, leases of 3 s (renewed a second in): the renew loop renews them
    on time; none waits for the heartbeat."""
    deploy.configure(lease_ttl=3, claim_ttl=3)
    RELEASE["long2"] = threading.Event()
    worker, t = _worker(deploy, ["d1:sim"], heartbeat_interval=30)
    renews = _counting(monkeypatch, worker.host, "renew")
    try:
        tid = deploy.client.submit("long2")
        assert deploy.store.commit([(tid, "d1")])[0].startswith("ok:")
        wait_for(lambda: deploy.status(tid) is TaskStatus.dispatched, 20, "the run")
        time.sleep(4.5)
        task = deploy.client.get(tid)
        assert task.status is TaskStatus.dispatched and task.attempt == 1
        assert len(renews) >= 2
        RELEASE["long2"].set()
        assert deploy.client.wait(tid, timeout=20).status is TaskStatus.done
    finally:
        _stop(worker, t)


@pytest.mark.parametrize("kind", KINDS)
def test_a_killed_daemons_leases_renewed_by_heartbeats_still_expire(
    deploy: Deployment, kind: str
) -> None:
    deploy.configure(lease_ttl=2, claim_ttl=2, host_timeout=30)
    deploy.scheduler()
    a = deploy.command_host("hA", "a1:android", env={"DQ_SLEEP": "30"},
                            extra=("--heartbeat-interval", "0.2", *host_flags(kind)))  # fmt: skip
    tid = deploy.client.submit("sleep $DQ_SLEEP", max_attempts=1)
    wait_for(lambda: deploy.status(tid) is TaskStatus.dispatched, 20, "running on hA")
    key = deploy.admin.keys.task(tid)
    wait_for(lambda: bool(deploy.r.hget(key, "renewed_at")), 10, "a renewal (on a heartbeat)")
    a.send_signal(signal.SIGKILL)
    a.wait(5)
    t = deploy.client.wait(tid, timeout=30)
    assert t.status is TaskStatus.failed and t.failure_kind == "lease_expired"
    assert (t.attempts[0].outcome, t.attempts[0].failure_kind) == ("expired", "lease_expired")
