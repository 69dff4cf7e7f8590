"""Fewer round trips per task, at the script level on a real server: ``report.lua`` with a
``claim_max`` ends attempts and claims the host's waiting assignments in one call (claim.lua's
reply after the report answers, claim.lua's time budget), and ``heartbeat.lua`` with leases
renews them as ``renew.lua`` does (same answers: ok, cancel, preempt, lost; a superseded
session renews nothing)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from deviceq import Report, SessionSuperseded
from deviceq.core.errors import InvalidInput
from deviceq.core.script_args import RENEW, REPORT
from deviceq.host.claims import assignments, claimed_all
from deviceq.host.link import DeviceReport, HostLink
from deviceq.host.redis_link import HostClient


def script_calls(r: redis.Redis, name: str = "evalsha") -> int:
    return int(r.info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0))


def _host(fleet: Any, n: int) -> HostClient:
    h = fleet.add_host("h1", *[(f"d{i:02d}", "x", ()) for i in range(n)])
    h.start_session("s1")
    h.heartbeat(fleet.snapshots["h1"])
    return h


def _assign(fleet: Any, devices: list[str]) -> list[str]:
    ids = fleet.client.submit_many([{"goal": f"g-{d}"} for d in devices])
    assert all(o.startswith("ok:") for o in fleet.store.commit(list(zip(ids, devices,
                                                                        strict=True))))  # fmt: skip
    return list(ids)


def _report_args(h: HostClient, reports: list[dict[str, str]], *extra: str) -> list[Any]:
    return [*h._auth(), str(len(reports)), REPORT.pack(reports), *extra]


def _done(a: Any) -> dict[str, str]:
    return {"task_id": a.task.id, "lease_id": a.lease_id, "outcome": "done",
            "failure_kind": "", "payload": "ok"}  # fmt: skip


# -- report + claim ----------------------------------------------------------------------------


def test_a_report_claims_the_next_assignment_in_the_same_call(real_fleet: Any) -> None:
    fleet = real_fleet
    h = _host(fleet, 2)
    (first,) = _assign(fleet, ["d00"])
    (a,) = h.claim(1)
    (nxt,) = _assign(fleet, ["d01"])  # waits in the inbox while d00 runs
    wake = fleet.admin.keys.prefix + "sched:wake"
    fleet.r.delete(wake)
    c0 = script_calls(fleet.r)
    answers, claimed = h.report_and_claim([Report(a.task.id, a.lease_id, "done", None, "ok")], 4)
    assert script_calls(fleet.r) - c0 == 1  # one EVALSHA: the report and the claim
    assert answers == ["ok:done"]
    assert [c.task.id for c in claimed] == [nxt] and claimed[0].device_id == "d01"
    assert claimed[0].lease_ms == 60_000 and claimed[0].task.goal == "g-d01"
    assert fleet.client.get(first).status.value == "done"
    assert fleet.client.get(nxt).status.value == "dispatched"
    assert fleet.r.llen(wake) == 1  # the freed device: the scheduler makes a pass
    # what it claimed is this session's: renewed and reported like any claim
    assert h.renew([(nxt, claimed[0].lease_id)])[0].status == "ok"
    assert h.report(nxt, claimed[0].lease_id, "done") == "ok:done"


def test_the_report_reply_keeps_its_answers_first_and_ends_with_the_claim(real_fleet: Any) -> None:
    fleet = real_fleet
    h = _host(fleet, 3)
    _assign(fleet, ["d00", "d01"])
    running = h.claim(2)
    _assign(fleet, ["d02"])
    raw = h._run("report", _report_args(h, [_done(x) for x in running], "5"))
    assert raw[:2] == ["ok:done", "ok:done"]  # a reader of the n answers reads them as before
    rows = raw[2]
    assert claimed_all(rows) and [x.device_id for x in assignments(rows)] == ["d02"]
    # an empty inbox: the claim part is claim.lua's empty reply
    raw = h._run("report", _report_args(h, [_done(x) for x in running], "5"))
    assert raw[:2] == ["dup:done", "dup:done"] and assignments(raw[2]) == []
    # without claim_max the reply is the answers alone
    assert h._run("report", _report_args(h, [_done(x) for x in running])) == ["dup:done"] * 2


def test_the_claim_in_a_report_keeps_claims_time_budget(real_fleet: Any) -> None:
    fleet = real_fleet
    h = _host(fleet, 21)
    _assign(fleet, ["d20"])
    (a,) = h.claim(1)
    ids = _assign(fleet, [f"d{i:02d}" for i in range(20)])
    raw = h._run("report", _report_args(h, [_done(a)], "1000", "1"))  # a 1 us budget
    assert raw[0] == "ok:done"
    rows = raw[1]
    got = assignments(rows)
    assert len(got) == 8 and not claimed_all(rows)  # checked every 8 entries: stopped, 'more'
    # the host's call claims the rest with claim.lua (its own budget), up to claim_max
    rest = h.claim(100)
    assert sorted(x.task.id for x in got + rest) == sorted(ids)  # each once


def test_report_and_claim_takes_the_rest_past_the_budget_up_to_its_max(
    real_fleet: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = real_fleet
    h = _host(fleet, 21)
    _assign(fleet, ["d20"])
    (a,) = h.claim(1)
    ids = _assign(fleet, [f"d{i:02d}" for i in range(20)])
    tiny = h._claim_args
    monkeypatch.setattr(h, "_claim_args", lambda n: [*tiny(n), "1"])  # claim.lua: 1 us too
    real = h._run

    def report_budget(name: str, args: list[Any]) -> Any:  # report.lua with a 1 us budget
        if name == "report" and len(args) == 6:
            args = [*args, "1"]
        return real(name, args)

    monkeypatch.setattr(h, "_run", report_budget)
    c0 = script_calls(fleet.r)
    answers, claimed = h.report_and_claim([Report(a.task.id, a.lease_id, "done")], 12)
    assert answers == ["ok:done"]
    assert len(claimed) == 12 and script_calls(fleet.r) - c0 == 2  # 8 (more), then 4
    assert len({x.task.id for x in claimed}) == 12 and {x.task.id for x in claimed} <= set(ids)


def test_a_bad_claim_max_is_refused_and_nothing_is_reported(real_fleet: Any) -> None:
    fleet = real_fleet
    h = _host(fleet, 1)
    _assign(fleet, ["d00"])
    (a,) = h.claim(1)
    for extra in (["0"], ["1001"], ["x"], ["2", "0"], ["2", "5", "6"]):
        with pytest.raises(InvalidInput):
            h._run("report", _report_args(h, [_done(a)], *extra))
    assert fleet.client.get(a.task.id).status.value == "dispatched"


def test_a_link_that_cannot_claim_in_a_report_reports_alone(real_fleet: Any) -> None:
    """`HostLink.report_and_claim`'s default (the HTTP link): the answers, nothing claimed."""
    fleet = real_fleet
    h = _host(fleet, 2)
    _assign(fleet, ["d00"])
    (a,) = h.claim(1)
    (nxt,) = _assign(fleet, ["d01"])
    answers, claimed = HostLink.report_and_claim(h, [Report(a.task.id, a.lease_id, "done")], 4)
    assert (answers, claimed) == (["ok:done"], [])
    assert fleet.client.get(nxt).status.value == "assigned"


