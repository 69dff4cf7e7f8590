"""Preemption with the real daemons and the command runner: the preempted run gets its
class's grace after SIGTERM (a run that needs less ends on its own; one that needs more is
killed), its attempt ends ``preempted`` and the urgent task starts on the device after it."""

from __future__ import annotations

from pathlib import Path

from harness import Deployment, wait_for

# on SIGTERM the shell's trap takes 1 s more before it exits by itself; MARK is made once the
# trap is set (a stop that came before it would kill the shell outright)
TRAPPING = "trap 'sleep 1; exit 0' TERM; touch MARK; sleep 600 & wait"


def test_the_class_grace_is_the_runs_time_to_stop(deploy: Deployment, tmp_path: Path) -> None:
    deploy.configure(lease_ttl=10)  # (a run stopping keeps its lease: longer than the grace)
    deploy.admin.add_priority_class("patient", 1, grace=5)
    deploy.admin.add_priority_class("hasty", 1, grace=0.3)
    deploy.admin.add_priority_class("release-blocker", 9, preempts=True)
    deploy.scheduler()
    deploy.command_host("h1", "p1:android")
    c = deploy.client
    for cls, signal_seen in (("patient", "signal 0"), ("hasty", "signal 9")):
        mark = tmp_path / f"trap-set-{cls}"
        victim = c.submit(TRAPPING.replace("MARK", str(mark)), driver_type="android",
                          priority_class=cls)  # fmt: skip
        wait_for(mark.exists, 60, "the run to set its trap")
        urgent = c.submit("echo urgent", driver_type="android", priority_class="release-blocker")
        done = c.wait(urgent, timeout=60)
        assert done.status.value == "done" and done.device_id == "p1"
        v = c.get(victim)
        first = v.attempts[0]
        assert (first.outcome, v.preempted_by) == ("preempted", urgent)
        assert signal_seen in (first.error or ""), first.error  # ended by itself / killed
        assert first.ended_at is not None and done.dispatched_at is not None
        assert first.ended_at <= done.dispatched_at  # the device went on only after the stop
        assert v.status.value in ("queued", "assigned", "dispatched")
        c.cancel(victim)
        wait_for(lambda v=victim: deploy.status(v).value == "cancelled", 60, "the cancel")
