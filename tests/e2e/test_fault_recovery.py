"""A fault costs a task one attempt, no loop runs away, settings changes and cancels apply at
once, and a device runs one thing at a time, physically (host and scheduler kills, restarts,
and a soak with hosts SIGKILLed every few seconds). Real `deviceq host run` and
`deviceq scheduler run` processes on a private Redis; tasks run the overlap-proving runner
(see bench/support/runlog.py)."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections import Counter
from typing import Any

import pytest
from bench.support import runlog as overlap_runner

from deviceq import FailureKind, TaskStatus
from deviceq.host.runners import Task
from harness import Deployment, RunLog, wait_for
from runner_kinds import KINDS, host_flags


def stubborn(task: Task) -> str:
    """An in-process runner: ``stubborn SECONDS`` ignores its cancellation signal until done;
    ``quick`` takes 0.1 s. Both hold the overlap runner's device and task locks."""
    words = task.goal.split()
    seconds = float(words[1]) if words[0] == "stubborn" else 0.1
    who = f"{task.device_id}/{task.task_id}"
    locks = [overlap_runner.hold("device-" + task.device_id, who),
             overlap_runner.hold("task-" + task.task_id, who)]  # fmt: skip
    overlap_runner.note(f"start {task.device_id} {task.task_id} {who} {time.time():.6f}")
    time.sleep(seconds)
    overlap_runner.note(f"end {task.device_id} {task.task_id} {who} {time.time():.6f}")
    del locks
    return "finished"


async def stubborn_async(task: Task) -> str:
    """`stubborn` as an async runner: ``stubborn SECONDS`` awaits that long, never looking at
    its stop signal."""
    words = task.goal.split()
    seconds = float(words[1]) if words[0] == "stubborn" else 0.1
    who = f"{task.device_id}/{task.task_id}"
    locks = [overlap_runner.hold("device-" + task.device_id, who),
             overlap_runner.hold("task-" + task.task_id, who)]  # fmt: skip
    overlap_runner.note(f"start {task.device_id} {task.task_id} {who} {time.time():.6f}")
    await asyncio.sleep(seconds)
    overlap_runner.note(f"end {task.device_id} {task.task_id} {who} {time.time():.6f}")
    del locks
    return "finished"


STUBBORN = {"thread": "test_fault_recovery:stubborn", "async": "test_fault_recovery:stubborn_async"}


def test_a_dead_hosts_task_is_retried_on_a_live_host_using_one_attempt(
    deploy: Deployment,
) -> None:
    """Case 2: lease_ttl far below host_timeout; the SIGKILLed host still looks alive by its
    heartbeat when the lease expires, but its device is suspect: the retry goes to the live
    host's idle device, and the fault costs exactly one attempt."""
    runlog = RunLog(deploy.tmp / "runs")
    deploy.configure(lease_ttl=2, claim_ttl=2, host_timeout=30)
    deploy.scheduler()
    a = deploy.runner_host("hA", "a1:android", runlog=runlog)
    tid = deploy.client.submit("20", max_attempts=3)
    wait_for(lambda: runlog.starts(tid), 20, "task running on hA")
    b = deploy.runner_host("hB", "b1:android", runlog=runlog)
    wait_for(lambda: deploy.alive("hB"), 20, "hB alive")
    a.send_signal(signal.SIGKILL)
    a.wait(5)
    # the long first run was killed with its daemon; give the retry a short goal to finish
    wait_for(lambda: deploy.status(tid) is TaskStatus.dispatched and
             deploy.client.get(tid).host_id == "hB", 20, "retried on hB")  # fmt: skip
    t = deploy.client.get(tid)
    assert t.attempt == 2 and [x.host_id for x in t.attempts] == ["hA", "hB"]
    assert (t.attempts[0].outcome, t.attempts[0].failure_kind) == ("expired", "lease_expired")
    assert deploy.admin.device("a1").held == "suspect"
    assert deploy.admin.host("hA").suspect and deploy.admin.host("hA").alive
    assert runlog.overlaps() == []
    b.send_signal(signal.SIGTERM)  # hB drains: the 20 s run is handed back, not failed
    assert b.wait(60) == 0


