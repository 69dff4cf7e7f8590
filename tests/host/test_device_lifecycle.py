"""Devices leave as a lab retires them: a device missing from its host's report leaves every
transient state at once (no ghost held for ever), ``device remove`` and ``host remove``
refuse while a task runs unless forced, and forcing hands the task back without spending an
attempt. The scripts on the real server, then real daemons."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from deviceq.core.errors import Busy, InvalidInput, NotFound
from deviceq.core.vocabulary import TaskStatus
from deviceq.host.link import DeviceReport
from deviceq.ops.verify import verify
from harness import deviceq, wait_for


def _running(fleet: Any, device: str, host: str = "h1") -> tuple[str, Any]:
    tid = fleet.client.submit("g", driver_type="android")
    fleet.store.commit([(tid, device)])
    (a,) = fleet.host(host).claim(1)
    return tid, a


def test_a_device_dropped_from_the_report_leaves_held_and_checking_at_once(
    real_fleet: Any,
) -> None:
    f = real_fleet
    h = f.add_host("h1", ("p1", "android", ()), ("p2", "android", ()))
    tid, a = _running(f, "p1")
    assert h.report(tid, a.lease_id, "released", "", "not now") == "ok:queued"
    assert f.admin.device("p1").held == "refused"
    # its host drops it (a retired phone): offline, and nothing transient is left behind
    f.r.hset(f.admin.keys.device("p1"), "health", "checking")
    h.heartbeat([DeviceReport("p2", "android")])
    d = f.admin.device("p1")
    assert (d.state.value, d.held, d.health) == ("offline", None, None)
    assert [x.device_id for x in f.admin.devices() if x.state.value == "idle"] == ["p2"]
    from deviceq.core.fleet import effective_state

    host = f.admin.host("h1")
    assert effective_state(d, host) == "offline"
    assert f.r.zscore(f.admin.keys.idle, "p1") is None
    # an unhealthy result and a quarantine are not transient: they stay
    f.r.hset(f.admin.keys.device("p2"), "health", "unhealthy")
    h.heartbeat([])
    assert f.admin.device("p2").health == "unhealthy"
    assert verify(f.admin).ok


def test_device_remove_refuses_a_running_or_reported_device_unless_forced(
    real_fleet: Any,
) -> None:
    f = real_fleet
    h = f.add_host("h1", ("p1", "android", ()), ("p2", "android", ("wifi",)))
    k = f.admin.keys
    tid, a = _running(f, "p1")
    for bad in ("", "../x", "a b"):
        with pytest.raises(InvalidInput):
            f.admin.remove_device(bad)
    with pytest.raises(NotFound):
        f.admin.remove_device("nope")
    with pytest.raises(Busy, match="running task " + tid):
        f.admin.remove_device("p1")
    with pytest.raises(Busy, match="still reported by its live host h1"):
        f.admin.remove_device("p2")
    assert f.admin.device("p1").reserved_by == tid
    # forced: the task goes back to the queue without spending an attempt
    res = f.admin.remove_device("p1", force=True)
    assert res == ("p1", "h1", tid, True)
    t = f.client.get(tid)
    assert t.status == TaskStatus.queued
    assert t.attempts[-1].outcome == "released"
    assert "device p1 removed" in (t.attempts[-1].error or "")
    assert f.r.hget(k.task(tid), "handbacks") == "1"
    for key in (k.device("p1"), k.device_history("p1"), k.device_log("p1")):
        assert not f.r.exists(key)
    assert "p1" not in f.r.smembers(k.devices) and "p1" not in f.r.smembers(k.host_devices("h1"))
    assert f.r.hget(k.drivers, "android") == "1"
    assert f.r.hgetall(k.caps) == {"android|wifi": "1"}
    assert h.renew([(tid, a.lease_id)])[0].lost  # its host is told: the lease is gone
    assert f.r.lrange(k.host_ctl("h1"), 0, -1)[0] == "device_removed"
    assert verify(f.admin).ok
    # a device its host no longer reports goes without --force
    h.heartbeat([DeviceReport("p2", "android", ("wifi",))])
    f.r.hset(k.device("p2"), "state", "offline")
    assert f.admin.remove_device("p2") == ("p2", "h1", None, False)
    assert f.admin.devices() == []
    assert verify(f.admin).ok


def test_host_remove_force_hands_back_what_its_devices_run(real_fleet: Any) -> None:
    f = real_fleet
    f.add_host("h1", ("p1", "android", ()), ("p2", "android", ()))
    tid, _ = _running(f, "p1")
    with pytest.raises(Busy, match="force hands it back"):
        f.admin.remove_host("h1")
    assert f.admin.remove_host("h1", force=True) == 2
    t = f.client.get(tid)
    assert t.status == TaskStatus.queued and t.attempts[-1].outcome == "released"
    assert f.admin.hosts() == [] and f.admin.devices() == []
    assert verify(f.admin).ok


@pytest.mark.slow
def test_a_ghost_after_a_crash_is_offline_and_removable_with_real_daemons(deploy: Any) -> None:
    """A host SIGKILLed while a task runs leaves its device suspect; restarted without that
    device (the phone is gone), the device is offline at once, not suspect for ever, and
    ``device remove`` takes it without --force. Forcing a running device's removal hands its
    task back and the host stops the run."""
    d = deploy
    d.scheduler()
    proc = d.command_host("lab", "p1:android", "p2:android")
    wait_for(lambda: len(d.admin.devices()) == 2 and d.alive("lab"), 30, "host up")
    tid = d.client.submit("sleep 60", driver_type="android", max_attempts=3)
    wait_for(lambda: d.status(tid) == TaskStatus.dispatched, 30, "task running")
    dev = d.client.get(tid, attempts=False).device_id
    other = "p2" if dev == "p1" else "p1"
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    wait_for(lambda: d.admin.device(dev).held == "suspect", 30, "lease expired")
    d.command_host("lab", f"{other}:android", extra=("--takeover",))
    wait_for(lambda: d.admin.device(dev).state.value == "offline", 30, "ghost offline")
    ghost = d.admin.device(dev)
    assert ghost.held is None and ghost.reserved_by in (None, "")
    show = deviceq(d.url, d.pool, "device", "show", dev, "--json")
    assert '"effective_state": "offline"' in show.stdout
    # the retried task runs on the remaining device; removing that one needs --force
    wait_for(lambda: d.client.get(tid, attempts=False).device_id == other
             and d.status(tid) == TaskStatus.dispatched, 30, "retry running")  # fmt: skip
    busy = deviceq(d.url, d.pool, "device", "remove", other)
    assert busy.returncode != 0 and f"running task {tid}" in busy.stderr
    typo = deviceq(d.url, d.pool, "device", "remove", "p 1")
    assert typo.returncode != 0 and "invalid device id" in typo.stderr
    gone = deviceq(d.url, d.pool, "device", "remove", dev)
    assert gone.returncode == 0, gone.stderr
    assert f"removed device {dev} of host lab" in gone.stdout
    forced = deviceq(d.url, d.pool, "device", "remove", other, "--force")
    assert forced.returncode == 0, forced.stderr
    assert f"task {tid} handed back" in forced.stdout
    assert "registered again" in forced.stderr  # its live host still reports it
    # the host stops the run at once, then re-registers the device; the task runs again
    t = wait_for(
        lambda: (x := d.client.get(tid)).attempts[-2:][0].outcome == "released" and x,
        30,
        "handed back",
    )
    assert t.attempts[-1].attempt >= t.attempts[-2].attempt
    wait_for(lambda: any(x.device_id == other for x in d.admin.devices()), 30, "re-registered")
    d.client.cancel(tid)
    wait_for(lambda: d.status(tid) == TaskStatus.cancelled, 30, "cancelled")
    time.sleep(0.5)
    assert verify(d.admin).ok, verify(d.admin).findings


@pytest.mark.slow
def test_the_flaky_phone_of_a_three_phone_lab_is_quarantined_with_real_daemons(
    deploy: Any,
) -> None:
    """3 phones, one of which fails every run as infrastructure (exit 75): at the default
    max_quarantine_fraction 0.25 none could be quarantined; now the flaky one is, after
    quarantine_after failures, and the rest of the queue runs on the other two."""
    d = deploy
    d.configure(quarantine_after=3)
    d.scheduler()
    d.host("lab", "p1:android", "p2:android", "p3:android", extra=(
        "--goal-runner", "command", "--infra-exit-code", "75",
        "--command", "sh -c 'test {device_id} != p1 || exit 75; sleep 0.3'",
    ))  # fmt: skip
    wait_for(lambda: len(d.admin.devices()) == 3 and d.alive("lab"), 30, "host up")
    ids = [d.client.submit(f"case {i}", driver_type="android", max_attempts=1) for i in range(9)]
    done = d.wait_all(ids, 60)
    failed = [t for t in done if t.status == TaskStatus.failed]
    assert {t.failure_kind.value for t in failed if t.failure_kind} == {"infrastructure"}
    assert {t.device_id for t in failed} == {"p1"}
    assert len(failed) == 3, [(t.device_id, t.status) for t in done]
    p1 = d.admin.device("p1")
    assert p1.quarantined and p1.quarantine_reason == "3 consecutive infrastructure failures"
    assert not d.admin.device("p2").quarantined and not d.admin.device("p3").quarantined
    assert verify(d.admin).ok, verify(d.admin).findings
