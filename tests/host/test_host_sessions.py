"""One live daemon per host id (a second daemon, a takeover, a stopped process), end to end with
real `deviceq host run` and `deviceq scheduler run` processes on a private Redis. Every task
here runs the overlap-proving runner: a per-device and a per-task ``flock`` that a second
concurrent run would find taken."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deviceq import TaskStatus
from deviceq.host.session import owner_dead, owner_id
from harness import Deployment, RunLog, wait_for
from runner_kinds import KINDS, host_flags


def started(runlog: RunLog, task: str, n: int = 1) -> bool:
    return len(runlog.starts(task)) >= n


def test_a_second_daemon_for_a_live_host_is_refused_and_the_first_keeps_working(
    deploy: Deployment,
) -> None:
    runlog = RunLog(deploy.tmp / "runs")
    deploy.scheduler()
    first = deploy.runner_host("lab-2", "emu-1:android", runlog=runlog)
    tid = deploy.client.submit("4")
    wait_for(lambda: started(runlog, tid), 20, "task running on the first daemon")
    second = deploy.runner_host("lab-2", "emu-1:android", runlog=runlog, name="second")
    assert second.wait(20) == 2
    err = deploy.log("second").strip().splitlines()
    assert len(err) == 1, err
    assert "already has a live daemon" in err[0] and "--takeover" in err[0]
    # the second daemon recovered nothing and ran nothing: the task runs once, to the end
    t = deploy.client.wait(tid, timeout=20)
    assert (t.status, t.attempt, t.handbacks) == (TaskStatus.done, 1, 0)
    assert len(runlog.starts(tid)) == 1 and runlog.overlaps() == []
    # the refused daemon left no drain behind: the first one keeps taking work
    host = deploy.admin.host("lab-2")
    assert not host.draining and not host.stopping
    nxt = deploy.client.submit("0.1")
    assert deploy.client.wait(nxt, timeout=20).status is TaskStatus.done
    assert first.poll() is None


def test_takeover_fences_the_old_daemon_which_stops_its_runners_and_exits(
    deploy: Deployment,
) -> None:
    runlog = RunLog(deploy.tmp / "runs")
    deploy.configure(lease_ttl=3, claim_ttl=3)
    deploy.scheduler()
    old = deploy.runner_host("lab-2", "emu-1:android", runlog=runlog, name="old")
    tid = deploy.client.submit("6", max_attempts=3)
    wait_for(lambda: started(runlog, tid), 20, "task running on the old daemon")
    new = deploy.runner_host("lab-2", "emu-1:android", runlog=runlog, name="new",
                             extra=("--takeover",))  # fmt: skip
    # the old daemon is told at once: it stops its runner, reports nothing, exits 3
    assert old.wait(10) == 3
    assert "another daemon took over host lab-2" in deploy.log("old")
    t = deploy.client.wait(tid, timeout=40)
    assert t.status is TaskStatus.done and t.attempt == 2
    # its attempt came back through lease expiry, and ran again only after the first runner
    # was gone: never twice at once on emu-1
    assert [a.outcome for a in t.attempts] == ["expired", "done"]
    assert len(runlog.starts(tid)) == 2 and runlog.ends(tid) and runlog.overlaps() == []
    assert runlog.intervals_overlap() == []
    assert new.poll() is None
    assert deploy.admin.host("lab-2").session is not None


def test_restart_after_sigkill_takes_over_at_once_and_keeps_an_operators_drain(
    deploy: Deployment,
) -> None:
    runlog = RunLog(deploy.tmp / "runs")
    deploy.configure(lease_ttl=60, claim_ttl=60)  # recovery must not wait for expiry
    deploy.scheduler()
    h = deploy.runner_host("h1", "d1:android", runlog=runlog)
    tid = deploy.client.submit("30")
    wait_for(lambda: started(runlog, tid), 20, "task running")
    assert deploy.admin.drain("h1") == "draining"  # an operator's drain
    h.send_signal(signal.SIGKILL)
    h.wait(5)
    begun = time.monotonic()
    h = deploy.runner_host("h1", "d1:android", runlog=runlog)
    # the dead daemon's attempt is handed back at once (its runner died with it) ...
    wait_for(lambda: deploy.status(tid) is TaskStatus.queued, 15, "attempt handed back")
    assert time.monotonic() - begun < 10
    # ... but the operator's drain holds across the restart: nothing new runs here
    time.sleep(1.0)
    assert deploy.status(tid) is TaskStatus.queued and deploy.admin.host("h1").draining
    deploy.admin.drain("h1", False)
    t = deploy.client.wait(tid, timeout=60)
    assert (t.status, t.attempt) == (TaskStatus.done, 2)
    assert [a.outcome for a in t.attempts] == ["released", "done"]
    assert runlog.overlaps() == []
    assert h.poll() is None


def test_a_removed_host_or_a_rotated_token_stops_its_daemon(deploy: Deployment) -> None:
    deploy.scheduler()
    runlog = RunLog(deploy.tmp / "runs")
    h1 = deploy.runner_host("h1", "d1:android", runlog=runlog)
    h2 = deploy.runner_host("h2", "d2:android", runlog=runlog)
    # started, not only alive: a host removed between its first heartbeat and the end of its
    # start-up is refused at start (exit 2, "cannot start"), not revoked while running
    wait_for(
        lambda: all("host worker started" in deploy.log(h) for h in ("h1", "h2")),
        20,
        "hosts started",
    )
    assert deploy.admin.remove_host("h1") == 1
    assert h1.wait(10) == 4
    lines = [x for x in deploy.log("h1").splitlines() if " error " in x]
    assert any("not registered" in x for x in lines), lines
    assert deploy.log("h1").count("claim refused") == 0
    deploy.admin.rotate_token("h2")
    assert h2.wait(10) == 4
    assert "wrong token for host h2" in deploy.log("h2")


@pytest.mark.parametrize("kind", KINDS)
def test_a_frozen_host_never_runs_its_old_task_beside_the_new_holder(
    deploy: Deployment, kind: str
) -> None:
    """SIGSTOP a host daemon past its lease, then resume it: its runner was killed by the lease
    watchdog before the lease ended, the task ran elsewhere, and nothing overlapped."""
    runlog = RunLog(deploy.tmp / "runs")
    deploy.configure(lease_ttl=2, claim_ttl=2, host_timeout=30)
    deploy.scheduler()
    a = deploy.runner_host("hA", "a1:android", runlog=runlog, extra=host_flags(kind))
    tid = deploy.client.submit("8", max_attempts=3)
    wait_for(lambda: started(runlog, tid), 20, "task running on hA")
    deploy.runner_host("hB", "b1:android", runlog=runlog)
    wait_for(lambda: deploy.alive("hB"), 20, "hB alive")
    a.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: started(runlog, tid, 2), 20, "the task running again on hB")
        time.sleep(1.0)
    finally:
        a.send_signal(signal.SIGCONT)
    t = deploy.client.wait(tid, timeout=30)
    assert (t.status, t.host_id, t.attempt) == (TaskStatus.done, "hB", 2)
    assert runlog.overlaps() == [] and runlog.intervals_overlap() == []
    assert not runlog.ends(tid)[0][1].startswith("a"), "hA's run never finished"
    wait_for(lambda: "not reported" in deploy.log("hA"), 10, "hA noticed its lost lease")
    assert a.poll() is None  # hA itself goes on (its session is still its own)


def test_a_late_report_from_a_frozen_host_is_rejected(deploy: Deployment) -> None:
    """The run ends while its daemon is frozen; the daemon resumes after the lease expired and
    the task was retried elsewhere: its late outcome changes nothing. Once resumed, the daemon's
    report and its lease renewal race: the report is rejected by the script, or the renewal
    learns first that the lease is gone and the outcome is not reported at all."""
    runlog = RunLog(deploy.tmp / "runs")
    deploy.configure(lease_ttl=2, claim_ttl=2, host_timeout=30)
    deploy.scheduler()
    a = deploy.runner_host("hA", "a1:android", runlog=runlog)
    tid = deploy.client.submit("1", max_attempts=3)
    wait_for(lambda: started(runlog, tid), 20, "task running on hA")
    a.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: runlog.ends(tid), 10, "hA's run ended (its daemon frozen)")
        deploy.runner_host("hB", "b1:android", runlog=runlog)
        t = deploy.client.wait(tid, timeout=30)
        assert (t.status, t.host_id, t.attempt) == (TaskStatus.done, "hB", 2)
    finally:
        a.send_signal(signal.SIGCONT)
    wait_for(
        lambda: any(m in deploy.log("hA") for m in ("rejected:", "not reported")),
        15,
        "hA's late report rejected or withheld",
    )
    t2 = deploy.client.get(tid)
    assert (t2.status, t2.host_id, t2.attempt, t2.result) == (t.status, "hB", 2, t.result)
    assert runlog.overlaps() == []


def test_a_sigkilled_daemon_not_yet_reaped_counts_as_gone() -> None:
    """Restarted right after a SIGKILL, a daemon finds its predecessor a zombie (exited, not
    yet waited for by its parent): that session is replaced at once, not taken for live."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        owner = owner_id(child.pid)
        assert not owner_dead(owner)
        child.send_signal(signal.SIGKILL)
        wait_for(lambda: Path(f"/proc/{child.pid}/stat").read_text().split(")")[1].split()[0]
                 == "Z", 10, "the killed child a zombie")  # fmt: skip
        assert owner_dead(owner)  # (still unreaped: this test is its parent and has not waited)
    finally:
        child.kill()
        child.wait()
    assert owner_dead(owner)
