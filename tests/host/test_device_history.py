"""A device's history: the last 20 attempt ends on it (``device:ID:history``, written by the
Lua scripts when an attempt ends) and its quarantine, health check and booking changes
(``device:ID:log``), shown by ``device show``; ``task list --device/--host`` and ``events
--device/--host``; and a quarantine with a reason (``device quarantine --reason``). Real Redis
throughout; the end-to-end test runs real scheduler and host daemons."""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from deviceq import TaskStatus
from deviceq.cli.context import actor
from deviceq.core.errors import InvalidInput
from deviceq.ops.verify import verify
from harness import CLI, Deployment, deviceq, free_port, wait_for

WHO = actor() or "operator"  # who the command line acts as ('' not recorded: "operator")

# the daemons import this tree's deviceq (and so run its Lua), not an installed copy


def run_one(d: Deployment, goal: str, driver: str, **kw: Any) -> str:
    """Submit one task and wait for it to end (so the tasks end in submission order)."""
    tid = d.client.submit(goal, driver_type=driver, **kw)
    t = d.client.wait(tid, timeout=60)
    assert t.status.terminal, t
    return tid


def page(url: str) -> str:
    """A dashboard page's HTML ('' while it does not answer)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - a local server
            return str(resp.read().decode())
    except OSError:
        return ""


def listed(res: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert res.returncode == 0, res.stderr
    out: list[dict[str, Any]] = json.loads(res.stdout)
    return out


class Follower:
    """``deviceq events --follow --json ARGS`` as a process; its lines, parsed, as they come."""

    def __init__(self, d: Deployment, *args: str) -> None:
        self.lines: list[dict[str, Any]] = []
        self.proc = subprocess.Popen(
            [*CLI, "--redis-url", d.url, "--pool", d.pool, "events", "--follow", "--json", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(json.loads(line))

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self.reader.join(10)


def test_a_devices_attempts_tasks_and_events_and_a_quarantine_reason(
    deploy: Deployment, tmp_path: Path, cli: Any
) -> None:
    d = deploy
    d.spawn("scheduler", "scheduler", "run", "--tick", "0.2")
    d.command_host("h1", "d1:x")
    d.command_host("h2", "d2:y")
    wait_for(lambda: {"d1", "d2"} <= {x.device_id for x in d.admin.devices()}, 20, "devices")
    t1 = run_one(d, "true", "x")
    t2 = run_one(d, "exit 3", "x", max_attempts=1)
    t3 = run_one(d, "true", "x")
    t4 = run_one(d, "true", "y")
    assert d.status(t2) == TaskStatus.failed and d.status(t3) == TaskStatus.done

    # device show: the attempts that ended on d1, newest first
    show = json.loads(deviceq(d.url, d.pool, "device", "show", "d1", "--json").stdout)
    recent = show["recent_attempts"]
    assert [(e["task"], e["attempt"], e["outcome"], e["failure_kind"]) for e in recent] == [
        (t3, 1, "done", None),
        (t2, 1, "failed", "runner_failed"),
        (t1, 1, "done", None),
    ]
    whens = [e["when"] for e in recent]
    assert whens == sorted(whens, reverse=True) and whens[-1] > 0
    assert set(recent[0]) == {"task", "attempt", "outcome", "failure_kind", "when"}
    text = deviceq(d.url, d.pool, "device", "show", "d1").stdout
    assert f"{t2} attempt 1: failed (runner_failed)" in text and "history: none" in text
    other = json.loads(deviceq(d.url, d.pool, "device", "show", "d2", "--json").stdout)
    assert [e["task"] for e in other["recent_attempts"]] == [t4]

    # task list --device / --host: exactly those tasks, combined with the other filters
    def ids(*args: str) -> set[str]:
        return {t["id"] for t in listed(deviceq(d.url, d.pool, "task", "list", "--json", *args))}

    assert ids("--device", "d1") == {t1, t2, t3}
    assert ids("--host", "h1") == {t1, t2, t3}
    assert ids("--device", "d2") == ids("--host", "h2") == {t4}
    assert ids("--device", "d1", "--status", "failed") == {t2}
    assert ids("--device", "d1", "--host", "h2") == set()
    assert ids("--device", "nowhere") == set()

    # events --device / --host: only that device's / host's events
    def events(*args: str) -> list[dict[str, Any]]:
        return listed(deviceq(d.url, d.pool, "events", "--json", "--since", "0-0", *args))

    on_d1 = events("--device", "d1")
    assert on_d1 and all(e["device_id"] == "d1" for e in on_d1)
    assert {(e["type"], e.get("task_id")) for e in on_d1} >= {
        ("assigned", t1), ("done", t1), ("failed", t2), ("done", t3)}  # fmt: skip
    on_h2 = events("--host", "h2")
    assert on_h2 and all(e["host_id"] == "h2" for e in on_h2)
    assert ("done", t4) in {(e["type"], e.get("task_id")) for e in on_h2}
    assert not any(e.get("task_id") in (t1, t2, t3) for e in on_h2)
    assert all(e["device_id"] == "d1" and e["host_id"] == "h1"
               for e in events("--device", "d1", "--host", "h1"))  # fmt: skip

    # a quarantine with a reason: stored, shown, in the event and the device's history;
    # followers of d1 / h1 see it, not d2's quarantine that came first
    by_device, by_host = Follower(d, "--device", "d1"), Follower(d, "--host", "h1")
    try:
        res = deviceq(d.url, d.pool, "device", "quarantine", "d2")
        assert res.returncode == 0, res.stderr
        res = deviceq(d.url, d.pool, "device", "quarantine", "d1", "--reason", "cracked screen")
        assert res.returncode == 0, res.stderr
        for f in (by_device, by_host):
            wait_for(lambda f=f: any(e["type"] == "device_quarantined" for e in f.lines), 20,
                     "the quarantine event")  # fmt: skip
        assert all(e["device_id"] == "d1" for e in by_device.lines)
        assert all(e["host_id"] == "h1" for e in by_host.lines)
        (q,) = [e for e in by_device.lines if e["type"] == "device_quarantined"]
        assert (q["reason"], q["by"]) == ("cracked screen", WHO)
    finally:
        by_device.close()
        by_host.close()
    rows = listed(deviceq(d.url, d.pool, "device", "list", "--json"))
    why = {r["device_id"]: r["why"] for r in rows}
    assert why == {"d1": "cracked screen", "d2": "operator"}  # no --reason: operator
    assert "cracked screen" in deviceq(d.url, d.pool, "device", "list").stdout
    show = json.loads(deviceq(d.url, d.pool, "device", "show", "d1", "--json").stdout)
    assert show["quarantine_reason"] == "cracked screen" and show["why"] == "cracked screen"
    (h,) = show["history"]
    assert (h["event"], h["reason"], h["by"]) == ("quarantined", "cracked screen", WHO)
    assert h["when"] >= recent[0]["when"]
    text = deviceq(d.url, d.pool, "device", "show", "d1").stdout
    assert f"quarantined  by={WHO} reason=cracked screen" in text
    # the dashboard's fleet grid (a device's tooltip) and a host's device table show it
    port = free_port()
    d.spawn("dashboard", "dashboard", "--port", str(port))
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: page(base + "/healthz"), 20, "the dashboard")
    grid = page(base + "/fleet")
    assert 'data-device="d1"' in grid and "quarantined · cracked screen" in grid
    table = page(base + "/fleet?host=h1")
    assert "<td>cracked screen</td>" in table

    # bad ids and a bad reason: exit 2, one line, nothing changed (in process: the same
    # command line, without a fresh interpreter per case)
    before = d.admin.redis.hgetall(d.admin.keys.device("d1"))
    stream_len = d.admin.redis.xlen(d.admin.keys.events)
    for args in (
        ("task", "list", "--device", "bad id"),
        ("task", "list", "--host", "../h1"),
        ("events", "--device", "d1:x"),
        ("events", "--host", "h 1"),
        ("events", "--follow", "--device=-bad"),
        ("device", "show", "d1 "),
        ("device", "quarantine", "d1*", "--reason", "x"),
        ("device", "quarantine", "d1", "--reason", "two\nlines"),
        ("device", "quarantine", "d1", "--reason", "tab\there"),
        ("device", "quarantine", "d1", "--reason", "é" * 101),  # 202 bytes
    ):
        res = cli(*args)
        assert res.exit_code == 2, (args, res.stdout, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1, (args, res.stderr)
    assert d.admin.redis.hgetall(d.admin.keys.device("d1")) == before
    assert d.admin.redis.xlen(d.admin.keys.events) == stream_len
    assert len(d.admin.device_past("d1")[1]) == 1

    # unquarantined: the history has both, newest first; d1 takes work again
    res = deviceq(d.url, d.pool, "device", "unquarantine", "d1")
    assert res.returncode == 0, res.stderr
    t5 = run_one(d, "true", "x")
    show = json.loads(deviceq(d.url, d.pool, "device", "show", "d1", "--json").stdout)
    assert [e["event"] for e in show["history"]] == ["unquarantined", "quarantined"]
    assert [e["task"] for e in show["recent_attempts"]] == [t5, t3, t2, t1]
    assert verify(d.admin).ok


def test_the_history_keeps_the_last_20_and_the_log_records_bookings_and_health(
    real_fleet: Any,
) -> None:
    f = real_fleet
    h = f.add_host("h1", ("d1", "x", ()), ("d2", "x", ()))
    done = []
    for i in range(22):
        tid = f.client.submit(f"t{i}", driver_type="x")
        assert f.store.commit([(tid, "d1")])[0].startswith("ok:")
        (a,) = h.claim(1)
        outcome = ("done", "") if i % 2 else ("failed", "runner_failed")
        h.report(tid, a.lease_id, outcome[0], outcome[1] or None)
        done.append((tid, outcome[0]))
    recent, log = f.admin.device_past("d1")
    assert [(e["task"], e["outcome"]) for e in recent] == list(reversed(done))[:20]
    assert f.r.llen(f.admin.keys.device_history("d1")) == 20
    assert log == []
    # a hand-back (refused) and a cancel are attempt ends too
    tid = f.client.submit("refused", driver_type="x", max_attempts=1)
    (lease,) = f.store.commit([(tid, "d2")])
    h.release(tid, lease.removeprefix("ok:"), "not now")
    f.beat("h1")
    tid2 = f.client.submit("cancelled", driver_type="x")
    assert f.store.commit([(tid2, "d2")])[0].startswith("ok:")
    f.client.cancel(tid2)
    recent, _ = f.admin.device_past("d2")
    assert [(e["task"], e["outcome"], e["failure_kind"]) for e in recent] == [
        (tid2, "cancelled", "cancelled"), (tid, "released", None)]  # fmt: skip
    # booking, health and quarantine changes go to the log, newest first
    f.beat("h1")
    f.admin.reserve("d2", 60_000, "alice")
    f.admin.extend("d2", 1000)
    f.admin.release("d2")
    assert h.health_begin("d2") is True
    h.health_end("d2", False, "out", "no usb")
    f.admin.quarantine("d2", True, "flaky usb")
    f.admin.quarantine("d2", True, "again")  # already quarantined: nothing changes
    _, log = f.admin.device_past("d2")
    got = [(e["event"], e.get("by"), e.get("reason") or e.get("result")) for e in log]
    assert got == [
        ("quarantined", "operator", "flaky usb"),
        ("health", None, "no usb"),
        ("released", "alice", None),
        ("booked", "alice", None),
        ("booked", "alice", None),
    ]
    assert log[3]["extended"] is True and log[1]["result"] == "unhealthy"
    assert all(e["at"] > 0 for e in log)
    assert f.admin.device("d2").quarantine_reason == "flaky usb"
    # the script checks the reason itself (before any write), like the Python API
    for bad in ("a\x01b", "x" * 201, b"\xff"):
        with pytest.raises(InvalidInput):
            f.admin._run("device_quarantine", ["d1", "1", bad])
    with pytest.raises(InvalidInput):
        f.admin.quarantine("d1", True, "x" * 201)
    assert not f.admin.device("d1").quarantined
    assert f.admin.device_past("d1")[1] == []
    assert verify(f.admin).ok
