"""Reservations: a person books an idle device for a while (``deviceq reserve``);
the scheduler never sees it until the reservation ends (``deviceq release`` or by itself, in
the scheduler's expiry scan). Real Redis throughout; the end-to-end test runs real daemons."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from deviceq import PoolAdmin
from deviceq.core.errors import AlreadyExists, Busy, InvalidInput, NotFound
from deviceq.core.events import read_events
from deviceq.ops.explain import explain
from deviceq.ops.verify import verify
from harness import Deployment, deviceq, wait_for


def events(admin: PoolAdmin) -> list[dict[str, str]]:
    return [dict(f) for _, f in admin.redis.xrange(admin.keys.events, count=10_000)]  # type: ignore[union-attr]


def event_types(admin: PoolAdmin) -> list[str]:
    return [e["type"] for e in events(admin)]


def idle(admin: PoolAdmin) -> set[str]:
    return set(admin.redis.zrange(admin.keys.idle, 0, -1))  # type: ignore[arg-type]


# -- end to end: real scheduler and host daemons -------------------------------------------------
def test_reservation_blocks_scheduler_expires_and_the_waiting_task_runs(
    deploy: Deployment, cli: Any
) -> None:
    d = deploy
    d.scheduler()
    d.command_host("h1", "d1:x")
    wait_for(lambda: "d1" in idle(d.admin), 20, "d1 idle")
    # (8 s: the checks below run while it holds, with room for a slow, busy machine)
    before = d.admin.server_time_ms()
    out = deviceq(d.url, d.pool, "reserve", "d1", "--for", "8s", "--note", "alice: flashing")
    assert out.returncode == 0, out.stderr
    assert "reserved for 'alice: flashing' until" in out.stdout
    show = json.loads(cli("device", "show", "d1", "--json").stdout)
    assert show["reserved_by"] == "alice: flashing" and show["effective_state"] == "booked"
    until = show["reserved_until"]
    assert before + 8000 <= until <= d.admin.server_time_ms() + 8000 and show["task_id"] is None

    tid = d.client.submit("true", driver_type="x")
    time.sleep(1.0)  # several scheduler passes (tick 0.2 s): none may take d1
    assert d.client.get(tid).status.value == "queued"
    exp = explain(d.admin, tid)
    assert exp.counts["booked"] == 1
    (booked,) = [r for r in exp.reasons if r.code == "booked"]
    assert (
        booked.detail["reserved_until"] == until
        and booked.detail["reserved_by"] == "alice: flashing"
    )
    assert "only run on reserved device" in exp.summary
    text = cli("explain", tid).stdout
    assert "[booked]" in text and "reservation ends at" in text
    listed = json.loads(cli("device", "list", "--json").stdout)
    assert listed[0]["reservation"]["reserved_until"] == until
    status = json.loads(cli("status", "--json").stdout)
    assert status["devices"]["by_state"]["booked"] == 1
    assert status["reservations"][0]["reserved_by"] == "alice: flashing"

    done = d.client.wait(tid, timeout=20)
    assert done.status.value == "done", done
    task = d.client.get(tid)
    assert task.device_id == "d1"
    assigned_at = int(d.r.hget(d.admin.keys.task(tid), "assigned_at"))  # type: ignore[attr-defined,arg-type]
    assert assigned_at >= until  # not before the reservation ended
    assert assigned_at - until < 5000  # the scheduler's expiry tick freed it promptly
    types = event_types(d.admin)
    assert types.index("device_reserved") < types.index("reservation_expired")
    assert types.index("reservation_expired") < types.index("assigned")
    assert d.admin.reservation("d1") is None
    assert verify(d.r, d.pool).ok


# -- the transition, on real Redis ----------------------------------------------------------------
def test_reserve_extend_release_and_their_refusals(real_fleet: Any) -> None:
    f = real_fleet
    f.add_host("h1", ("d1", "android", ("wifi",)), ("d2", "android", ()), ("d3", "ios", ()))
    a = f.admin
    r = a.reserve("d1", 60_000, "alice")
    assert (r.reserved_by, r.host_id) == ("alice", "h1")
    assert "d1" not in idle(a)
    assert a.device("d1").reserved_by is None  # the lease field is untouched
    with pytest.raises(AlreadyExists, match="extend"):
        a.reserve("d1", 60_000, "bob")
    longer = a.extend("d1", 3_600_000)
    assert longer.reserved_until == r.reserved_until + 3_600_000 and longer.reserved_by == "alice"
    assert a.extend("d1", 1000, "alice and bob").reserved_by == "alice and bob"
    assert int(a.redis.zscore(a.keys.bookings, "d1")) == longer.reserved_until + 1000  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="7 days"):
        a.extend("d1", 7 * 86_400_000)
    # the scheduler's commit refuses it; a heartbeat does not bring it back
    tid = f.client.submit("x", tags=["wifi"])
    assert f.store.commit([(tid, "d1")]) == ["err:device_booked"]
    f.beat()
    assert "d1" not in idle(a)
    # unquarantine does not bring it back either
    a.quarantine("d1")
    a.quarantine("d1", False)
    assert "d1" not in idle(a)
    assert verify(f.r, f.pool).ok

    assert a.release("d1") == "h1"
    assert "d1" in idle(a) and a.reservation("d1") is None
    with pytest.raises(NotFound, match="not reserved"):
        a.release("d1")
    with pytest.raises(NotFound):
        a.extend("d1", 1000)
    with pytest.raises(NotFound):
        a.reserve("nope", 1000, "x")

    # only an idle device is taken: leased, quarantined, held, busy are refused with the reason
    assert f.store.commit([(tid, "d1")])[0].startswith("ok:")
    with pytest.raises(Busy, match=f"running task {tid}"):
        a.reserve("d1", 1000, "x")
    a.quarantine("d3")
    with pytest.raises(Busy, match="quarantined"):
        a.reserve("d3", 1000, "x")
    for bad in ((999, "x"), (7 * 86_400_000 + 1, "x"), (1000, ""), (1000, "a\nb"),
                (1000, "x" * 201)):  # fmt: skip
        with pytest.raises(InvalidInput):
            a.reserve("d2", *bad)
    assert a.reservations() == {}
    got = [e for e in events(a) if e["type"] in ("device_reserved", "device_released")]
    assert [e["type"] for e in got] == ["device_reserved"] * 3 + ["device_released"]
    assert got[0]["by"] == "alice" and got[1]["extended"] == "1"
    assert got[3]["device"] == "d1" and got[3]["host"] == "h1"


def test_reserve_by_constraints_takes_a_matching_idle_device(real_fleet: Any) -> None:
    f = real_fleet
    f.add_host("h1", ("d1", "android", ()), ("d2", "android", ("camera",)), ("d3", "ios", ()))
    a = f.admin
    assert a.reserve_matching("android", ["camera"], 60_000, "bob").device_id == "d2"
    with pytest.raises(Busy, match="no idle device offers driver type android and tags camera"):
        a.reserve_matching("android", ["camera"], 60_000, "bob")
    assert a.reserve_matching("ios", [], 60_000, "carol").device_id == "d3"
    assert set(a.reservations()) == {"d2", "d3"}


def test_expiry_ends_reservations_in_bounded_batches(real_fleet: Any) -> None:
    f = real_fleet
    f.add_host("h1", *[(f"d{i}", "android", ()) for i in range(5)])
    for i in range(5):
        f.admin.reserve(f"d{i}", 1000, "alice")
    assert idle(f.admin) == set()
    time.sleep(1.05)
    assert f.store.expire(2)["more"] == 1
    assert len(f.admin.reservations()) == 3
    f.store.expire(100)
    assert f.admin.reservations() == {} and len(idle(f.admin)) == 5
    assert event_types(f.admin).count("reservation_expired") == 5
    assert verify(f.r, f.pool).ok


def test_verify_reports_a_device_with_a_lease_and_a_reservation(real_fleet: Any) -> None:
    f = real_fleet
    f.add_host("h1", ("d1", "android", ()), ("d2", "android", ()))
    tid = f.client.submit("x")
    assert f.store.commit([(tid, "d1")])[0].startswith("ok:")
    f.admin.reserve("d2", 60_000, "alice")
    # planted: d1 (leased) also booked; d2's index entry gone
    f.r.hset(f.admin.keys.device("d1"), mapping={"booked_until": "1", "booked_by": "x"})
    f.r.zadd(f.admin.keys.bookings, {"d1": 1})
    f.r.zrem(f.admin.keys.bookings, "d2")
    kinds = {(v.kind, v.device) for v in verify(f.r, f.pool).violations}
    assert ("lease_and_booking", "d1") in kinds
    assert ("booking_index", "d2") in kinds


def test_cli_reserve_release_show_and_errors(real_fleet: Any, cli: Any) -> None:
    f = real_fleet
    f.add_host("h1", ("d1", "android", ("wifi",)), ("d2", "ios", ()))
    out = cli("reserve", "d1", "--for", "8d", "--note", "x")
    assert out.exit_code != 0 and "longer than 7 days" in out.output
    out = cli("reserve", "d1", "--for", "soon", "--note", "x")
    assert out.exit_code != 0 and "not a duration" in out.output
    out = cli("reserve", "--for", "1h", "--note", "x")
    assert out.exit_code != 0 and "DEVICE_ID" in out.output
    out = cli("reserve", "d1", "--for", "2h", "--note", "alice", "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["reserved_by"] == "alice" and data["device_id"] == "d1"
    out = cli("reserve", "d1", "--for", "2h", "--note", "bob")
    assert out.exit_code != 0 and "already reserved" in out.output
    out = cli("reserve", "d1", "--extend", "--for", "30m")
    assert out.exit_code == 0 and "extended" in out.output
    show = json.loads(cli("device", "show", "d1", "--json").stdout)
    assert show["reserved_until"] == data["reserved_until"] + 1_800_000
    assert show["reserved_by"] == "alice" and show["effective_state"] == "booked"
    text = cli("device", "list").output
    assert "booked" in text and "alice" in text
    out = cli("reserve", "--driver-type", "ios", "--for", "90s", "--note", "carol")
    assert out.exit_code == 0 and out.output.startswith("d2 ")
    out = cli("release", "d1")
    assert out.exit_code == 0 and "released" in out.output
    show = json.loads(cli("device", "show", "d1", "--json").stdout)
    assert show["reserved_by"] is None and show["reserved_until"] is None
    assert show["effective_state"] == "idle"
    out = cli("release", "d1")
    assert out.exit_code != 0 and "not reserved" in out.output


def test_reservation_events_carry_until_as_an_integer(real_fleet: Any) -> None:
    """The typed view of device_reserved / device_released gives ``until`` (ms) as an int,
    like the other times (it was a string)."""
    f = real_fleet
    f.add_host("h1", ("d1", "x", ()))
    res = f.admin.reserve("d1", 60_000, "alice debugging")
    f.admin.release("d1")
    _, events = read_events(f.r, f.admin.keys, "0-0", block_ms=None)
    got = {e.type: e.as_dict() for e in events if e.type in ("device_reserved", "device_released")}
    assert set(got) == {"device_reserved", "device_released"}, [e.type for e in events]
    for data in got.values():
        assert isinstance(data["until"], int) and data["until"] == res.reserved_until, data
