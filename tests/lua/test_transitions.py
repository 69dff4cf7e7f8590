"""Each core transition in detail: submit, heartbeat, assign (commit), claim, renew, report,
expire, cancel, the event stream, quarantine, host management and ``Client.wait``.
Tests taking ``fleet`` run on the real private redis-server and on fakeredis."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from deviceq import (
    AlreadyExists,
    AuthError,
    Busy,
    DeviceOwned,
    DeviceReport,
    Fenced,
    HostClient,
    InvalidInput,
    NotFound,
    QueueFull,
    TaskStatus,
)
from deviceq.host.link import Report
from deviceq.host.redis_link import token_digest

# -- helpers ----------------------------------------------------------------------------------


def dump(fleet: Any) -> dict[str, Any]:
    """Every key of the pool with its full value (to prove that nothing changed)."""
    r = fleet.r
    out: dict[str, Any] = {}
    for key in r.scan_iter(match=f"dq:{{{fleet.pool}}}:*", count=1000):
        kind = r.type(key)
        if kind == "hash":
            out[key] = r.hgetall(key)
        elif kind == "string":
            out[key] = r.get(key)
        elif kind == "list":
            out[key] = r.lrange(key, 0, -1)
        elif kind == "set":
            out[key] = sorted(r.smembers(key))
        elif kind == "zset":
            out[key] = r.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            out[key] = r.xrange(key)
        else:
            out[key] = kind
    return out


def events(fleet: Any, kind: str | None = None, task: str | None = None) -> list[Any]:
    return [
        e
        for e in fleet.client.events()
        if (kind is None or e.type == kind) and (task is None or e.task == task)
    ]


def lease_of(res: str) -> str:
    assert res.startswith("ok:"), res
    return res[3:]


def queued_ids(fleet: Any) -> list[str]:
    return fleet.r.zrange(fleet.admin.keys.status("queued"), 0, -1)


def running(fleet: Any, goal: str = "g", device: str = "d1", host: str = "h1", **kw: Any) -> tuple:
    """Submit, commit to ``device`` and claim: returns (task_id, assignment)."""
    tid = fleet.client.submit(goal, **kw)
    lease_of(fleet.store.commit([(tid, device)])[0])
    (a,) = fleet.host(host).claim(1)
    assert a.task.id == tid
    return tid, a


# -- submit ------------------------------------------------------------------------------------


def test_submit_many_returns_ids_in_order(fleet: Any) -> None:
    specs = [{"goal": f"g{i}", "driver_type": "android", "tags": ["b", "a"]} for i in range(5)]
    ids = fleet.client.submit_many(specs)
    assert len(set(ids)) == 5
    assert queued_ids(fleet) == ids
    t = fleet.client.get(ids[0])
    assert t.tags == ("a", "b") and t.driver_type == "android"
    assert [e.task for e in events(fleet, "submitted")] == ids


def test_submit_many_is_all_or_nothing_on_queue_full(fleet: Any) -> None:
    fleet.admin.set_config("max_queue_depth", 5)
    first = fleet.client.submit_many([{"goal": f"g{i}"} for i in range(3)])
    before = dump(fleet)
    with pytest.raises(QueueFull):
        fleet.client.submit_many([{"goal": f"x{i}"} for i in range(3)])
    assert dump(fleet) == before, "a rejected batch writes nothing"
    assert fleet.client.submit_many([{"goal": "y1"}, {"goal": "y2"}])
    assert len(queued_ids(fleet)) == 5 and queued_ids(fleet)[:3] == first


def test_submit_validates_every_spec_before_writing(fleet: Any) -> None:
    before = dump(fleet)
    with pytest.raises(InvalidInput):
        fleet.client.submit_many([{"goal": "fine"}, {"goal": ""}])
    assert dump(fleet) == before


def test_idempotency_key_retry_returns_same_id(fleet: Any) -> None:
    a = fleet.client.submit("g", idempotency_key="order-17")
    b = fleet.client.submit("g", idempotency_key="order-17")
    c = fleet.client.submit("a different goal", idempotency_key="order-17")
    assert a == b == c
    assert queued_ids(fleet) == [a]
    assert len(events(fleet, "submitted")) == 1
    assert fleet.client.get(a).idempotency_key == "order-17"
    # a full queue still answers a retry with the first id
    fleet.admin.set_config("max_queue_depth", 1)
    assert fleet.client.submit("g", idempotency_key="order-17") == a
    with pytest.raises(QueueFull):
        fleet.client.submit("g", idempotency_key="order-18")


def test_idempotency_key_within_one_batch(fleet: Any) -> None:
    ids = fleet.client.submit_many(
        [
            {"goal": "a", "idempotency_key": "k1"},
            {"goal": "b"},
            {"goal": "c", "idempotency_key": "k1"},
            {"goal": "d", "idempotency_key": "k2"},
        ]
    )
    assert ids[0] == ids[2] and len(set(ids)) == 3
    assert queued_ids(fleet) == [ids[0], ids[1], ids[3]]
    assert fleet.client.get(ids[0]).goal == "a"


def test_submit_workflow_task(fleet: Any) -> None:
    fleet.client.put_workflow({"name": "smoke", "steps": [{"goal": "step one"}]})
    tid = fleet.client.submit(workflow="smoke")
    t = fleet.client.get(tid)
    assert (t.kind, t.workflow, t.goal) == ("workflow", "smoke", None)


# -- heartbeat ---------------------------------------------------------------------------------


def test_heartbeat_registers_devices(fleet: Any) -> None:
    h = fleet.add_host("h1")
    hb = h.heartbeat(
        [DeviceReport("d1", "android", ("wifi",)), DeviceReport("d2", "ios", (), "busy")]
    )
    assert (hb.devices, hb.idle, hb.draining) == (2, 1, False)
    d1, d2 = fleet.admin.device("d1"), fleet.admin.device("d2")
    assert (d1.host_id, d1.driver_type, d1.tags, d1.state.value) == (
        "h1",
        "android",
        ("wifi",),
        "idle",
    )
    assert d2.state.value == "busy"
    assert fleet.r.zrange(fleet.admin.keys.idle, 0, -1) == ["d1"]
    assert {e.fields["device"] for e in events(fleet, "device_registered")} == {"d1", "d2"}
    assert fleet.admin.host("h1").alive


def test_heartbeat_device_owned_by_another_host_refused(fleet: Any) -> None:
    fleet.add_host("h1", ("d1", "android", ()))
    h2 = fleet.add_host("h2", ("d2", "android", ()))
    before = dump(fleet)
    with pytest.raises(DeviceOwned):
        h2.heartbeat([DeviceReport("d9", "android"), DeviceReport("d1", "ios", ("x",))])
    assert dump(fleet) == before, "refused with nothing changed (not even the heartbeat time)"
    assert fleet.admin.device("d1").host_id == "h1"


def test_heartbeat_wrong_token_refused_and_not_echoed(fleet: Any) -> None:
    fleet.add_host("h1", ("d1", "android", ()))
    before = dump(fleet)
    bad = HostClient(fleet.r, fleet.pool, "h1", "s3cret-wrong-token")
    with pytest.raises(AuthError) as exc:
        bad.heartbeat([DeviceReport("d1", "android", (), "offline")])
    assert "s3cret-wrong-token" not in str(exc.value)
    assert token_digest("s3cret-wrong-token") not in str(exc.value)
    unknown = HostClient(fleet.r, fleet.pool, "nobody", "t")
    with pytest.raises(AuthError):
        unknown.heartbeat([DeviceReport("dz", "android")])
    assert dump(fleet) == before


def test_reserved_device_never_back_among_idle(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    tid = fleet.client.submit("g")
    lease_of(fleet.store.commit([(tid, "d1")])[0])
    idle = fleet.admin.keys.idle
    for state in ("idle", "busy", "idle", "offline", "idle"):
        hb = h.heartbeat([DeviceReport("d1", "android", (), state)])
        if state != "idle":
            assert hb.idle == 0  # d1 is in the delta: counted as it is now
        assert fleet.r.zscore(idle, "d1") is None, state
    # a full snapshot counts every device as it is now (a delta only the ones it carries)
    assert h.heartbeat([DeviceReport("d1", "android")], full=True).idle == 0
    assert fleet.admin.device("d1").reserved_by == tid


def test_dead_host_devices_not_assignable(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    fleet.admin.set_config("host_timeout", 1)
    tid = fleet.client.submit("g")
    time.sleep(1.3)
    assert not fleet.admin.host("h1").alive
    before = dump(fleet)
    assert fleet.store.commit([(tid, "d1")]) == ["err:host_dead"]
    assert dump(fleet) == before
    h.heartbeat([DeviceReport("d1", "android")])
    assert any(e.fields.get("host") == "h1" for e in events(fleet, "host_alive"))
    lease_of(fleet.store.commit([(tid, "d1")])[0])


def test_never_heartbeated_host_is_dead(fleet: Any) -> None:
    fleet.admin.add_host("h0")
    assert not fleet.admin.host("h0").alive


def test_devices_left_out_of_snapshot_become_offline(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()), ("d2", "android", ()))
    hb = h.heartbeat([DeviceReport("d1", "android")])
    assert (hb.devices, hb.idle) == (1, 1)
    assert fleet.admin.device("d2").state.value == "offline"
    assert fleet.r.zrange(fleet.admin.keys.idle, 0, -1) == ["d1"]
    ev = [e for e in events(fleet, "device_state") if e.fields["device"] == "d2"]
    assert ev[-1].fields["state"] == "offline"
    tid = fleet.client.submit("g")
    assert fleet.store.commit([(tid, "d2")]) == ["err:device_not_idle"]
    h.heartbeat([])
    assert fleet.admin.device("d1").state.value == "offline"
    assert fleet.r.zcard(fleet.admin.keys.idle) == 0


# -- assign (commit) ---------------------------------------------------------------------------


def test_assign_validation_reasons_change_nothing(fleet: Any) -> None:
    fleet.add_host(
        "h1",
        ("d-and", "android", ("wifi",)),
        ("d-busy", "android", ("wifi",)),
        ("d-q", "android", ("wifi",)),
        ("d-res", "android", ("wifi",)),
    )
    fleet.host("h1").heartbeat(
        [
            DeviceReport("d-and", "android", ("wifi",)),
            DeviceReport("d-q", "android", ("wifi",)),
            DeviceReport("d-busy", "android", ("wifi",), "busy"),
            DeviceReport("d-res", "android", ("wifi",)),
        ]
    )
    fleet.add_host("h-drain", ("d-drain", "android", ("wifi",)))
    fleet.admin.drain("h-drain")
    fleet.add_host("h-dead", ("d-dead", "android", ("wifi",)))
    fleet.r.hset(fleet.admin.keys.host("h-dead"), "last_heartbeat", 1)  # long ago
    fleet.admin.quarantine("d-q")
    holder = fleet.client.submit("holder")
    lease_of(fleet.store.commit([(holder, "d-res")])[0])
    plain = fleet.client.submit("plain")
    ios = fleet.client.submit("ios", driver_type="ios")
    cam = fleet.client.submit("cam", tags=["wifi", "camera"])
    before = dump(fleet)
    cases = [
        ((holder, "d-and"), "err:task_not_queued"),
        ((plain, "d-res"), "err:device_reserved"),
        ((plain, "d-dead"), "err:host_dead"),
        ((plain, "d-drain"), "err:host_draining"),
        ((ios, "d-and"), "err:driver_type_mismatch"),
        ((cam, "d-and"), "err:missing_tag:camera"),
        ((plain, "d-q"), "err:device_quarantined"),
        ((plain, "d-busy"), "err:device_not_idle"),
        (("no-such-task", "d-and"), "err:task_not_found"),
        ((plain, "no-such-device"), "err:device_not_found"),
    ]
    for pair, want in cases:
        assert fleet.store.commit([pair]) == [want], pair
    assert fleet.store.commit([p for p, _ in cases]) == [w for _, w in cases]
    assert dump(fleet) == before, "a pair that fails validation changes nothing"
    with pytest.raises(InvalidInput, match="host_draining"):
        fleet.admin.dispatch(plain, "d-drain")


def test_assign_batch_commits_valid_pairs_and_never_double_books(fleet: Any) -> None:
    fleet.add_host("h1", ("d1", "android", ()), ("d2", "android", ()))
    a, b, c = (fleet.client.submit(x) for x in "abc")
    res = fleet.store.commit([(a, "d1"), (b, "d1"), (a, "d2"), (c, "d2"), (b, "d2")])
    assert res[0].startswith("ok:") and res[3].startswith("ok:")
    assert res[1:3] == ["err:device_reserved", "err:task_not_queued"]
    assert res[4] == "err:device_reserved"
    assert fleet.admin.device("d1").reserved_by == a
    assert fleet.admin.device("d2").reserved_by == c
    assert queued_ids(fleet) == [b]
    assert fleet.r.lrange(fleet.admin.keys.inbox("h1"), 0, -1) == [a, c]


def test_assign_with_stale_fence_commits_nothing(fleet: Any) -> None:
    fleet.add_host("h1", ("d1", "android", ()))
    tid = fleet.client.submit("g")
    before = dump(fleet)
    with pytest.raises(Fenced):
        fleet.store.commit([(tid, "d1")], fence=7)
    assert dump(fleet) == before


# -- claim ---------------------------------------------------------------------------------------


def test_claim_takes_at_most_max(fleet: Any) -> None:
    h = fleet.add_host("h1", *[(f"d{i}", "android", ()) for i in range(3)])
    ids = [fleet.client.submit(f"g{i}") for i in range(3)]
    fleet.store.commit([(t, f"d{i}") for i, t in enumerate(ids)])
    assert [a.task.id for a in h.claim(2)] == ids[:2]
    assert [a.task.id for a in h.claim(2)] == ids[2:]
    assert h.claim(2) == []
    with pytest.raises(InvalidInput):
        h.claim(0)


def test_expired_assignment_not_claimable(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    fleet.admin.set_config("claim_ttl", 1)
    tid = fleet.client.submit("g")
    lease_of(fleet.store.commit([(tid, "d1")])[0])
    time.sleep(1.2)
    assert h.claim(5) == []
    assert fleet.client.get(tid).status is TaskStatus.assigned  # until expiry runs
    assert fleet.store.expire()["requeued"] == 1
    t = fleet.client.get(tid)
    assert t.status is TaskStatus.queued
    assert t.attempts[0].expired_in == "assigned"
    assert fleet.r.llen(fleet.admin.keys.inbox("h1")) == 0
    assert fleet.admin.device("d1").reserved_by is None


def test_claim_by_other_host_leaves_assignment(fleet: Any) -> None:
    fleet.add_host("h1", ("d1", "android", ()))
    h2 = fleet.add_host("h2", ("d2", "android", ()))
    tid = fleet.client.submit("g")
    fleet.store.commit([(tid, "d1")])
    before = dump(fleet)
    assert h2.claim(10) == []
    assert dump(fleet) == before
    with pytest.raises(AuthError):
        HostClient(fleet.r, fleet.pool, "h1", fleet.tokens["h2"]).claim(1)
    assert dump(fleet) == before


# -- renew ---------------------------------------------------------------------------------------


def test_renew_extends_lease(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    fleet.admin.set_config("lease_ttl", 5)
    tid, a = running(fleet)
    time.sleep(0.05)
    (rn,) = h.renew([(tid, a.lease_id)])
    assert rn.status == "ok" and not rn.lost and rn.expires_at > a.lease_expires_at
    assert fleet.client.get(tid).lease_expires_at == rn.expires_at
    assert fleet.r.zscore(fleet.admin.keys.leases, tid) == rn.expires_at
    assert h.renew([]) == []


def test_renew_tells_holder_about_cancel(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    tid, a = running(fleet)
    assert fleet.client.cancel(tid) == "requested"
    (rn,) = h.renew([(tid, a.lease_id)])
    assert rn.status == "cancel" and rn.expires_at


def test_renew_lost_superseded(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    fleet.admin.set_config("lease_ttl", 1)
    tid, old = running(fleet)
    time.sleep(1.2)
    fleet.store.expire()
    fleet.beat()  # the host proves itself alive: its device returns to the candidates
    fleet.admin.set_config("lease_ttl", 60)
    fleet.store.commit([(tid, "d1")])
    (cur,) = h.claim(1)
    (rn,) = h.renew([(tid, old.lease_id)])
    assert (rn.status, rn.reason) == ("lost", "superseded")
    assert fleet.client.get(tid).lease_expires_at == cur.lease_expires_at


def test_renew_lost_expired_before_expiry_runs(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    fleet.admin.set_config("lease_ttl", 1)
    tid, a = running(fleet)
    time.sleep(1.2)
    before = dump(fleet)
    (rn,) = h.renew([(tid, a.lease_id)])
    assert (rn.status, rn.reason) == ("lost", "expired")
    assert dump(fleet) == before, "an expired lease is not revived"


def test_renew_lost_expired_after_requeue(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    fleet.admin.set_config("lease_ttl", 1)
    tid, a = running(fleet)
    time.sleep(1.2)
    assert fleet.store.expire()["requeued"] == 1
    (rn,) = h.renew([(tid, a.lease_id)])
    assert (rn.status, rn.reason) == ("lost", "expired")


def test_renew_lost_finished(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    tid, a = running(fleet)
    h.report(tid, a.lease_id, "done")
    (rn,) = h.renew([(tid, a.lease_id)])
    assert (rn.status, rn.reason) == ("lost", "finished")
    (rn,) = h.renew([("nonexistent", "nonexistent-a1")])
    assert (rn.status, rn.reason) == ("lost", "not_found")


def test_renew_by_other_host_or_wrong_token(fleet: Any) -> None:
    fleet.add_host("h1", ("d1", "android", ()))
    h2 = fleet.add_host("h2", ("d2", "android", ()))
    tid, a = running(fleet)
    before = dump(fleet)
    (rn,) = h2.renew([(tid, a.lease_id)])
    assert rn.lost
    with pytest.raises(AuthError):
        HostClient(fleet.r, fleet.pool, "h1", "wrong").renew([(tid, a.lease_id)])
    assert dump(fleet) == before


# -- report --------------------------------------------------------------------------------------


def test_report_failed_dup_and_rejected_repeats(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    tid, a = running(fleet)
    assert h.report(tid, a.lease_id, "failed", "runner_error", "boom") == "ok:failed"
    t = fleet.client.get(tid)
    assert (t.status, t.failure_kind.value, t.error) == (TaskStatus.failed, "runner_error", "boom")
    before = dump(fleet)
    assert h.report(tid, a.lease_id, "failed", "runner_error", "boom") == "dup:failed"
    for outcome, kind, payload in (
        ("failed", "runner_error", "other"),
        ("failed", "timeout", "boom"),
        ("done", None, "boom"),
    ):
        assert h.report(tid, a.lease_id, outcome, kind, payload) == "rejected:already_terminal"
    assert dump(fleet) == before


def test_report_from_superseded_lease_cannot_touch_current_attempt(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    fleet.admin.set_config("lease_ttl", 1)
    tid, old = running(fleet)
    time.sleep(1.2)
    fleet.store.expire()
    fleet.beat()  # the host proves itself alive: its device returns to the candidates
    fleet.admin.set_config("lease_ttl", 60)
    fleet.store.commit([(tid, "d1")])
    (cur,) = h.claim(1)
    fleet.client.cancel(tid)  # cancel requested on the current attempt
    before = dump(fleet)
    res = h.report_many(
        [
            Report(tid, old.lease_id, o, k, "x")
            for o, k in (
                ("done", None),
                ("failed", "runner_failed"),
                ("released", None),
                ("cancelled", None),
            )
        ]
    )
    assert res == ["rejected:superseded"] * 4
    assert dump(fleet) == before
    assert h.report(tid, cur.lease_id, "cancelled") == "ok:cancelled"


def test_report_by_non_owner_and_bad_arguments(fleet: Any) -> None:
    fleet.add_host("h1", ("d1", "android", ()))
    h2 = fleet.add_host("h2", ("d2", "android", ()))
    tid, a = running(fleet)
    h1 = fleet.host("h1")
    before = dump(fleet)
    assert h2.report(tid, a.lease_id, "done") == "rejected:not_owner"
    assert h1.report(tid, a.lease_id, "cancelled") == "rejected:cancel_not_requested"
    with pytest.raises(InvalidInput):
        h1.report(tid, a.lease_id, "exploded")
    with pytest.raises(InvalidInput):
        h1.report(tid, a.lease_id, "failed", "no_such_kind")
    with pytest.raises(InvalidInput):  # the batch is validated before anything is applied
        h1.report_many([Report(tid, a.lease_id, "done"), Report(tid, a.lease_id, "bogus")])
    assert dump(fleet) == before


def test_release_requeues_at_original_place(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    first = fleet.client.submit("first")
    later = fleet.client.submit("later")
    fleet.store.commit([(first, "d1")])
    (a,) = h.claim(1)
    assert queued_ids(fleet) == [later]
    assert h.release(first, a.lease_id, "device needs a reboot") == "ok:queued"
    assert queued_ids(fleet) == [first, later]
    keys = fleet.admin.keys
    sig = fleet.r.hget(keys.task(first), "sig")
    assert fleet.r.zrange(keys.queue(sig), 0, -1) == [first, later]
    assert fleet.r.zscore(keys.queues, sig) == float(fleet.r.hget(keys.task(first), "seq"))
    t = fleet.client.get(first)
    assert (t.status, t.attempt, t.device_id) == (TaskStatus.queued, 1, None)
    assert [(x.outcome, x.error) for x in t.attempts] == [("released", "device needs a reboot")]
    assert fleet.admin.device("d1").reserved_by is None
    # a device whose host handed an assignment back is out until the host's next heartbeat
    assert fleet.admin.device("d1").held == "refused"
    assert fleet.store.commit([(first, "d1")]) == ["err:device_held"]
    fleet.beat()
    assert lease_of(fleet.store.commit([(first, "d1")])[0]).endswith("-a2")
    assert len(events(fleet, "released", first)) == 1


def test_release_keeps_queue_deadline_and_does_not_use_an_attempt(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    tid, a = running(fleet, max_attempts=1, queue_timeout=60)
    keys = fleet.admin.keys
    deadline = fleet.r.hget(keys.task(tid), "queue_deadline")
    assert h.release(tid, a.lease_id, "reboot") == "ok:queued"
    sig = fleet.r.hget(keys.task(tid), "sig")
    assert fleet.r.zrange(keys.queue(sig), 0, -1) == [tid], "back in its bucket"
    assert fleet.r.zscore(keys.deadlines, tid) == float(deadline), "its queue timeout holds"
    # the hand-back did not use up the only attempt: a second attempt may run and expire
    fleet.admin.set_config("claim_ttl", 1)
    fleet.beat()
    assert lease_of(fleet.store.commit([(tid, "d1")])[0]).endswith("-a2")
    time.sleep(1.1)
    assert fleet.store.expire()["failed"] == 1
    t = fleet.client.get(tid)
    assert (t.status, t.failure_kind, t.handbacks) == (TaskStatus.failed, "lease_expired", 1)
    assert [x.outcome for x in t.attempts] == ["released", "expired"]


def test_report_many_applies_each(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()), ("d2", "android", ()))
    t1, a1 = running(fleet, "one", "d1")
    t2, a2 = running(fleet, "two", "d2")
    res = h.report_many(
        [
            Report(t1, a1.lease_id, "done", None, "r1"),
            Report(t2, a2.lease_id, "failed", "runner_failed", "e2"),
            Report("missing", "missing-a1", "done"),
        ]
    )
    assert res == ["ok:done", "ok:failed", "rejected:not_found"]


# -- expire --------------------------------------------------------------------------------------


def test_expire_in_bounded_batches(fleet: Any) -> None:
    fleet.add_host("h1", *[(f"d{i}", "android", ()) for i in range(5)])
    fleet.admin.set_config("claim_ttl", 1)
    ids = [fleet.client.submit(f"g{i}") for i in range(5)]
    fleet.store.commit([(t, f"d{i}") for i, t in enumerate(ids)])
    time.sleep(1.2)
    assert fleet.store.expire(limit=2) == {
        "requeued": 2,
        "failed": 0,
        "cancelled": 0,
        "unschedulable": 0,
        "more": 1,
        "trimmed": 0,
        "retried": 0,
    }
    assert fleet.store.expire(limit=2)["requeued"] == 2
    last = fleet.store.expire(limit=2)
    assert (last["requeued"], last["more"]) == (1, 0)
    assert fleet.store.expire(limit=2)["requeued"] == 0
    assert queued_ids(fleet) == ids, "requeued tasks keep submission order"
    with pytest.raises(InvalidInput):
        fleet.store.expire(limit=0)


def test_expire_requeue_keeps_submission_order_among_others(fleet: Any) -> None:
    fleet.add_host("h1", ("d1", "android", ()), ("d2", "android", ()))
    fleet.admin.set_config("claim_ttl", 1)
    a, b, c, d = (fleet.client.submit(x) for x in "abcd")
    fleet.store.commit([(c, "d1"), (a, "d2")])
    assert queued_ids(fleet) == [b, d]
    time.sleep(1.2)
    assert fleet.store.expire()["requeued"] == 2
    assert queued_ids(fleet) == [a, b, c, d]
    keys = fleet.admin.keys
    sig = fleet.r.hget(keys.task(a), "sig")
    assert fleet.r.zrange(keys.queue(sig), 0, -1) == [a, b, c, d]
    assert fleet.r.zrange(keys.queues, 0, 0, withscores=True) == [
        (sig, float(fleet.r.hget(keys.task(a), "seq")))
    ]


def test_expire_at_limit_fails_and_keeps_history(fleet: Any) -> None:
    fleet.add_host("h1", ("d1", "android", ()))
    fleet.admin.set_config("claim_ttl", 1)
    tid = fleet.client.submit("g", max_attempts=1)
    lease = lease_of(fleet.store.commit([(tid, "d1")])[0])
    time.sleep(1.2)
    assert fleet.store.expire()["failed"] == 1
    t = fleet.client.get(tid)
    assert (t.status, t.failure_kind.value) == (TaskStatus.failed, "lease_expired")
    assert [(x.lease_id, x.outcome, x.failure_kind) for x in t.attempts] == [
        (lease, "expired", "lease_expired")
    ]
    assert fleet.r.zscore(fleet.admin.keys.status("failed"), tid) is not None
    assert fleet.r.zscore(fleet.admin.keys.leases, tid) is None
    assert [e.type for e in events(fleet, task=tid)][-2:] == ["expired", "failed"]


def test_requeued_task_shows_no_live_lease(fleet: Any) -> None:
    fleet.add_host("h1", ("d1", "android", ()))
    fleet.admin.set_config("claim_ttl", 1)
    tid = fleet.client.submit("g")
    fleet.store.commit([(tid, "d1")])
    time.sleep(1.2)
    fleet.store.expire()
    t = fleet.client.get(tid)
    assert t.status is TaskStatus.queued
    assert (t.lease_id, t.lease_expires_at, t.host_id, t.device_id) == (None, None, None, None)


# -- cancel --------------------------------------------------------------------------------------


def test_cancel_queued_at_once(fleet: Any) -> None:
    tid = fleet.client.submit("g")
    keep = fleet.client.submit("h")
    assert fleet.client.cancel(tid, "changed my mind") == "cancelled"
    t = fleet.client.get(tid)
    assert (t.status, t.failure_kind.value, t.error) == (
        TaskStatus.cancelled,
        "cancelled",
        "changed my mind",
    )
    assert queued_ids(fleet) == [keep]
    sig = fleet.r.hget(fleet.admin.keys.task(keep), "sig")
    assert fleet.r.zrange(fleet.admin.keys.queue(sig), 0, -1) == [keep]
    assert fleet.client.cancel(tid) == "already:cancelled"
    assert len(events(fleet, "cancelled", tid)) == 1
    with pytest.raises(NotFound):
        fleet.client.cancel("no-such-task")


def test_cancel_assigned_at_once_releases_reservation(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    tid = fleet.client.submit("g")
    fleet.store.commit([(tid, "d1")])
    assert fleet.client.cancel(tid) == "cancelled"
    assert fleet.client.get(tid).status is TaskStatus.cancelled
    assert fleet.admin.device("d1").reserved_by is None
    assert fleet.r.zscore(fleet.admin.keys.idle, "d1") is not None
    assert fleet.r.zscore(fleet.admin.keys.leases, tid) is None
    assert h.claim(5) == []
    assert fleet.client.get(tid).attempts[0].outcome == "cancelled"


def test_cancel_dispatched_is_flagged_then_host_reports(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    tid, a = running(fleet)
    assert fleet.client.cancel(tid) == "requested"
    assert fleet.client.cancel(tid) == "requested"
    t = fleet.client.get(tid)
    assert t.status is TaskStatus.dispatched and t.cancel_requested
    assert fleet.admin.device("d1").reserved_by == tid, "never freed while a runner may run"
    assert len(events(fleet, "cancel_requested", tid)) == 1
    assert h.renew([(tid, a.lease_id)])[0].status == "cancel"
    assert h.report(tid, a.lease_id, "cancelled", None, "stopped") == "ok:cancelled"
    t = fleet.client.get(tid)
    assert (t.status, t.failure_kind.value) == (TaskStatus.cancelled, "cancelled")
    assert fleet.admin.device("d1").reserved_by is None
    assert h.report(tid, a.lease_id, "cancelled", None, "stopped") == "dup:cancelled"


def test_cancel_dispatched_host_gone_expiry_ends_it_cancelled(fleet: Any) -> None:
    fleet.add_host("h1", ("d1", "android", ()))
    fleet.admin.set_config("lease_ttl", 1)
    tid, _ = running(fleet, max_attempts=5)
    assert fleet.client.cancel(tid) == "requested"
    time.sleep(1.2)
    assert fleet.store.expire()["cancelled"] == 1
    t = fleet.client.get(tid)
    assert (t.status, t.failure_kind.value) == (TaskStatus.cancelled, "cancelled")
    assert t.attempts[0].outcome == "expired"
    assert fleet.admin.device("d1").reserved_by is None


def test_cancel_terminal_changes_nothing(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    tid, a = running(fleet)
    h.report(tid, a.lease_id, "done", None, "ok")
    before = dump(fleet)
    assert fleet.client.cancel(tid) == "already:done"
    assert dump(fleet) == before


# -- event stream ------------------------------------------------------------------------------


def test_event_stream_records_each_transition(fleet: Any) -> None:
    token = fleet.admin.add_host("h1")
    h = HostClient(fleet.r, fleet.pool, "h1", token)
    h.heartbeat([DeviceReport("d1", "android"), DeviceReport("d2", "android")])
    fleet.tokens["h1"] = token
    fleet.admin.set_config("claim_ttl", 1)
    t1 = fleet.client.submit("one")
    fleet.store.commit([(t1, "d1")])
    time.sleep(1.15)
    fleet.store.expire()
    h.heartbeat([DeviceReport("d1", "android"), DeviceReport("d2", "android")])
    fleet.admin.set_config("claim_ttl", 30)
    fleet.store.commit([(t1, "d1")])
    (a,) = h.claim(1)
    h.release(t1, a.lease_id)
    h.heartbeat([DeviceReport("d1", "android"), DeviceReport("d2", "android")])
    fleet.store.commit([(t1, "d1")])
    (a,) = h.claim(1)
    h.report(t1, a.lease_id, "done")
    t2 = fleet.client.submit("two")
    fleet.store.commit([(t2, "d2")])
    (b,) = h.claim(1)
    fleet.client.cancel(t2)
    h.report(t2, b.lease_id, "cancelled")
    new_token = fleet.admin.rotate_token("h1")
    fleet.admin.drain("h1")
    fleet.admin.drain("h1", False)
    fleet.admin.quarantine("d2")
    fleet.admin.quarantine("d2", False)
    fleet.admin.add_host("h9")
    fleet.admin.remove_host("h9")
    assert [e.type for e in events(fleet, task=t1)] == [
        "submitted",
        "assigned",
        "expired",
        "requeued",
        "assigned",
        "dispatched",
        "released",
        "assigned",
        "dispatched",
        "done",
    ]
    assert [e.type for e in events(fleet, task=t2)] == [
        "submitted",
        "assigned",
        "dispatched",
        "cancel_requested",
        "cancelled",
    ]
    kinds = {e.type for e in events(fleet)}
    assert {
        "host_added",
        "device_registered",
        "host_alive",
        "host_token_rotated",
        "host_draining",
        "host_undrained",
        "device_quarantined",
        "device_unquarantined",
        "host_removed",
    } <= kinds
    done = events(fleet, "done", t1)[0].fields
    assert (done["lease"], done["host"], done["device"], done["attempt"]) == (
        a.lease_id,
        "h1",
        "d1",
        "3",
    )
    raw = str(fleet.r.xrange(fleet.admin.keys.events))
    for secret in (token, new_token, token_digest(token), token_digest(new_token)):
        assert secret not in raw, "tokens and digests never appear in events"


def test_event_stream_is_capped(fleet: Any) -> None:
    fleet.admin.set_config("event_maxlen", 100)
    fleet.client.submit_many([{"goal": f"g{i}"} for i in range(1200)], chunk=100)
    n = fleet.r.xlen(fleet.admin.keys.events)
    assert 100 <= n <= 200, n  # MAXLEN ~ trims whole stream nodes (100 entries each)


# -- quarantine ----------------------------------------------------------------------------------


def test_quarantine_after_consecutive_failures(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    fleet.admin.set_config("quarantine_after", 2)
    fleet.admin.set_config("max_quarantine_fraction", 1)

    def run_once(outcome: str, kind: str | None) -> None:
        tid, a = running(fleet, max_attempts=1)
        assert h.report(tid, a.lease_id, outcome, kind, "x") == f"ok:{outcome}"

    run_once("failed", "infrastructure")
    run_once("done", None)  # resets the count
    run_once("failed", "infrastructure")
    run_once("failed", "runner_failed")  # the task's own failure: not the device's
    run_once("failed", "rejected")  # neither
    assert not fleet.admin.device("d1").quarantined
    assert fleet.admin.device("d1").consecutive_failures == 1
    run_once("failed", "timeout")
    d = fleet.admin.device("d1")
    assert d.quarantined and d.consecutive_failures == 2 and d.reserved_by is None
    assert fleet.r.zscore(fleet.admin.keys.idle, "d1") is None
    assert len(events(fleet, "device_quarantined")) == 1
    tid = fleet.client.submit("g")
    assert fleet.store.commit([(tid, "d1")]) == ["err:device_quarantined"]
    h.heartbeat([DeviceReport("d1", "android")])
    assert fleet.r.zscore(fleet.admin.keys.idle, "d1") is None, "heartbeat does not undo it"
    assert fleet.admin.quarantine("d1", False) == "released"
    assert fleet.admin.device("d1").consecutive_failures == 0
    assert fleet.r.zscore(fleet.admin.keys.idle, "d1") is not None
    lease_of(fleet.store.commit([(tid, "d1")])[0])


def test_failing_tasks_never_quarantine_a_device(fleet: Any) -> None:
    """A task whose command exits non-zero is the task's failure; any number
    of them leave the device in service."""
    h = fleet.add_host("h1", ("d1", "android", ()))
    fleet.admin.set_config("quarantine_after", 1)
    fleet.admin.set_config("max_quarantine_fraction", 1)
    for _ in range(5):
        tid, a = running(fleet, max_attempts=1)
        assert h.report(tid, a.lease_id, "failed", "runner_failed", "exit 3") == "ok:failed"
    d = fleet.admin.device("d1")
    assert not d.quarantined and d.consecutive_failures == 0


def test_automatic_quarantine_is_capped_per_driver_type(fleet: Any) -> None:
    """At most max_quarantine_fraction of one driver type's devices are quarantined
    automatically; beyond it the device is flagged and a quarantine_capped event warns."""
    h = fleet.add_host("h1", *[(f"d{i}", "android", ()) for i in range(8)], ("w1", "web", ()))
    fleet.admin.set_config("quarantine_after", 1)  # 8 android devices: at most 2 (0.25)
    for i in range(8):
        tid, a = running(fleet, device=f"d{i}", max_attempts=1)
        assert h.report(tid, a.lease_id, "failed", "infrastructure", "usb gone") == "ok:failed"
    devs = {d.device_id: d for d in fleet.admin.devices()}
    quarantined = sorted(d for d, v in devs.items() if v.quarantined)
    assert quarantined == ["d0", "d1"]
    flagged = sorted(d for d, v in devs.items() if v.attention)
    assert flagged == [f"d{i}" for i in range(2, 8)]
    assert len(events(fleet, "quarantine_capped")) == 6
    # an operator's quarantine counts too: releasing one lets automatic quarantine take another
    fleet.admin.quarantine("d0", False)
    tid, a = running(fleet, device="d0", max_attempts=1)
    assert h.report(tid, a.lease_id, "failed", "infrastructure", "x") == "ok:failed"
    assert fleet.admin.device("d0").quarantined
    assert fleet.r.hget(fleet.admin.keys.qdrivers, "android") == "2"


def test_a_small_labs_first_flaky_device_is_quarantined_despite_the_fraction(fleet: Any) -> None:
    """With 3 phones the default 0.25 would allow none: the cap still takes one device of a
    driver type while another stays in service, and says the real numbers for the next."""
    h = fleet.add_host("h1", *[(f"p{i}", "android", ()) for i in range(3)], ("w1", "web", ()))
    fleet.admin.set_config("quarantine_after", 1)
    for i in range(2):
        tid, a = running(fleet, device=f"p{i}", max_attempts=1)
        assert h.report(tid, a.lease_id, "failed", "infrastructure", "adb gone") == "ok:failed"
    devs = {d.device_id: d for d in fleet.admin.devices()}
    assert devs["p0"].quarantined and not devs["p1"].quarantined
    assert devs["p1"].attention is not None
    assert "would take 2 of 3 android devices (67%) > 25%" in devs["p1"].attention
    # the only device of its type is never taken out automatically
    tid, a = running(fleet, device="w1", max_attempts=1)
    assert h.report(tid, a.lease_id, "failed", "infrastructure", "x") == "ok:failed"
    assert not fleet.admin.device("w1").quarantined
    # a device with device faults is in `faults` until a task succeeds on it
    assert fleet.r.hgetall(fleet.admin.keys.faults) == {"p0": "1", "p1": "1", "w1": "1"}
    tid, a = running(fleet, device="p1")
    assert h.report(tid, a.lease_id, "done", "", "ok") == "ok:done"
    assert "p1" not in fleet.r.hgetall(fleet.admin.keys.faults)
    fleet.admin.quarantine("p0", False)
    assert "p0" not in fleet.r.hgetall(fleet.admin.keys.faults)


# -- hosts ---------------------------------------------------------------------------------------


def test_host_add_stores_only_a_digest(fleet: Any) -> None:
    token = fleet.admin.add_host("h1")
    assert len(token) >= 32
    raw = dump(fleet)
    assert token not in str(raw)
    assert fleet.r.hget(fleet.admin.keys.host("h1"), "token_digest") == token_digest(token)
    with pytest.raises(AlreadyExists):
        fleet.admin.add_host("h1")
    assert fleet.r.hget(fleet.admin.keys.host("h1"), "token_digest") == token_digest(token)


def test_host_rotate_token(fleet: Any) -> None:
    old = fleet.add_host("h1", ("d1", "android", ()))
    new_token = fleet.admin.rotate_token("h1")
    with pytest.raises(AuthError):
        old.heartbeat([DeviceReport("d1", "android")])
    HostClient(fleet.r, fleet.pool, "h1", new_token).heartbeat([DeviceReport("d1", "android")])
    with pytest.raises(NotFound):
        fleet.admin.rotate_token("nobody")


def test_host_remove(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()), ("d2", "android", ()))
    tid, a = running(fleet)
    before = dump(fleet)
    with pytest.raises(Busy):
        fleet.admin.remove_host("h1")
    assert dump(fleet) == before
    h.report(tid, a.lease_id, "done")
    assert fleet.admin.remove_host("h1") == 2
    keys = fleet.admin.keys
    for key in (
        keys.host("h1"),
        keys.device("d1"),
        keys.device("d2"),
        keys.inbox("h1"),
        keys.host_devices("h1"),
    ):
        assert not fleet.r.exists(key), key
    assert fleet.r.zcard(keys.idle) == 0
    assert "h1" not in fleet.r.smembers(keys.hosts)
    with pytest.raises(AuthError):
        h.heartbeat([])
    # the device id is free for another host now
    fleet.add_host("h2", ("d1", "ios", ()))
    assert fleet.admin.device("d1").host_id == "h2"
    with pytest.raises(NotFound):
        fleet.admin.remove_host("h1")


def test_host_drain_and_resume(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()), ("d2", "android", ()))
    t1, a = running(fleet)
    assert fleet.admin.drain("h1") == "draining"
    assert h.heartbeat([DeviceReport("d1", "android"), DeviceReport("d2", "android")]).draining
    t2 = fleet.client.submit("g2")
    assert fleet.store.commit([(t2, "d2")]) == ["err:host_draining"]
    assert h.report(t1, a.lease_id, "done") == "ok:done", "running work is untouched"
    assert fleet.admin.drain("h1", False) == "active"
    lease_of(fleet.store.commit([(t2, "d2")])[0])
    # the daemon's own shutdown flag is separate from an operator's drain
    assert h.set_draining(True) == "stopping"
    host = fleet.admin.host("h1")
    assert host.stopping and not host.draining
    assert fleet.store.commit([(fleet.client.submit("g3"), "d1")]) == ["err:host_draining"]
    with pytest.raises(AuthError):
        HostClient(fleet.r, fleet.pool, "h1", "wrong-token-0123456789").set_draining(False)
    assert fleet.admin.host("h1").stopping
    with pytest.raises(NotFound):
        fleet.admin.drain("nobody")


# -- wait ----------------------------------------------------------------------------------------


def test_wait_returns_on_completion_from_another_thread(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    tid, a = running(fleet)
    other = fleet.client.submit("noise")
    box: dict[str, Any] = {}

    def waiter() -> None:
        started = time.monotonic()
        try:
            box["task"] = fleet.client.wait(tid, timeout=10)
        except BaseException as exc:  # surfaced below
            box["error"] = exc
        box["elapsed"] = time.monotonic() - started

    th = threading.Thread(target=waiter)
    th.start()
    time.sleep(0.3)
    assert th.is_alive(), "wait blocks while the task runs"
    fleet.client.cancel(other)  # an unrelated event does not end the wait
    time.sleep(0.1)
    assert th.is_alive()
    h.report(tid, a.lease_id, "done", None, "result!")
    th.join(10)
    assert "error" not in box, box.get("error")
    assert box["task"].status is TaskStatus.done and box["task"].result == "result!"
    assert box["elapsed"] < 3.0, "woken by the event, not by a slow poll"


def test_wait_on_terminal_task_returns_at_once(fleet: Any) -> None:
    tid = fleet.client.submit("g")
    fleet.client.cancel(tid)
    assert fleet.client.wait(tid, timeout=0.1).status is TaskStatus.cancelled


def test_wait_times_out(fleet: Any) -> None:
    tid = fleet.client.submit("g")
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        fleet.client.wait(tid, timeout=0.4)
    assert 0.35 <= time.monotonic() - started < 3.0
    with pytest.raises(NotFound):
        fleet.client.wait("no-such-task", timeout=0.1)


# -- long goals (kept out of the task hash) ----------------------------------------------------


def test_long_goal_round_trips_everywhere(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    goal = "open the app and " + "tap next, " * 1500 + "é"
    tid = fleet.client.submit(goal)
    short = fleet.client.submit("short goal")
    assert fleet.client.get(tid).goal == goal
    assert [t.goal for t in fleet.client.list("queued")] == [goal, "short goal"]
    assert [t.goal for t in fleet.client.get_many([short, tid])] == ["short goal", goal]
    fleet.store.commit([(tid, "d1")])
    (a,) = h.claim(1)
    assert a.task.goal == goal, "the worker gets the whole goal"
    h.report(tid, a.lease_id, "done", None, "ok")
    assert fleet.client.get(tid).goal == goal
    keys = fleet.admin.keys
    for key in (keys.task(tid), keys.attempts(tid)):
        assert fleet.r.pttl(key) > 0, key
    goal_keys = [
        k for k in fleet.r.scan_iter(match=keys.task(tid) + ":*") if k != keys.attempts(tid)
    ]
    assert all(fleet.r.pttl(k) > 0 for k in goal_keys), "a finished task's keys all expire"
