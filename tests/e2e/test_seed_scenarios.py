"""Every core scenario of the seed specification (seeds/000_05e266071da9adbf.txt) as a named test.

Scheduler-level scenarios (strategy registry, ``fifo_match``, unknown strategy) and dispatcher
scenarios live in the scheduler/dispatcher suites; here the core transitions are exercised
directly, with ``PoolAdmin.commit`` standing in for the scheduler's assignment commit.
Tests taking ``fleet`` run on the real private redis-server and on fakeredis."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from deviceq import DeviceReport, QueueFull, TaskStatus
from deviceq.core.errors import AuthError
from deviceq.core.lane import Lane


def _queued_depth(fleet: Any) -> int:
    return int(fleet.r.zcard(fleet.admin.keys.status("queued")))


def _events(fleet: Any, kind: str | None = None) -> list[Any]:
    return [e for e in fleet.client.events() if kind is None or e.type == kind]


def _expire_after(fleet: Any, seconds: float) -> dict[str, int]:
    time.sleep(seconds)
    return fleet.store.expire()


# -- Requirement: Task submission enqueues a scheduled task -----------------------------------
def test_successful_submission(fleet: Any) -> None:
    # no host or device exists: submission must not wait for one
    started = time.monotonic()
    tid = fleet.client.submit("open the settings app")
    assert time.monotonic() - started < 2.0
    other = fleet.client.submit("open the settings app")
    assert tid != other, "every submission gets its own id"
    t = fleet.client.get(tid)
    assert t.status is TaskStatus.queued
    assert (t.id, t.kind, t.goal, t.workflow) == (tid, "goal", "open the settings app", None)
    assert (t.driver_type, t.tags, t.attempt) == (None, (), 0)
    assert t.submitted_at > 0 and t.host_id is None and t.device_id is None
    assert [x.id for x in fleet.client.list("queued")] == [tid, other]
    assert _queued_depth(fleet) == 2
    (ev,) = [e for e in _events(fleet, "submitted") if e.task == tid]
    assert ev.fields["sig"]


def test_queue_depth_limit_reached(fleet: Any) -> None:
    fleet.admin.set_config("max_queue_depth", 3)
    ids = [fleet.client.submit(f"goal {i}") for i in range(3)]
    before = set(fleet.r.scan_iter(match=f"dq:{{{fleet.pool}}}:*", count=1000))
    with pytest.raises(QueueFull) as exc:
        fleet.client.submit("one too many")
    assert "max_queue_depth" in str(exc.value) and "3" in str(exc.value)
    # rejected, not half-written
    assert set(fleet.r.scan_iter(match=f"dq:{{{fleet.pool}}}:*", count=1000)) == before
    assert _queued_depth(fleet) == 3
    assert [t.id for t in fleet.client.list("queued")] == ids
    # a slot freed: accepted again
    assert fleet.client.cancel(ids[0]) == "cancelled"
    assert fleet.client.get(fleet.client.submit("fits now")).status is TaskStatus.queued
    with pytest.raises(QueueFull):
        fleet.client.submit("full again")


# -- Requirement: Assignment matches a queued task to an idle, constraint-matching device -----
def test_matching_idle_device_available(fleet: Any) -> None:
    fleet.add_host("h1", ("d-ios", "ios", ("wifi",)))
    fleet.add_host("h2", ("d-and", "android", ("camera", "wifi")))
    tid = fleet.client.submit("take a photo", driver_type="android", tags=["wifi", "camera"])
    assert fleet.store.commit([(tid, "d-ios")]) == ["err:driver_type_mismatch"]
    (res,) = fleet.store.commit([(tid, "d-and")])
    assert res.startswith("ok:")
    t = fleet.client.get(tid)
    assert t.status is TaskStatus.assigned
    assert (t.device_id, t.host_id) == ("d-and", "h2")


def test_no_matching_device_available(fleet: Any) -> None:
    fleet.add_host("h1", ("d1", "ios", ("wifi",)), ("d2", "android", ()))
    tid = fleet.client.submit("needs android+wifi", driver_type="android", tags=["wifi"])
    res = fleet.store.commit([(tid, "d1"), (tid, "d2")])
    assert res == ["err:driver_type_mismatch", "err:missing_tag:wifi"]
    t = fleet.client.get(tid)
    assert t.status is TaskStatus.queued and t.failure_kind is None and t.attempt == 0
    assert t.attempts == []
    assert _queued_depth(fleet) == 1
    # ready to be retried later: a matching device appears
    fleet.add_host("h2", ("d3", "android", ("wifi",)))
    assert fleet.store.commit([(tid, "d3")])[0].startswith("ok:")
    assert fleet.client.get(tid).status is TaskStatus.assigned


# -- Requirement: Assignment and device reservation are atomic --------------------------------
def test_scheduler_assigns_an_idle_device(fleet: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    fleet.add_host("h1", ("d1", "android", ("wifi",)))
    fleet.admin.set_config("claim_ttl", 30)
    tid = fleet.client.submit("g", driver_type="android")
    fleet.store.commit([])  # loads the script, so the counted call below is the commit alone
    sent: list[str] = []
    real, real_lane = fleet.r.execute_command, Lane.call

    def counting(*args: Any, **kw: Any) -> Any:
        sent.append(str(args[0]).upper())
        return real(*args, **kw)

    def counting_lane(lane: Lane, *args: Any) -> Any:  # the short path (deviceq.core.lane)
        sent.append(str(args[0]).upper())
        return real_lane(lane, *args)

    t0 = fleet.admin.server_time_ms()
    monkeypatch.setattr(fleet.r, "execute_command", counting)
    monkeypatch.setattr(Lane, "call", counting_lane)
    (res,) = fleet.store.commit([(tid, "d1")])
    monkeypatch.undo()
    t1 = fleet.admin.server_time_ms()
    assert sent == ["EVALSHA"], "the whole assignment is one atomic script call"
    lease = res.removeprefix("ok:")
    t = fleet.client.get(tid)
    assert t.status is TaskStatus.assigned
    assert (t.host_id, t.device_id, t.attempt, t.lease_id) == ("h1", "d1", 1, lease)
    assert t0 + 30_000 <= t.lease_expires_at <= t1 + 30_000
    d = fleet.admin.device("d1")
    assert d.reserved_by == tid
    keys = fleet.admin.keys
    assert fleet.r.hget(keys.device("d1"), "lease_id") == lease
    assert fleet.r.zscore(keys.idle, "d1") is None
    assert fleet.r.zscore(keys.leases, tid) == t.lease_expires_at
    assert fleet.r.lrange(keys.inbox("h1"), 0, -1) == [tid]
    (a,) = t.attempts
    assert (a.attempt, a.lease_id, a.host_id, a.device_id, a.outcome) == (
        1,
        lease,
        "h1",
        "d1",
        "active",
    )
    (ev,) = _events(fleet, "assigned")
    assert (
        ev.task,
        ev.fields["lease"],
        ev.fields["host"],
        ev.fields["device"],
        ev.fields["attempt"],
    ) == (tid, lease, "h1", "d1", "1")


def test_later_iteration_sees_stale_idle_snapshot(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()), ("d2", "android", ()))
    a = fleet.client.submit("a", driver_type="android")
    b = fleet.client.submit("b", driver_type="android")
    c = fleet.client.submit("c", driver_type="android")
    assert fleet.store.commit([(a, "d1")])[0].startswith("ok:")
    # the host's snapshot is stale: it still says d1 is idle (a delta: nothing changed)
    snap = [DeviceReport("d1", "android"), DeviceReport("d2", "android")]
    h.heartbeat(snap)
    keys = fleet.admin.keys
    assert fleet.r.zrange(keys.idle, 0, -1) == ["d2"], "d1 is not an idle candidate"
    # the same stale snapshot in full: every device recounted as it is now
    assert h.heartbeat(snap, full=True).idle == 1
    assert fleet.r.zrange(keys.idle, 0, -1) == ["d2"], "d1 is not an idle candidate"
    assert fleet.store.commit([(b, "d1")]) == ["err:device_reserved"]
    assert fleet.store.commit([(c, "d1")]) == ["err:device_reserved"]
    assert fleet.client.get(b).status is TaskStatus.queued
    assert fleet.client.get(c).status is TaskStatus.queued
    assert fleet.admin.device("d1").reserved_by == a
    # once the lease ends, the device is a candidate again
    (x,) = h.claim(1)
    assert h.report(a, x.lease_id, "done") == "ok:done"
    h.heartbeat([DeviceReport("d1", "android"), DeviceReport("d2", "android")])
    assert sorted(fleet.r.zrange(keys.idle, 0, -1)) == ["d1", "d2"]
    assert fleet.store.commit([(b, "d1")])[0].startswith("ok:")


# -- Requirement: Host claim transitions assigned work to dispatched --------------------------
def test_owning_host_claims_once(fleet: Any) -> None:
    h1 = fleet.add_host("h1", ("d1", "android", ()))
    h2 = fleet.add_host("h2", ("d2", "android", ()))
    tid = fleet.client.submit("g")
    lease = fleet.store.commit([(tid, "d1")])[0].removeprefix("ok:")
    assert h2.claim(10) == [], "another host never gets h1's assignment"
    impostor = type(h1)(fleet.r, fleet.pool, "h1", "not-the-token")
    with pytest.raises(AuthError):
        impostor.claim(10)
    (got,) = h1.claim(10)
    assert (got.task.id, got.lease_id, got.attempt, got.device_id) == (tid, lease, 1, "d1")
    assert got.task.status is TaskStatus.dispatched
    assert h1.claim(10) == [], "claimed exactly once"
    t = fleet.client.get(tid)
    assert t.status is TaskStatus.dispatched and t.dispatched_at
    assert len(_events(fleet, "dispatched")) == 1


def test_concurrent_claims_race(fleet: Any) -> None:
    fleet.add_host("h1", *[(f"d{i}", "android", ()) for i in range(4)])
    ids = [fleet.client.submit(f"g{i}") for i in range(4)]
    assert all(
        r.startswith("ok:") for r in fleet.store.commit([(t, f"d{i}") for i, t in enumerate(ids)])
    )
    barrier = threading.Barrier(8)
    got: list[list[str]] = [[] for _ in range(8)]
    errors: list[BaseException] = []

    def claimer(i: int) -> None:
        try:
            h = fleet.host("h1")
            barrier.wait(5)
            got[i] = [a.task.id for a in h.claim(1)]
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    winners = [tid for g in got for tid in g]
    assert sorted(winners) == sorted(ids), "each assignment claimed by exactly one request"
    assert sum(1 for g in got if not g) == 4, "every other request received nothing"
    assert all(fleet.client.get(t).status is TaskStatus.dispatched for t in ids)
    assert len(_events(fleet, "dispatched")) == 4


# -- Requirement: Expired attempts follow bounded retry policy --------------------------------
def test_lease_expires_with_attempts_remaining(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    fleet.admin.set_config("lease_ttl", 1)
    first = fleet.client.submit("first", max_attempts=3)
    later = fleet.client.submit("later", max_attempts=3)
    lease = fleet.store.commit([(first, "d1")])[0].removeprefix("ok:")
    (a,) = h.claim(1)
    assert fleet.store.expire()["requeued"] == 0, "not expired yet"
    res = _expire_after(fleet, 1.2)
    assert res["requeued"] == 1 and res["failed"] == 0
    t = fleet.client.get(first)
    assert t.status is TaskStatus.queued and t.attempt == 1
    assert t.device_id is None and t.host_id is None
    # the reservation is released; the device (and its host) are suspect after a lost lease:
    # out of the candidates until the host's next heartbeat proves it alive
    d = fleet.admin.device("d1")
    assert d.reserved_by is None and d.held == "suspect"
    assert fleet.r.zscore(fleet.admin.keys.idle, "d1") is None
    assert fleet.admin.host("h1").suspect
    fleet.beat()
    assert fleet.r.zscore(fleet.admin.keys.idle, "d1") is not None
    assert not fleet.admin.host("h1").suspect
    # the expired attempt stays auditable
    (att,) = t.attempts
    assert (att.lease_id, att.outcome, att.failure_kind, att.expired_in) == (
        lease,
        "expired",
        "lease_expired",
        "dispatched",
    )
    assert att.ended_at and att.dispatched_at
    # it keeps its place ahead of the later submission
    assert [x.id for x in fleet.client.list("queued")] == [first, later]
    assert [e.task for e in _events(fleet, "expired")] == [first]
    assert [e.task for e in _events(fleet, "requeued")] == [first]
    assert a.lease_id == lease


def test_lease_expires_at_attempt_limit(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    fleet.admin.set_config("lease_ttl", 1)
    tid = fleet.client.submit("g", max_attempts=2)
    leases = []
    for attempt in (1, 2):
        leases.append(fleet.store.commit([(tid, "d1")])[0].removeprefix("ok:"))
        (a,) = h.claim(1)
        assert a.attempt == attempt
        res = _expire_after(fleet, 1.2)
        assert res["requeued" if attempt == 1 else "failed"] == 1
        fleet.beat()
    t = fleet.client.get(tid)
    assert t.status is TaskStatus.failed
    assert t.failure_kind is not None and t.failure_kind.value == "lease_expired"
    assert t.attempt == 2 and t.finished_at
    assert fleet.admin.device("d1").reserved_by is None
    assert fleet.r.zscore(fleet.admin.keys.idle, "d1") is not None
    assert [(x.lease_id, x.outcome) for x in t.attempts] == [
        (leases[0], "expired"),
        (leases[1], "expired"),
    ]
    assert fleet.store.commit([(tid, "d1")]) == ["err:task_not_queued"]


# -- Requirement: Terminal transitions validate the active lease ------------------------------
@pytest.mark.parametrize("outcome", ["done", "failed"])
def test_active_lease_reports_completion(fleet: Any, outcome: str) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    tid = fleet.client.submit("g")
    fleet.store.commit([(tid, "d1")])
    (a,) = h.claim(1)
    kind = "runner_failed" if outcome == "failed" else None
    assert h.report(tid, a.lease_id, outcome, kind, "the output") == f"ok:{outcome}"
    t = fleet.client.get(tid)
    assert t.status.value == outcome
    assert (t.result if outcome == "done" else t.error) == "the output"
    assert fleet.admin.device("d1").reserved_by is None
    assert fleet.r.zscore(fleet.admin.keys.leases, tid) is None
    # transitions once: the identical report again is a no-op with the same answer
    snapshot = fleet.r.hgetall(fleet.admin.keys.task(tid))
    assert h.report(tid, a.lease_id, outcome, kind, "the output") == f"dup:{outcome}"
    assert fleet.r.hgetall(fleet.admin.keys.task(tid)) == snapshot
    other = "failed" if outcome == "done" else "done"
    other_kind = "runner_error" if other == "failed" else None
    assert h.report(tid, a.lease_id, other, other_kind, "x") == "rejected:already_terminal"
    assert fleet.r.hgetall(fleet.admin.keys.task(tid)) == snapshot
    assert len(_events(fleet, outcome)) == 1


def test_superseded_lease_reports_completion(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()), ("d2", "android", ()))
    fleet.admin.set_config("lease_ttl", 1)
    tid = fleet.client.submit("g", max_attempts=3)
    fleet.store.commit([(tid, "d1")])
    (old,) = h.claim(1)
    assert _expire_after(fleet, 1.2)["requeued"] == 1
    fleet.beat()
    fleet.admin.set_config("lease_ttl", 60)
    new_lease = fleet.store.commit([(tid, "d2")])[0].removeprefix("ok:")
    (cur,) = h.claim(1)
    assert cur.lease_id == new_lease != old.lease_id
    before = fleet.r.hgetall(fleet.admin.keys.task(tid))
    before_attempts = fleet.r.lrange(fleet.admin.keys.attempts(tid), 0, -1)
    for outcome, kind in (("done", None), ("failed", "runner_failed")):
        assert h.report(tid, old.lease_id, outcome, kind, "stale") == "rejected:superseded"
    assert fleet.r.hgetall(fleet.admin.keys.task(tid)) == before
    assert fleet.r.lrange(fleet.admin.keys.attempts(tid), 0, -1) == before_attempts
    assert fleet.admin.device("d2").reserved_by == tid
    t = fleet.client.get(tid)
    assert (t.status, t.lease_id, t.attempt, t.result) == (
        TaskStatus.dispatched,
        new_lease,
        2,
        None,
    )
    # the current lease still ends it
    assert h.report(tid, new_lease, "done", None, "fresh") == "ok:done"
    assert fleet.client.get(tid).result == "fresh"
