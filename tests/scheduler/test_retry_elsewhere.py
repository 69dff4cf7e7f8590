"""A flaky device does not fail good tasks: real scheduler and host daemons on a private Redis,
two devices, one flaky (its runs end in an infrastructure failure: the command runner's
``--infra-exit-code``). A retry after that failure waits for the other matching device while
it is busy (``explain`` says so) and runs there; it returns to the flaky device at once only
when that device is the pool's only match."""

from __future__ import annotations

from deviceq import TaskStatus
from harness import Deployment, deviceq, wait_for

# the flaky device's runs fail as the rig's fault (exit 75), the good one's succeed
GOAL = 'if [ "$DEVICEQ_DEVICE_ID" = flaky ]; then exit 75; fi; echo ran on $DEVICEQ_DEVICE_ID'


def test_a_retry_after_a_device_fault_waits_for_another_device(deploy: Deployment) -> None:
    d = deploy
    d.configure(retry_elsewhere_wait=60)
    d.command_host("h1", "flaky:x:f", "good:x:g", extra=("--infra-exit-code", "75"))
    d.scheduler()
    wait_for(lambda: len(d.admin.devices()) == 2, 30, "both devices registered")
    blocker = d.client.submit("sleep 6", driver_type="x", tags=["g"])  # keeps good busy
    wait_for(lambda: d.status(blocker) is TaskStatus.dispatched, 30, "good busy")
    tid = d.client.submit(GOAL, driver_type="x", max_attempts=3)

    def waiting() -> str:
        t = d.client.get(tid)
        if (
            t.attempts
            and t.attempts[0].failure_kind == "infrastructure"
            and t.status.value == "queued"
        ):
            out = deviceq(d.url, d.pool, "explain", tid).stdout
            return (
                out if "for a device other than flaky it failed on" in " ".join(out.split()) else ""
            )
        return ""

    said = wait_for(waiting, 30, "the retry waiting for another device, said by explain")
    assert "waiting up to" in " ".join(said.split())
    t = d.client.wait(tid, timeout=60)
    assert (t.status, t.device_id, t.attempt) == (TaskStatus.done, "good", 2), t
    assert [a.device_id for a in t.attempts] == ["flaky", "good"]
    assert d.client.wait(blocker, timeout=30).status is TaskStatus.done
    # waited for good: the second attempt began once the blocker ended
    assert t.attempts[1].assigned_at >= d.client.get(blocker).attempts[0].ended_at

    # the flaky device is the only match: the retries return to it at once (no wait)
    only = d.client.submit(GOAL, driver_type="x", tags=["f"], max_attempts=3)
    t = d.client.wait(only, timeout=60)
    assert (t.status, t.attempt) == (TaskStatus.failed, 3), t
    assert {a.device_id for a in t.attempts} == {"flaky"}
    assert t.attempts[-1].ended_at - t.attempts[0].assigned_at < 20_000
