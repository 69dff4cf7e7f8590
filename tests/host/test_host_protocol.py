"""The host side of the protocol at the script level: tokens that cannot be replayed from what
Redis stores, daemon sessions (one live daemon per host), bounded hand-backs, devices held
after a lost lease or a refusal, anti-affinity of retries, and the control list that tells a
daemon to act at once. Real Redis (and fakeredis where marked by the ``fleet`` fixture)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from deviceq import AuthError, HostClient, SessionActive, SessionSuperseded, TaskStatus
from deviceq.host.link import DeviceReport
from deviceq.host.redis_link import token_digest
from deviceq.scheduler import TaskScheduler


def running(fleet: Any, host: HostClient, device: str, goal: str = "g", **kw: Any) -> Any:
    tid = fleet.client.submit(goal, **kw)
    assert fleet.store.commit([(tid, device)])[0].startswith("ok:")
    (a,) = host.claim(1)
    return tid, a


# -- tokens ------------------------------------------------------------------------------------


def test_what_redis_stores_is_not_a_credential(fleet: Any) -> None:
    h1 = fleet.add_host("h1", ("d1", "android", ()))
    fleet.add_host("h2", ("d2", "android", ()))
    stored = fleet.r.hget(fleet.admin.keys.host("h1"), "token_digest")
    assert stored == token_digest(fleet.tokens["h1"]) and stored.startswith("sha1:")
    assert fleet.tokens["h1"] not in str(fleet.r.hgetall(fleet.admin.keys.host("h1")))
    tid, a = running(fleet, h1, "d1")
    # a pool member that read h1's stored digest cannot act as h1 with it
    for forged in (stored, stored.removeprefix("sha1:")):
        impostor = HostClient(fleet.r, fleet.pool, "h1", forged)
        with pytest.raises(AuthError):
            impostor.claim(1)
        with pytest.raises(AuthError):
            impostor.renew([(tid, a.lease_id)])
        with pytest.raises(AuthError):
            impostor.report(tid, a.lease_id, "done")
        with pytest.raises(AuthError):
            impostor.heartbeat([DeviceReport("d1", "android")])
    # nor with its own (valid) token
    with pytest.raises(AuthError):
        HostClient(fleet.r, fleet.pool, "h1", fleet.tokens["h2"]).claim(1)
    assert fleet.client.get(tid).status is TaskStatus.dispatched
    assert h1.report(tid, a.lease_id, "done") == "ok:done"


def test_a_read_only_pool_member_cannot_act_as_another_host(real_fleet: Any, redis_server: Any,
                                                            pool: str) -> None:  # fmt: skip
    """A Redis user that may read every key of the pool (what any host can) reads host A's
    record, and still cannot claim, renew or report as A."""
    f = real_fleet
    ha = f.add_host("hA", ("a1", "android", ()))
    f.add_host("hB", ("b1", "android", ()))
    tid, a = running(f, ha, "a1")
    user = f"reader-{pool}"
    f.r.execute_command("ACL", "SETUSER", user, "reset", "on", ">readerpw",
                        f"~dq:{{{pool}}}:*", "+@read", "+@connection")  # fmt: skip
    try:
        reader = redis.Redis(port=redis_server.port, username=user, password="readerpw",
                             decode_responses=True)  # fmt: skip
        record = reader.hgetall(f.admin.keys.host("hA"))
        with pytest.raises(redis.exceptions.NoPermissionError):
            reader.hset(f.admin.keys.host("hA"), "token_digest", "x")
        reader.close()
        for guess in [record["token_digest"], *record.values()]:
            impostor = HostClient(f.r, pool, "hA", guess or "empty-guess-000000")
            with pytest.raises(AuthError):
                impostor.claim(1)
            with pytest.raises(AuthError):
                impostor.report(tid, a.lease_id, "done")
    finally:
        f.r.execute_command("ACL", "DELUSER", user)
    assert f.client.get(tid).status is TaskStatus.dispatched


def test_rotation_invalidates_the_old_token_at_once(fleet: Any) -> None:
    h1 = fleet.add_host("h1", ("d1", "android", ()))
    new = fleet.admin.rotate_token("h1")
    with pytest.raises(AuthError, match="wrong token"):
        h1.heartbeat([DeviceReport("d1", "android")])
    HostClient(fleet.r, fleet.pool, "h1", new).heartbeat([DeviceReport("d1", "android")])
    assert fleet.r.lrange(fleet.admin.keys.host_ctl("h1"), 0, -1) == ["rotated"]


# -- sessions ----------------------------------------------------------------------------------


def test_one_live_session_per_host(fleet: Any) -> None:
    fleet.add_host("h1", ("d1", "android", ()))
    token = fleet.tokens["h1"]
    first = HostClient(fleet.r, fleet.pool, "h1", token)
    info = first.start_session("s1", "start", "m:b:1:1", "")
    assert (info.epoch, info.replaced, info.handed_back) == (1, "", 0)
    first.heartbeat([DeviceReport("d1", "android")])
    second = HostClient(fleet.r, fleet.pool, "h1", token)
    with pytest.raises(SessionActive, match="already has a live daemon"):
        second.start_session("s2", "start", "m:b:2:1", "s1")
    # a stale view of the session (two daemons starting at once) is refused too
    with pytest.raises(SessionActive, match="started meanwhile"):
        second.start_session("s2", "dead", "m:b:2:1", "")
    # calls without the session, or from another one, are refused while it is active
    with pytest.raises(SessionSuperseded):
        HostClient(fleet.r, fleet.pool, "h1", token).claim(1)
    with pytest.raises(SessionSuperseded):
        HostClient(fleet.r, fleet.pool, "h1", token, session="s9").claim(1)
    assert first.claim(1) == []
    # takeover fences the first session; its daemon is told through the control list
    info = second.start_session("s2", "takeover", "m:b:2:1", "s1")
    assert (info.epoch, info.replaced) == (2, "s1")
    assert fleet.r.lrange(fleet.admin.keys.host_ctl("h1"), 0, -1) == ["session"]
    with pytest.raises(SessionSuperseded, match="superseded"):
        first.heartbeat([DeviceReport("d1", "android")])
    with pytest.raises(SessionSuperseded):
        first.set_draining(True)
    assert not first.end_session(), "a superseded session cannot end the current one"
    assert second.end_session()
    assert fleet.admin.host("h1").session is None
    HostClient(fleet.r, fleet.pool, "h1", token).claim(1)  # no session: sessionless calls ok


def test_a_superseded_sessions_lease_can_neither_renew_nor_report(fleet: Any) -> None:
    fleet.add_host("h1", ("d1", "android", ()), ("d2", "android", ()))
    token = fleet.tokens["h1"]
    old = HostClient(fleet.r, fleet.pool, "h1", token)
    old.start_session("s1", "start", "", "")
    tid, a = running(fleet, old, "d1")
    new = HostClient(fleet.r, fleet.pool, "h1", token)
    new.start_session("s2", "takeover", "", "s1")
    # the new session does not own the old session's attempt either
    assert new.renew([(tid, a.lease_id)])[0].reason == "superseded"
    assert new.report(tid, a.lease_id, "done") == "rejected:superseded"
    t = fleet.client.get(tid)
    assert (t.status, t.session) == (TaskStatus.dispatched, "s1"), "it runs out its lease"


def test_a_dead_sessions_attempts_are_handed_back_at_once(fleet: Any) -> None:
    fleet.add_host("h1", ("d1", "android", ()), ("d2", "android", ()))
    token = fleet.tokens["h1"]
    old = HostClient(fleet.r, fleet.pool, "h1", token)
    old.start_session("s1", "start", "", "")
    t1, _ = running(fleet, old, "d1")
    t2 = fleet.client.submit("assigned, not claimed")
    fleet.store.commit([(t2, "d2")])
    new = HostClient(fleet.r, fleet.pool, "h1", token)
    info = new.start_session("s2", "dead", "", "s1")
    assert info.handed_back == 1
    t = fleet.client.get(t1)
    assert (t.status, t.attempt, t.handbacks) == (TaskStatus.queued, 1, 1)
    assert [x.outcome for x in t.attempts] == ["released"]
    assert fleet.admin.device("d1").held is None, "its runner died with the daemon"
    # the unclaimed assignment stays in the inbox for the new session
    (a,) = new.claim(1)
    assert (a.task.id, fleet.client.get(t2).session) == (t2, "s2")


def test_restarting_keeps_an_operators_drain_and_clears_its_own(fleet: Any) -> None:
    fleet.add_host("h1", ("d1", "android", ()))
    token = fleet.tokens["h1"]
    d1 = HostClient(fleet.r, fleet.pool, "h1", token)
    d1.start_session("s1", "start", "", "")
    fleet.admin.drain("h1")
    assert d1.set_draining(True) == "stopping"
    d1.end_session()
    d2 = HostClient(fleet.r, fleet.pool, "h1", token)
    d2.start_session("s2", "start", "", "")
    host = fleet.admin.host("h1")
    assert host.draining and not host.stopping


# -- hand-backs, holds and suspects ------------------------------------------------------------


def test_hand_backs_are_bounded(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    fleet.admin.set_config("max_handbacks", 3)
    tid = fleet.client.submit("g")
    for i in range(4):
        fleet.beat()
        _, a = tid, fleet.store.commit([(tid, "d1")])[0]
        (a,) = h.claim(1)
        want = "ok:queued" if i < 3 else "ok:failed"
        assert h.release(tid, a.lease_id, f"refused {i}") == want
    t = fleet.client.get(tid)
    assert (t.status, t.failure_kind, t.handbacks) == (TaskStatus.failed, "rejected", 4)
    assert "max_handbacks 3" in (t.error or "") and "refused 3" in (t.error or "")
    assert len(t.attempts) == 4


def test_a_claim_hands_back_an_assignment_whose_device_was_quarantined(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    tid = fleet.client.submit("g")
    fleet.store.commit([(tid, "d1")])
    fleet.admin.quarantine("d1")
    assert h.claim(1) == []
    t = fleet.client.get(tid)
    assert (t.status, t.handbacks) == (TaskStatus.queued, 1)
    assert t.attempts[0].error == "device quarantined before the claim"
    assert fleet.r.lrange(fleet.admin.keys.host_ctl("h1"), 0, -1) == ["quarantine"]


def test_suspect_device_and_host_after_a_lost_lease(fleet: Any) -> None:
    h1 = fleet.add_host("h1", ("d1", "android", ()), ("d2", "android", ()))
    fleet.add_host("h2", ("d3", "android", ()))
    fleet.admin.set_config("lease_ttl", 1)
    tid, a = running(fleet, h1, "d1", max_attempts=3)
    time.sleep(1.1)
    assert fleet.store.expire()["requeued"] == 1
    assert fleet.admin.device("d1").held == "suspect"
    assert fleet.admin.host("h1").suspect
    other = fleet.client.submit("other")
    # the whole host is out until it heartbeats: its other device too
    assert fleet.store.commit([(other, "d2")]) == ["err:host_suspect"]
    assert fleet.store.commit([(tid, "d1")]) == ["err:device_held"]
    sched = TaskScheduler(fleet.admin)
    res = sched.assign()
    assert sorted((t, d) for t, d, _ in res.assignments) == [(tid, "d3")]
    fleet.beat("h1")
    assert fleet.admin.device("d1").held is None and not fleet.admin.host("h1").suspect
    assert fleet.store.commit([(other, "d2")])[0].startswith("ok:")


def test_a_retry_prefers_a_device_and_host_it_has_not_failed_on(fleet: Any) -> None:
    h1 = fleet.add_host("h1", ("a1", "android", ()), ("a2", "android", ()))
    fleet.add_host("h2", ("b1", "android", ()))
    fleet.admin.set_config("lease_ttl", 1)
    tid, _ = running(fleet, h1, "a1", max_attempts=5)
    time.sleep(1.1)
    fleet.store.expire()
    fleet.beat()  # every device is a candidate again
    assert fleet.client.get(tid).avoid_devices == ("a1",)
    assert fleet.r.hget(fleet.admin.keys.avoid, tid) == "a1|h1"
    for strategy in ("fifo_match", "lru_device", "priority_match"):
        sched = TaskScheduler(fleet.admin, strategy=strategy)
        snap = sched.snapshot()  # reads the avoid hash when some queued task has one
        (head,) = [t for b in snap.buckets for t in b.heads]
        assert (head.avoid_devices, head.avoid_hosts) == ({"a1"}, {"h1"})
        pairs, _ = sched.plan(snap)
        assert pairs == [(tid, "b1")], (strategy, pairs)
    # with b1 busy, a new device on the failed host comes before the failed device itself
    fleet.admin.quarantine("b1")
    sched = TaskScheduler(fleet.admin)
    res = sched.assign(expire=False)
    assert [(t, d) for t, d, _ in res.assignments] == [(tid, "a2")]
    assert fleet.r.hget(fleet.admin.keys.avoid, tid) is None, "no record once assigned"


def test_a_strategy_that_ignores_anti_affinity_is_corrected(fleet: Any) -> None:
    h1 = fleet.add_host("h1", ("a1", "android", ()))
    fleet.add_host("h2", ("b1", "android", ()))
    fleet.admin.set_config("lease_ttl", 1)
    tid, _ = running(fleet, h1, "a1", max_attempts=5)
    time.sleep(1.1)
    fleet.store.expire()
    fleet.beat()

    class Stubborn:
        name = "stubborn"

        def propose(self, snapshot: Any) -> list[tuple[str, str]]:
            return [(t.task_id, "a1") for t in snapshot.tasks()]

    res = TaskScheduler(fleet.admin, strategy=Stubborn()).assign(expire=False)
    assert [(t, d) for t, d, _ in res.assignments] == [(tid, "b1")]