def test_unquarantining_a_device_does_not_start_a_handback_loop(deploy: Deployment) -> None:
    """Case 3: the host learns of a quarantine change at once (it is pushed), a claim never
    hands out an assignment for a quarantined device, and hand-backs are bounded anyway."""
    runlog = RunLog(deploy.tmp / "runs")
    deploy.configure(max_handbacks=5)
    deploy.scheduler()
    deploy.runner_host("h1", "chrome-1:browser", runlog=runlog)
    wait_for(lambda: deploy.alive("h1"), 20, "h1 alive")
    deploy.admin.quarantine("chrome-1")
    wait_for(lambda: "device quarantined" in deploy.log("h1"), 5, "the host told at once")
    tid = deploy.client.submit("0.2", driver_type="browser")
    time.sleep(1.0)
    assert deploy.status(tid) is TaskStatus.queued
    deploy.admin.quarantine("chrome-1", False)
    t = deploy.client.wait(tid, timeout=20)
    assert (t.status, t.attempt, t.handbacks) == (TaskStatus.done, 1, 0)
    events = list(deploy.client.events(task=tid))
    assert len(events) < 10, [e.type for e in events]
    assert "handing the assignment back" not in deploy.log("h1")


@pytest.mark.parametrize("kind", KINDS)
def test_lowering_lease_ttl_on_a_live_pool_does_not_fail_a_healthy_run(
    deploy: Deployment, kind: str
) -> None:
    """Case 4: each lease is as long as the pool says when it is granted or renewed, and the
    host renews at a third of each lease, so a shorter lease_ttl applies at the next renewal."""
    runlog = RunLog(deploy.tmp / "runs")
    deploy.configure(lease_ttl=9, claim_ttl=9)
    deploy.scheduler()
    deploy.runner_host("h1", "d1:android", runlog=runlog, extra=host_flags(kind))
    tid = deploy.client.submit("8", max_attempts=3)
    wait_for(lambda: runlog.starts(tid), 20, "task running")
    # 3 s, not less: the lease watchdog rightly kills a run whose host falls a whole lease
    # behind on renewals, which a CI machine's load can make 1 s do
    deploy.admin.set_config("lease_ttl", 3)

    def shorter_lease() -> bool:
        t = deploy.client.get(tid, attempts=False)
        now = deploy.client.server_time_ms()
        return t.lease_expires_at is not None and t.lease_expires_at - now <= 3200

    wait_for(shorter_lease, 10, "a renewal under the new lease_ttl")
    t = deploy.client.wait(tid, timeout=30)
    assert (t.status, t.attempt) == (TaskStatus.done, 1), t
    assert len(runlog.starts(tid)) == 1 and runlog.overlaps() == []


@pytest.mark.parametrize("kind", KINDS)
def test_a_runner_that_does_not_stop_keeps_its_device_out_of_service(
    deploy: Deployment, kind: str
) -> None:
    """Case 5: an in-process runner (thread or async) ignores its stop request and is
    abandoned; its device is reported busy (reason shown) until the runner really ends, and
    nothing else starts on it."""
    runlog = RunLog(deploy.tmp / "runs")
    deploy.scheduler()
    deploy.host("h1", "d1:android", env=runlog.env, extra=(
        "--goal-runner", STUBBORN[kind], "--isolation", "thread",
        "--task-timeout", "1", "--stop-grace", "0.5"))  # fmt: skip
    slow = deploy.client.submit("stubborn 6", max_attempts=1)
    wait_for(lambda: runlog.starts(slow), 20, "stubborn runner started")
    quick = deploy.client.submit("quick")
    t = deploy.client.wait(slow, timeout=20)
    assert (t.status, t.failure_kind) == (TaskStatus.failed, FailureKind.timeout)
    d = deploy.admin.device("d1")
    assert d.state.value == "busy" and d.reason and "did not stop" in d.reason, d
    assert deploy.status(quick) is TaskStatus.queued
    q = deploy.client.wait(quick, timeout=30)
    assert q.status is TaskStatus.done
    (slow_end,) = runlog.ends(slow)
    (quick_start,) = runlog.starts(quick)
    assert float(quick_start[4]) >= float(slow_end[4])
    assert runlog.overlaps() == [] and runlog.intervals_overlap() == []
    wait_for(lambda: deploy.admin.device("d1").state.value == "idle", 10, "d1 idle again")


@pytest.mark.parametrize("kind", KINDS)
def test_cancel_of_a_running_task_reaches_its_runner_at_once(deploy: Deployment, kind: str) -> None:
    """Case 8: the cancel wakes the host's control wait; the runner is told within a second
    (not at the next renewal, 20 s away with lease_ttl 60)."""
    runlog = RunLog(deploy.tmp / "runs")
    deploy.configure(lease_ttl=60, claim_ttl=60)
    deploy.scheduler()
    deploy.runner_host("h1", "d1:android", runlog=runlog, extra=host_flags(kind))
    tid = deploy.client.submit("30")
    wait_for(lambda: runlog.starts(tid), 20, "task running")
    time.sleep(0.5)
    begun = time.monotonic()
    assert deploy.client.cancel(tid) == "requested"
    t = deploy.client.wait(tid, timeout=10)
    took = time.monotonic() - begun
    assert (t.status, t.failure_kind) == (TaskStatus.cancelled, FailureKind.cancelled)
    assert took < 1.5, f"cancel took {took:.2f}s"