# -- renewals on the heartbeat -----------------------------------------------------------------


def _running(fleet: Any, h: HostClient, n: int) -> list[Any]:
    _assign(fleet, [f"d{i:02d}" for i in range(n)])
    return h.claim(n)


def _expiry(fleet: Any, tid: str) -> int:
    return int(fleet.r.hget(fleet.admin.keys.task(tid), "lease_expires_at"))


def test_a_heartbeat_renews_the_leases_it_carries(real_fleet: Any) -> None:
    fleet = real_fleet
    h = _host(fleet, 2)
    runs = _running(fleet, h, 2)
    before = [_expiry(fleet, a.task.id) for a in runs]
    time.sleep(0.01)
    c0 = script_calls(fleet.r)
    hb = h.heartbeat(fleet.snapshots["h1"], leases=[(a.task.id, a.lease_id) for a in runs])
    assert script_calls(fleet.r) - c0 == 1  # one heartbeat call renews them all
    assert hb.devices == 2 and hb.renewals is not None
    assert [(x.task_id, x.status, x.lease_ms) for x in hb.renewals] == [
        (a.task.id, "ok", 60_000) for a in runs]  # fmt: skip
    after = [_expiry(fleet, a.task.id) for a in runs]
    assert all(x > y for x, y in zip(after, before, strict=True))
    assert [x.expires_at for x in hb.renewals] == after
    zs = fleet.r.zrange(fleet.admin.keys.prefix + "leases", 0, -1, withscores=True)
    assert {m: int(s) for m, s in zs} == {a.task.id: e for a, e in zip(runs, after, strict=True)}
    # without leases, the reply and the answer are as before
    raw = h.heartbeat_call("delta", str(fleet.r.hget(fleet.admin.keys.host("h1"), "hb_ver")),
                           "v-next", 2, [])  # fmt: skip
    assert raw.status == "ok" and raw.heartbeat.renewals is None
    assert h.heartbeat(fleet.snapshots["h1"]).renewals is None


