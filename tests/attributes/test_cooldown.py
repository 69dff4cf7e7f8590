"""A cooldown gate (``deviceq gate add settle --cooldown S``) holds a device S seconds after
each run on it ends, whatever the outcome: held at the release itself (the scheduler never
sees it idle meanwhile), shown as ``cooling N s``, let go by the scheduler's tick with no
operator, never a quarantine or a failure."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from conftest import Fleet
from deviceq import TaskScheduler
from deviceq.core.errors import InvalidInput
from deviceq.core.fleet import device_reason
from deviceq.ops.gates import add_gate, gates, remove_gate


@pytest.fixture
def phones(real_fleet: Fleet) -> Fleet:
    f = real_fleet
    f.add_host("h1", ("p1", "android", ()), ("w1", "web", ()))
    return f


def idle(f: Fleet) -> set[str]:
    return {str(d) for d in f.r.zrange(f.admin.keys.idle, 0, -1)}


def events(f: Fleet, kind: str) -> list[dict[str, str]]:
    return [e for _, e in f.r.xrange(f.admin.keys.events) if e.get("type") == kind]


def run_once(f: Fleet, device: str, outcome: str = "done") -> str:
    tid = f.client.submit("x", driver_type="android" if device == "p1" else "web")
    (ok,) = f.store.commit([(tid, device)])
    assert ok.startswith("ok:"), ok
    h = f.host("h1")
    (a,) = h.claim(1)
    kind = {"failure_kind": "runner_failed"} if outcome == "failed" else {}
    assert h.report(tid, a.lease_id, outcome, **kind).startswith("ok:")
    return tid


@pytest.mark.parametrize("outcome", ["done", "failed"])
def test_a_device_cools_after_each_run_and_the_scheduler_lets_it_go(
    phones: Fleet, outcome: str
) -> None:
    f = phones
    g, held = add_gate(f.admin, "settle", [], cooldown=1, driver_type="android")
    assert held == 0 and g.cooldown == 1 and gates(f.admin)[0].cooldown == 1
    run_once(f, "p1", outcome)
    p1 = f.admin.device("p1")
    assert p1.gated == "settle" and p1.gated_reason == "cooling 1 s" and p1.cool_until
    assert "p1" not in idle(f) and not p1.quarantined
    assert "settle: cooling" in (device_reason(p1, "gated") or "")
    assert events(f, "device_gated")[-1]["gate"] == "settle"
    # the scheduler offers it nothing meanwhile; the commit refuses it
    tid = f.client.submit("y", driver_type="android")
    sched = TaskScheduler(f.r, f.pool)
    assert sched.assign().assigned == 0
    assert f.store.commit([(tid, "p1")]) == ["err:device_gated"]
    # a web device: not this gate's
    run_once(f, "w1")
    assert f.admin.device("w1").gated is None and "w1" in idle(f)
    time.sleep(1.1)
    res = sched.assign()  # its tick lets p1 go, then places y on it
    assert res.assigned == 1 and f.admin.device("p1").reserved_by == tid
    assert [e["device"] for e in events(f, "device_ungated")] == ["p1"]
    assert f.admin.device("p1").gated is None and f.admin.device("p1").cool_until is None
    assert f.r.zcard(f.admin.keys.cooling) == 0
    assert f.admin.device("p1").consecutive_failures == 0  # (a runner failure is no fault)


def test_cooldown_with_when_and_removing_the_gate(phones: Fleet) -> None:
    f = phones
    f.admin.set_attributes("p1", {"temperature": 30})
    add_gate(f.admin, "hot-settle", ["temperature>=40"], cooldown=60)
    run_once(f, "p1")  # cool: no cooldown
    assert f.admin.device("p1").gated is None and "p1" in idle(f)
    # hot within 60 s of its last run: held (its attributes are checked at each change)
    f.admin.set_attributes("p1", {"temperature": 41})
    assert f.admin.device("p1").gated == "hot-settle" and "p1" not in idle(f)
    assert f.r.zcard(f.admin.keys.cooling) == 1
    assert remove_gate(f.admin, "hot-settle") == 1
    assert f.admin.device("p1").gated is None and "p1" in idle(f)
    assert f.r.zcard(f.admin.keys.cooling) == 0


def test_bad_cooldowns_change_nothing(phones: Fleet) -> None:
    f = phones
    for bad in (0, -1, 86_401):
        with pytest.raises(InvalidInput, match="cooldown"):
            add_gate(f.admin, "c", [], cooldown=bad)
    with pytest.raises(InvalidInput, match="no --until"):
        add_gate(f.admin, "c", ["a>1"], ["a<1"], cooldown=5)
    with pytest.raises(InvalidInput, match="--cooldown"):
        add_gate(f.admin, "c", [])
    assert gates(f.admin) == []
    with pytest.raises(Exception, match="cooldown"):  # the script checks it too
        f.admin._run("gate_set", ["add", "c", json.dumps(
            {"when_c": "", "until_c": "", "driver_type": "", "cooldown": 1.5}), "16"])  # fmt: skip
    assert gates(f.admin) == []


def test_cli_cooldown_gate(phones: Fleet, cli: Any) -> None:
    out = cli("gate", "add", "settle", "--cooldown", "30", "--driver-type", "android")
    assert out.exit_code == 0, out.output
    listed = json.loads(cli("gate", "list", "--json").stdout)
    assert listed[0]["cooldown"] == 30 and listed[0]["when"] == []
    assert "30 s after each run" in cli("gate", "list").stdout
    run_once(phones, "p1")
    row = {r["device_id"]: r for r in json.loads(cli("device", "list", "--json").stdout)}["p1"]
    assert row["effective_state"] == "gated" and "settle: cooling" in row["why"]
    assert cli("gate", "add", "x", "--cooldown", "0").exit_code == 2
    assert cli("gate", "add", "x", "--cooldown", "5", "--until", "a>1").exit_code == 2