@pytest.mark.parametrize("kind", KINDS)
def test_soak_hosts_killed_every_few_seconds(deploy: Deployment, kind: str) -> None:
    """At least 300 tasks; a random host is SIGKILLed every ~2 s and restarted 0-3 s later;
    lease_ttl (2 s) far below host_timeout (30 s). No task fails lease_expired while live
    matching devices exist, and the runners' locks and log show no device (and no task) ever
    ran two things at once. (max_attempts 8: with 3, one task of 320 could lose all three
    attempts to kills by chance, as a run on a loaded machine showed.)"""
    rng = random.Random(8)
    runlog = RunLog(deploy.tmp / "runs")
    deploy.configure(lease_ttl=2, claim_ttl=2, host_timeout=30, max_attempts=8)
    deploy.scheduler()
    hosts = {f"h{i}": (f"h{i}d1:android", f"h{i}d2:android") for i in range(4)}
    flags = host_flags(kind)
    procs: dict[str, Any] = {h: deploy.runner_host(h, *d, runlog=runlog, extra=flags)
                             for h, d in hosts.items()}  # fmt: skip
    wait_for(lambda: all(deploy.alive(h) for h in hosts), 30, "hosts alive")
    goals = [f"{rng.uniform(0.05, 0.4):.2f}" for _ in range(320)]
    ids = deploy.client.submit_many([{"goal": g, "driver_type": "android"} for g in goals])
    kills = 0
    down: dict[str, float] = {}
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        counts = deploy.client.counts()
        if counts["queued"] + counts["assigned"] + counts["dispatched"] == 0:
            break
        now = time.monotonic()
        for h, back_at in list(down.items()):
            if now >= back_at:
                procs[h] = deploy.runner_host(h, *hosts[h], runlog=runlog, extra=flags)
                del down[h]
        alive = [h for h in hosts if h not in down]
        if len(alive) > 1:
            victim = rng.choice(alive)
            procs[victim].send_signal(signal.SIGKILL)
            procs[victim].wait(5)
            kills += 1
            down[victim] = now + rng.uniform(0.0, 3.0)
        time.sleep(2.0)
    for h in list(down):
        procs[h] = deploy.runner_host(h, *hosts[h], runlog=runlog, extra=flags)
    tasks = deploy.wait_all(ids, timeout=120)
    status = Counter(t.status.value for t in tasks)
    attempts = Counter(t.attempt - t.handbacks for t in tasks)
    expired = sum(1 for t in tasks for a in t.attempts if a.outcome == "expired")
    handed = sum(t.handbacks for t in tasks)
    report = (f"tasks={len(tasks)} kills={kills} status={dict(status)} "
              f"attempts_used={dict(sorted(attempts.items()))} expired={expired} "
              f"handed_back={handed} overlaps={len(runlog.overlaps())}")  # fmt: skip
    print(report)
    assert kills >= 5, report
    assert status == Counter({"done": len(ids)}), report
    assert not any(t.failure_kind is FailureKind.lease_expired for t in tasks), report
    assert runlog.overlaps() == [] and runlog.intervals_overlap() == [], report
    (deploy.tmp.parent / "soak-figures.txt").write_text(report + "\n")


def lock_free(runlog: RunLog, name: str) -> bool:
    """True when no process holds the runner's lock ``name`` (its holder died)."""
    import fcntl

    with open(runlog.folder / f"{name}.lock", "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True


@pytest.mark.parametrize("kind", ["command", "async command", "isolated python"])
def test_a_run_dies_with_its_daemon(deploy: Deployment, kind: str) -> None:
    """A SIGKILLed daemon's runs are killed at once by their watchdog (a command's watchdog
    process, an isolated runner's own thread): they never go on beside the task's retry."""
    runlog = RunLog(deploy.tmp / "runs")
    deploy.scheduler()
    if kind.endswith("command"):
        flags = host_flags("async" if kind.startswith("async") else "thread")
        h = deploy.runner_host("h1", "d1:android", runlog=runlog, extra=flags)
        tid = deploy.client.submit("30")
    else:
        h = deploy.host(
            "h1",
            "d1:android",
            env=runlog.env,
            extra=("--goal-runner", "test_fault_recovery:stubborn", "--isolation", "process"),
        )
        tid = deploy.client.submit("stubborn 30")
    wait_for(lambda: runlog.starts(tid), 30, "run started")
    assert not lock_free(runlog, "device-d1")
    h.send_signal(signal.SIGKILL)
    h.wait(5)
    wait_for(lambda: lock_free(runlog, "device-d1"), 3, "the run killed with its daemon")
    assert not runlog.ends(tid)