def test_a_heartbeats_renewals_answer_cancel_preempt_and_lost(real_fleet: Any) -> None:
    fleet = real_fleet
    h = _host(fleet, 4)
    a, b, c, d = _running(fleet, h, 4)
    assert fleet.client.cancel(a.task.id) == "requested"
    tk = fleet.admin.keys.task(b.task.id)
    fleet.r.hset(tk, mapping={"preempt_by": "urgent", "preempt_grace_ms": "1500"})
    assert h.report(c.task.id, c.lease_id, "done") == "ok:done"
    leases = [(x.task.id, x.lease_id) for x in (a, b, c)] + [(d.task.id, "not-its-lease")]
    hb = h.heartbeat(fleet.snapshots["h1"], leases=leases)
    assert hb.renewals is not None
    got = [(x.status, x.reason) for x in hb.renewals]
    assert got == [("cancel", None), ("preempt:1500", None), ("lost", "finished"),
                   ("lost", "superseded")]  # fmt: skip
    # renew.lua answers alike
    assert [(x.status, x.reason) for x in h.renew(leases)] == got


def test_a_superseded_sessions_heartbeat_renews_nothing(real_fleet: Any) -> None:
    fleet = real_fleet
    h = _host(fleet, 1)
    (a,) = _running(fleet, h, 1)
    before = _expiry(fleet, a.task.id)
    newer = HostClient(fleet.r, fleet.pool, "h1", fleet.tokens["h1"])
    newer.start_session("s2", "takeover", "", "s1")
    time.sleep(0.01)
    with pytest.raises(SessionSuperseded):
        h.heartbeat(fleet.snapshots["h1"], leases=[(a.task.id, a.lease_id)])
    assert _expiry(fleet, a.task.id) == before
    # nor does the new session renew the old one's lease (its claim was the old session's)
    hb = newer.heartbeat(fleet.snapshots["h1"], leases=[(a.task.id, a.lease_id)])
    assert hb.renewals is not None
    assert [(x.status, x.reason) for x in hb.renewals] in (
        [("lost", "superseded")], [("lost", "expired")])  # fmt: skip
    assert _expiry(fleet, a.task.id) == before


def test_leases_ride_on_a_heartbeat_whose_device_part_is_refused(real_fleet: Any) -> None:
    fleet = real_fleet
    h = _host(fleet, 1)
    (a,) = _running(fleet, h, 1)
    before = _expiry(fleet, a.task.id)
    time.sleep(0.01)
    packed = RENEW.pack([{"task_id": a.task.id, "lease_id": a.lease_id}])
    rows = [tuple(DeviceReport("d00", "x").args())]
    raw = h._run("heartbeat", [*h._auth(), "delta", "stale-ver", "v2", "1", "1",
                               h_pack(rows), packed])  # fmt: skip
    assert raw[0] == "full" and raw[6][0] == "ok"  # the devices refused, the lease renewed
    assert _expiry(fleet, a.task.id) > before


def h_pack(rows: list[tuple[str, ...]]) -> bytes:
    from deviceq.core.script_args import HEARTBEAT

    return HEARTBEAT.pack(dict(zip(HEARTBEAT.names, r, strict=False)) for r in rows)


def test_malformed_leases_refuse_the_heartbeat_and_change_nothing(real_fleet: Any) -> None:
    fleet = real_fleet
    h = _host(fleet, 1)
    (a,) = _running(fleet, h, 1)
    hk = fleet.admin.keys.host("h1")
    seen = fleet.r.hget(hk, "last_heartbeat")
    before = _expiry(fleet, a.task.id)
    ver = str(fleet.r.hget(hk, "hb_ver"))
    time.sleep(0.01)
    bad = [
        b"\x93\xa1x",  # not a whole number of leases
        RENEW.pack([{"task_id": a.task.id, "lease_id": "bad id!"}]),
        b"not msgpack",
    ]
    for packed in bad:
        with pytest.raises(InvalidInput):
            h._run("heartbeat", [*h._auth(), "delta", ver, "v2", "1", "0", h_pack([]), packed])
    assert fleet.r.hget(hk, "last_heartbeat") == seen and fleet.r.hget(hk, "hb_ver") == ver
    assert _expiry(fleet, a.task.id) == before
