"""`deviceq verify` / `deviceq.verify`: a pool after a realistic run verifies clean; each kind
of violation, planted with raw Redis commands into the test's own pool, is reported by the
Python API and by the CLI (exit 1, in ``--json``); a pool of thousands of tasks is read in
bounded round trips."""

from __future__ import annotations

import inspect
import json
import re
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

import deviceq
from conftest import Fleet
from deviceq import DeviceReport, HostClient, PoolAdmin
from deviceq.cli import main
from deviceq.core.keys import Keys, class_id
from deviceq.core.redis_server import RedisServer
from deviceq.ops.verify import KINDS, verify
from invariants import check_pool

ALL_KINDS = set(KINDS)


# -- a realistic run ---------------------------------------------------------------------------
def realistic_run(f: Any) -> dict[str, str]:
    """Every transition a pool sees (submit, assign through the scheduler's commit, claim,
    report done/failed, lease expiry and retry, cancel queued/assigned/running, hand-back,
    queue timeout, quarantine), leaving tasks in every state. Returns the task ids by role."""
    h1 = f.add_host("h1", ("d1", "android", ("wifi",)), ("d2", "android", ()), ("d3", "ios", ()))
    h2 = f.add_host("h2", ("d4", "browser", ()), ("d5", "android", ("wifi",)))
    f.add_host("h3", ("d6", "android", ()))
    f.admin.quarantine("d6")
    c, store = f.client, f.store
    t: dict[str, str] = {}

    # a lease expires before the claim: the task is retried elsewhere and ends done
    f.admin.set_config("claim_ttl", 1)
    t["retried"] = c.submit("flaky", driver_type="android", tags=["wifi"])
    assert store.commit([(t["retried"], "d1")]) == [f"ok:{t['retried']}-a1"]
    time.sleep(1.1)
    assert store.expire()["requeued"] == 1
    f.admin.set_config("claim_ttl", 30)
    f.beat("h1")
    assert store.commit([(t["retried"], "d5")]) == [f"ok:{t['retried']}-a2"]
    (a,) = h2.claim(5)
    assert h2.report(a.task.id, a.lease_id, "done", payload="ok") == "ok:done"

    # done and failed
    t["done"] = c.submit("open settings", driver_type="android")
    t["failed"] = c.submit("run the ios suite", driver_type="ios")
    assert store.commit([(t["done"], "d2"), (t["failed"], "d3")]) == [
        f"ok:{t['done']}-a1",
        f"ok:{t['failed']}-a1",
    ]
    claimed = {x.task.id: x for x in h1.claim(5)}
    assert h1.report(t["done"], claimed[t["done"]].lease_id, "done", payload="r") == "ok:done"
    assert (
        h1.report(t["failed"], claimed[t["failed"]].lease_id, "failed", "runner_failed", "x")
        == "ok:failed"
    )

    # cancels: queued, assigned (not claimed yet), running (the host reports cancelled)
    t["cancel_queued"] = c.submit("never mind", driver_type="browser")
    assert c.cancel(t["cancel_queued"]) == "cancelled"
    t["cancel_assigned"] = c.submit("not yet", driver_type="browser")
    assert store.commit([(t["cancel_assigned"], "d4")])[0].startswith("ok:")
    assert c.cancel(t["cancel_assigned"]) == "cancelled"
    t["cancel_running"] = c.submit("long one", driver_type="browser")
    assert store.commit([(t["cancel_running"], "d4")])[0].startswith("ok:")
    (a,) = h2.claim(5)
    assert c.cancel(t["cancel_running"]) == "requested"
    assert h2.report(a.task.id, a.lease_id, "cancelled") == "ok:cancelled"

    # a hand-back: queued again, then assigned elsewhere and left running
    t["handed_back"] = c.submit("hand me back", driver_type="android")
    assert store.commit([(t["handed_back"], "d2")])[0].startswith("ok:")
    (a,) = h1.claim(5)
    assert h1.release(a.task.id, a.lease_id, "device busy") == "ok:queued"
    f.beat("h1")

    # a queue timeout, and tasks left queued, assigned and dispatched
    t["timed_out"] = c.submit("too late", driver_type="gpu", queue_timeout=0.05)
    time.sleep(0.1)
    assert store.expire()["unschedulable"] == 1
    t["waiting"] = c.submit("wait for a gpu", driver_type="gpu")
    t["waiting_android"] = c.submit("later", driver_type="android", priority=3)
    t["running"] = t["handed_back"]
    assert store.commit([(t["running"], "d5")])[0].startswith("ok:")
    (a,) = h2.claim(5)
    # multi-device tasks: one running on two hosts (its parts are tasks too), one waiting
    t["gang"] = c.submit("ios and browser at once", roles={"a": "ios", "b": "browser"})
    assert store.commit_gang(t["gang"], ["d3", "d4"]) == "ok:1"
    t["gang_a"], t["gang_b"] = f"{t['gang']}.a", f"{t['gang']}.b"
    assert [x.task.id for x in h1.claim(5)] == [t["gang_a"]]
    assert [x.task.id for x in h2.claim(5)] == [t["gang_b"]]
    t["gang_waiting"] = c.submit("gpu and browser", roles={"g": "gpu", "b": "browser"})
    t["assigned"] = c.submit("assigned only", driver_type="android", tags=["wifi"])
    assert store.commit([(t["assigned"], "d1")])[0].startswith("ok:")

    return t


def test_clean_pool_after_a_realistic_run_verifies_clean(fleet: Any) -> None:
    ids = realistic_run(fleet)
    check_pool(fleet.r, fleet.admin.keys)  # the test suite's own checker agrees
    res = verify(fleet.admin)
    assert res.ok, [v.line() for v in res.violations]
    assert res.violations == [] and res.as_dict()["violations"] == []
    assert res.checked["tasks"] == len(set(ids.values()))
    assert res.checked["devices"] == 6
    assert res.checked["events"] > 30
    assert res.skipped.get("history_trimmed", 0) == 0
    # the (redis_or_url, pool) form gives the same answer
    assert verify(fleet.r, fleet.pool).as_dict() == res.as_dict()
    assert deviceq.verify is verify


# -- a planted pool ----------------------------------------------------------------------------
@dataclass
class Lab:
    """The test's own pool after `realistic_run` on the real server: raw access to plant
    inconsistencies, and both ways of verifying it."""

    r: redis.Redis
    url: str
    pool: str
    keys: Keys
    ids: dict[str, str]

    def task(self, role: str) -> dict[str, str]:
        return self.r.hgetall(self.keys.task(self.ids[role]))  # type: ignore[return-value]

    def cli(self, *args: str) -> Result:
        return CliRunner().invoke(
            main, ["--redis-url", self.url, "--pool", self.pool, "verify", *args]
        )

    def idle_class(self, did: str) -> str:
        """The idle set of device ``did``'s class."""
        drv, tags = self.r.hmget(self.keys.device(did), "driver_type", "tags")
        return self.keys.idle_class(class_id(f"{drv}|{tags or ''}"))

    def expect(self, kind: str, *, also: frozenset[str] = frozenset(), **subject: str) -> None:
        """`verify` reports ``kind`` about ``subject`` (and no kind outside ``{kind} | also``);
        the CLI exits 1 with it in ``--json`` and in its text output."""
        res = verify(self.r, self.pool)
        assert not res.ok
        found = [v for v in res.violations if v.kind == kind]
        assert found, [v.line() for v in res.violations]
        assert any(all(getattr(v, n) == x for n, x in subject.items()) for v in found), found
        assert res.kinds() <= {kind} | set(also), [v.line() for v in res.violations]
        out = self.cli("--json")
        assert out.exit_code == 1, out.output
        data = json.loads(out.stdout)
        assert set(data) == {"pool", "violations", "checked", "skipped"}
        assert data["pool"] == self.pool
        assert data["checked"]["passes"] == 2  # a second pass confirmed it
        assert {"kind": kind, **subject}.items() <= next(
            v for v in data["violations"] if v["kind"] == kind and subject.items() <= v.items()
        ).items()
        text = self.cli()
        assert text.exit_code == 1
        lines = text.stdout.splitlines()
        assert lines[0].startswith(f"pool {self.pool}: {len(res.violations)} violation(s)")
        assert any(line.strip().startswith(f"{kind}: ") for line in lines[1:])


@pytest.fixture(scope="module")
def template(redis_server: RedisServer) -> tuple[str, dict[str, str]]:
    """One realistic run per module (it sleeps through a lease expiry), copied per test."""
    pool = "vt" + uuid.uuid4().hex[:12]
    with redis.Redis.from_url(redis_server.url, decode_responses=True) as r:
        return pool, realistic_run(Fleet(r, pool))


def clone_pool(url: str, src: str, dst: str) -> None:
    """Copy every key of pool ``src`` to pool ``dst`` (DUMP/RESTORE keeps stream ids and
    TTLs; no value names its pool)."""
    src_prefix, dst_prefix = Keys(src).prefix, Keys(dst).prefix
    with redis.Redis.from_url(url) as raw:
        for key in raw.scan_iter(match=src_prefix + "*", count=500):
            name = key.decode()[len(src_prefix) :]
            raw.restore(dst_prefix + name, max(0, int(raw.pttl(key))), raw.dump(key))  # type: ignore[arg-type]


@pytest.fixture
def lab(
    template: tuple[str, dict[str, str]], real_r: redis.Redis, redis_url: str, pool: str
) -> Lab:
    clone_pool(redis_url, template[0], pool)
    lab = Lab(real_r, redis_url, pool, Keys(pool), dict(template[1]))
    before = verify(lab.r, lab.pool)
    assert before.ok, [v.line() for v in before.violations]
    assert lab.cli().exit_code == 0
    return lab


def _open_record(lab: Lab, role: str) -> None:
    """Reopen a task's last attempt record (outcome back to ``active``)."""
    key = lab.keys.attempts(lab.ids[role])
    rec = json.loads(lab.r.lindex(key, -1))  # type: ignore[arg-type]
    rec["outcome"] = "active"
    lab.r.lset(key, -1, json.dumps(rec))


def _bucket(lab: Lab, role: str) -> str:
    return lab.task(role)["sig"]


def test_clean_cli_json_and_text(lab: Lab) -> None:
    out = lab.cli("--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["violations"] == [] and data["pool"] == lab.pool
    assert data["checked"]["tasks"] == len(set(lab.ids.values()))
    assert data["checked"]["devices"] == 6 and data["checked"]["events"] > 30
    text = lab.cli()
    assert text.exit_code == 0
    assert text.stdout.splitlines() == [text.stdout.strip()]
    assert text.stdout.startswith(f"pool {lab.pool}: ok (")


def test_device_reserved_by_two_live_leases(lab: Lab) -> None:
    # the assigned task now names the running task's device; its own device is released
    run, asg = lab.task("running"), lab.task("assigned")
    lab.r.hset(lab.keys.task(lab.ids["assigned"]), "device_id", run["device_id"])
    lab.r.hset(lab.keys.device(asg["device_id"]), mapping={"reserved_by": "", "lease_id": ""})
    lab.expect("device_two_leases", device=run["device_id"])


def test_device_reserved_by_disagrees_with_its_task(lab: Lab) -> None:
    run = lab.task("running")
    lab.r.hset(lab.keys.device(run["device_id"]), "reserved_by", lab.ids["done"])
    lab.expect("reservation_mismatch", task=lab.ids["running"], device=run["device_id"])


def test_device_held_by_a_lease_and_a_reservation(lab: Lab) -> None:
    did = lab.task("running")["device_id"]
    lab.r.hset(lab.keys.device(did), mapping={"booked_until": "4102444800000", "booked_by": "al"})
    lab.r.zadd(lab.keys.bookings, {did: 4102444800000})
    lab.expect("lease_and_booking", device=did)


def test_reservation_missing_from_bookings(lab: Lab) -> None:
    (did,) = lab.r.zrange(lab.keys.idle, 0, 0)  # type: ignore[misc]
    lab.r.hset(lab.keys.device(did), mapping={"booked_until": "4102444800000", "booked_by": "al"})
    lab.r.zrem(lab.keys.idle, did)
    lab.r.zrem(lab.idle_class(did), did)
    lab.expect("booking_index", device=did, key="bookings")


def test_task_in_two_active_indexes_has_two_leases(lab: Lab) -> None:
    tid = lab.ids["running"]
    lab.r.zadd(lab.keys.status("assigned"), {tid: float(lab.task("running")["seq"])})
    lab.expect("task_two_leases", task=tid)


def test_two_open_attempts_are_two_leases(lab: Lab) -> None:
    # the running task was handed back once: its first (released) attempt reopened beside
    # its live one
    tid = lab.ids["running"]
    key = lab.keys.attempts(tid)
    first = json.loads(lab.r.lindex(key, 0))  # type: ignore[arg-type]
    assert first["outcome"] == "released"
    first["outcome"] = "active"
    lab.r.lset(key, 0, json.dumps(first))
    lab.expect("task_two_leases", task=tid)


def test_assignment_while_a_lease_is_live(lab: Lab) -> None:
    tid = lab.ids["running"]
    lab.r.xadd(
        lab.keys.events,
        {"type": "assigned", "task": tid, "lease": f"{tid}-a3", "host": "h1", "device": "d2",
         "attempt": "3"},
    )  # fmt: skip
    # (the planted lease has no attempt record either)
    lab.expect("task_two_leases", also=frozenset({"attempt_missing"}), task=tid)


def test_task_terminal_twice_in_the_stream(lab: Lab) -> None:
    t = lab.task("done")
    lab.r.xadd(
        lab.keys.events,
        {"type": "failed", "task": t["id"], "lease": t["lease_id"], "host": t["host_id"],
         "device": t["device_id"], "attempt": t["attempt"], "failure_kind": "runner_failed"},
    )  # fmt: skip
    lab.expect("terminal_twice", task=t["id"])


def test_terminal_task_with_an_open_attempt(lab: Lab) -> None:
    _open_record(lab, "failed")
    lab.expect("unclosed_attempt", task=lab.ids["failed"])


def test_report_from_a_superseded_lease(lab: Lab) -> None:
    # the running task was handed back on lease -a1 and now runs on -a2: a `done` of -a1
    # was accepted
    tid = lab.ids["running"]
    assert lab.task("running")["lease_id"] == f"{tid}-a2"
    lab.r.xadd(
        lab.keys.events,
        {"type": "done", "task": tid, "lease": f"{tid}-a1", "host": "h1", "device": "d2",
         "attempt": "1", "failure_kind": ""},
    )  # fmt: skip
    lab.expect("superseded_report", task=tid)


def test_released_event_from_a_superseded_lease(lab: Lab) -> None:
    tid = lab.ids["retried"]
    lab.r.xadd(
        lab.keys.events,
        {"type": "released", "task": tid, "lease": f"{tid}-a1", "host": "h1", "device": "d1",
         "attempt": "1", "handbacks": "1", "reason": "late"},
    )  # fmt: skip
    lab.expect("superseded_report", task=tid)


def test_attempt_missing_from_the_history(lab: Lab) -> None:
    lab.r.rpop(lab.keys.attempts(lab.ids["retried"]))
    lab.expect("attempt_missing", task=lab.ids["retried"])


def test_assigned_lease_without_an_attempt_record(lab: Lab) -> None:
    # as many records as attempts, but the first one names another lease than the stream
    tid = lab.ids["retried"]
    key = lab.keys.attempts(tid)
    first = json.loads(lab.r.lindex(key, 0))  # type: ignore[arg-type]
    assert first["lease_id"] == f"{tid}-a1" and first["outcome"] == "expired"
    first["lease_id"] = f"{tid}-a9"
    lab.r.lset(key, 0, json.dumps(first))
    res = verify(lab.r, lab.pool)
    assert [v.detail for v in res.violations] == [
        f"lease {tid}-a1 was assigned (event stream) but has no attempt record"
    ]
    lab.expect("attempt_missing", task=tid)


def test_lost_task(lab: Lab) -> None:
    # the waiting gpu task (alone in its bucket) vanishes with all of its index entries
    tid, sig = lab.ids["waiting"], _bucket(lab, "waiting")
    lab.r.delete(lab.keys.task(tid), lab.keys.queue(sig), lab.keys.sig(sig))
    lab.r.zrem(lab.keys.queues, sig)
    lab.r.zrem(lab.keys.status("queued"), tid)
    lab.expect("task_lost", task=tid)
    # a queue deadline left behind by a lost task is an orphan too
    lab.r.zadd(lab.keys.deadlines, {tid: time.time() * 1000 + 60_000})
    lab.expect("orphan_index_entry", also=frozenset({"task_lost"}), task=tid, key="deadlines")


def test_task_in_no_status_index(lab: Lab) -> None:
    lab.r.zrem(lab.keys.status("done"), lab.ids["done"])
    lab.expect("task_unindexed", task=lab.ids["done"])


def test_task_in_two_status_indexes(lab: Lab) -> None:
    lab.r.zadd(lab.keys.status("failed"), {lab.ids["done"]: time.time() * 1000})
    lab.expect("task_in_two_indexes", task=lab.ids["done"])


def test_task_indexed_under_another_status(lab: Lab) -> None:
    tid = lab.ids["cancel_queued"]
    score = lab.r.zscore(lab.keys.status("cancelled"), tid)
    lab.r.zrem(lab.keys.status("cancelled"), tid)
    lab.r.zadd(lab.keys.status("done"), {tid: score})  # type: ignore[dict-item]
    lab.expect("status_index_mismatch", task=tid)


def test_index_entries_without_their_task(lab: Lab) -> None:
    now = time.time() * 1000
    lab.r.zadd(lab.keys.status("done"), {"ghost1": now})
    lab.r.rpush(lab.keys.inbox("h1"), "ghost2")
    lab.r.zadd(lab.keys.leases, {"ghost3": now + 60_000})
    lab.r.hset(lab.keys.avoid, "ghost4", "d1|h1")
    res = verify(lab.r, lab.pool)
    assert {(v.task, v.key) for v in res.violations} == {
        ("ghost1", "status:done"),
        ("ghost2", "host:h1:inbox"),
        ("ghost3", "leases"),
        ("ghost4", "avoid"),
    }
    lab.expect("orphan_index_entry", task="ghost2", key="host:h1:inbox")


def test_index_entries_in_the_wrong_state(lab: Lab) -> None:
    lab.r.hset(lab.keys.avoid, lab.ids["done"], "d1|h1")
    lab.r.rpush(lab.keys.inbox("h2"), lab.ids["running"])
    res = verify(lab.r, lab.pool)
    assert {(v.task, v.key) for v in res.violations} == {
        (lab.ids["done"], "avoid"),
        (lab.ids["running"], "host:h2:inbox"),
    }
    lab.expect("stale_index_entry", task=lab.ids["done"], key="avoid")


def test_lease_entry_without_a_live_lease(lab: Lab) -> None:
    lab.r.zadd(lab.keys.leases, {lab.ids["done"]: time.time() * 1000 + 60_000})
    lab.expect("lease_entry_stale", task=lab.ids["done"])


def test_lease_entry_scored_other_than_its_expiry(lab: Lab) -> None:
    lab.r.zincrby(lab.keys.leases, 5000, lab.ids["running"])
    lab.expect("lease_entry_stale", task=lab.ids["running"])


def test_live_lease_without_a_lease_entry(lab: Lab) -> None:
    lab.r.zrem(lab.keys.leases, lab.ids["assigned"])
    lab.expect("lease_entry_missing", task=lab.ids["assigned"])


def test_device_counters_disagree_with_the_devices(lab: Lab) -> None:
    lab.r.hincrby(lab.keys.caps, "android|wifi", 1)
    lab.r.hincrby(lab.keys.qdrivers, "ios", 1)
    res = verify(lab.r, lab.pool)
    assert sorted(v.key for v in res.violations) == ["caps", "qdrivers"]
    lab.expect("device_counts", key="caps")


def test_queue_depth_disagrees_with_the_buckets(lab: Lab) -> None:
    # a queued task drops out of its bucket (which empties: its head and constraints follow)
    tid, sig = lab.ids["waiting_android"], _bucket(lab, "waiting_android")
    lab.r.zrem(lab.keys.queue(sig), tid)
    lab.r.zrem(lab.keys.queues, sig)
    lab.r.delete(lab.keys.sig(sig))
    lab.expect("queue_depth", also=frozenset({"bucket_mismatch"}), key="status:queued")


def test_gangs_holds_a_task_that_is_not_a_queued_multi_device_one(lab: Lab) -> None:
    lab.r.zadd(lab.keys.gangs, {lab.ids["done"]: 1})
    lab.expect("gang_index", also=frozenset({"queue_depth"}), task=lab.ids["done"])


def test_a_multi_device_task_holding_only_some_of_its_devices(lab: Lab) -> None:
    # one part lost its lease and device while its task still runs
    part = lab.ids["gang_b"]
    lab.r.hset(lab.keys.task(part), mapping={"status": "queued", "lease_expires_at": ""})
    lab.r.zrem(lab.keys.leases, part)
    lab.r.hset(lab.keys.device("d4"), mapping={"reserved_by": "", "lease_id": ""})
    lab.r.hincrby(lab.keys.host_held, lab.r.hget(lab.keys.task(part), "host_id") or "", -1)
    lab.expect("gang_partial", also=frozenset({"unclosed_attempt"}), task=lab.ids["gang"])


def test_retries_hold_a_task_that_is_not_queued(lab: Lab) -> None:
    # a done task left in the retries index (its backoff wait never ended cleanly)
    lab.r.zadd(lab.keys.retries, {lab.ids["done"]: 1})
    lab.expect("retry_index", also=frozenset({"queue_depth"}), task=lab.ids["done"], key="retries")


def test_a_waiting_retry_is_queued_in_no_bucket_and_verifies(lab: Lab) -> None:
    """A task waiting out its retry backoff (in retries, out of its bucket) is consistent."""
    tid, sig = lab.ids["waiting"], _bucket(lab, "waiting")
    lab.r.zrem(lab.keys.queue(sig), tid)
    if not lab.r.zcard(lab.keys.queue(sig)):
        lab.r.zrem(lab.keys.queues, sig)
        lab.r.delete(lab.keys.sig(sig))
    else:
        head = lab.r.zrange(lab.keys.queue(sig), 0, 0, withscores=True)[0][1]
        lab.r.zadd(lab.keys.queues, {sig: head})
    lab.r.zadd(lab.keys.retries, {tid: 10**13})
    lab.r.hset(lab.keys.task(tid), "eligible_at", 10**13)
    assert verify(lab.r, lab.pool).ok
    lab.r.zrem(lab.keys.retries, tid)  # now in neither: lost
    lab.expect("queue_depth", also=frozenset({"bucket_mismatch"}), key="status:queued")


def test_tenant_held_disagrees_with_the_leases(lab: Lab) -> None:
    lab.r.hset(lab.keys.tenant_held, "team-x", 2)
    lab.expect("tenant_held", key="tenant_held")


def test_tenant_host_held_disagrees_with_the_leases(lab: Lab) -> None:
    lab.r.hset(lab.keys.counter("tenant_host_held"), "team-x|h1", 2)
    lab.expect("tenant_host_held", key="tenant_host_held", host="h1")


def test_host_held_disagrees_with_the_leases(lab: Lab) -> None:
    lab.r.hincrby(lab.keys.host_held, "h1", 1)
    lab.expect("host_held", key="host_held", host="h1")


def test_bucket_holds_a_task_out_of_order(lab: Lab) -> None:
    tid, sig = lab.ids["waiting"], _bucket(lab, "waiting")
    lab.r.zadd(lab.keys.queue(sig), {tid: 10**9})
    lab.r.zadd(lab.keys.queues, {sig: 10**9})
    lab.expect("bucket_mismatch", task=tid, key=f"queue:{sig}")


def test_bucket_holds_a_task_that_is_not_queued(lab: Lab) -> None:
    sig = _bucket(lab, "waiting")
    lab.r.zadd(lab.keys.queue(sig), {lab.ids["done"]: float(lab.task("done")["seq"])})
    lab.r.zadd(lab.keys.queues, {sig: float(lab.task("done")["seq"])})
    lab.expect("bucket_mismatch", also=frozenset({"queue_depth"}), task=lab.ids["done"])


def test_queues_head_disagrees_with_the_bucket(lab: Lab) -> None:
    sig = _bucket(lab, "waiting")
    lab.r.zadd(lab.keys.queues, {sig: 1})
    lab.r.zadd(lab.keys.queues, {"0000000000000000": 5})
    res = verify(lab.r, lab.pool)
    assert len([v for v in res.violations if v.kind == "queue_head"]) == 2
    lab.expect("queue_head", key="queues")


def test_bucket_constraints_exist_exactly_while_non_empty(lab: Lab) -> None:
    sig = _bucket(lab, "waiting")
    lab.r.delete(lab.keys.sig(sig))
    lab.r.hset(lab.keys.sig("0000000000000000"), mapping={"driver_type": "x", "tags": ""})
    res = verify(lab.r, lab.pool)
    assert sorted(v.key for v in res.violations) == [f"sig:{x}" for x in sorted([sig, "0" * 16])]
    lab.expect("bucket_constraints", key=f"sig:{sig}")


def test_idle_entry_that_is_not_assignable(lab: Lab) -> None:
    run = lab.task("running")
    now = time.time() * 1000
    lab.r.zadd(lab.keys.idle, {run["device_id"]: now, "d6": now, "nosuch": now})
    for did in (run["device_id"], "d6"):  # (their class sets in step: only the rule is broken)
        lab.r.zadd(lab.idle_class(did), {did: now})
    res = verify(lab.r, lab.pool)
    assert {v.device for v in res.violations} == {run["device_id"], "d6", "nosuch"}
    assert all(v.kind == "idle_not_assignable" for v in res.violations)
    lab.expect("idle_not_assignable", device="d6")


def test_idle_class_sets_out_of_step_with_idle(lab: Lab) -> None:
    (did,) = lab.r.zrange(lab.keys.idle, 0, 0)  # type: ignore[misc]
    lab.r.zrem(lab.idle_class(did), did)  # the scheduler would never see it
    lab.r.zadd(lab.keys.idle_class("0123456789ab"), {"ghost": 1})  # not in idle at all
    res = verify(lab.r, lab.pool)
    assert {v.device for v in res.violations if v.kind == "idle_classes"} == {did, "ghost"}
    lab.expect("idle_classes", device=did, key="idle")


def test_every_kind_has_a_test() -> None:
    """Every kind of violation is planted and expected (`Lab.expect`) by a test here."""
    module = sys.modules[__name__]
    tests = [
        fn
        for name, fn in vars(module).items()
        if name.startswith("test_") and name != "test_every_kind_has_a_test"
    ]
    source = "".join(inspect.getsource(fn) for fn in tests)
    expected = set(re.findall(r'expect\(\s*"(\w+)"', source))
    assert expected == ALL_KINDS, ALL_KINDS ^ expected


def test_a_race_seen_by_one_pass_only_is_not_reported(lab: Lab) -> None:
    tid = lab.ids["done"]
    score = lab.r.zscore(lab.keys.status("done"), tid)
    lab.r.zrem(lab.keys.status("done"), tid)
    scans: list[int] = []

    def progress(stage: str, done: int, total: int | None) -> None:
        if stage == "scanning keys":
            scans.append(done)
            if len(scans) == 2:  # the second pass starts: the transition has completed
                lab.r.zadd(lab.keys.status("done"), {tid: score})  # type: ignore[dict-item]

    res = verify(lab.r, lab.pool, progress=progress)
    assert res.ok and res.checked["passes"] == 2 and res.skipped["transient"] == 1
    # without confirmation the first pass is the answer
    lab.r.zrem(lab.keys.status("done"), tid)
    once = verify(lab.r, lab.pool, confirm=False)
    assert once.kinds() == {"task_unindexed"} and once.checked["passes"] == 1
    out = lab.cli("--no-confirm", "--json")
    assert out.exit_code == 1 and json.loads(out.stdout)["checked"]["passes"] == 1


# -- history trimmed, retention, errors ----------------------------------------------------------
def test_trimmed_history_is_skipped_not_judged(lab: Lab) -> None:
    lab.r.xtrim(lab.keys.events, maxlen=5, approximate=False)
    res = verify(lab.r, lab.pool)
    assert res.ok, [v.line() for v in res.violations]
    assert res.checked["events"] == 5
    assert res.skipped["history_trimmed"] >= len(set(lab.ids.values())) - 2
    # a terminal event twice is still seen in what is left of the stream
    t = lab.task("done")
    for kind in ("done", "done"):
        lab.r.xadd(lab.keys.events, {"type": kind, "task": t["id"], "lease": t["lease_id"]})
    assert verify(lab.r, lab.pool).kinds() == {"terminal_twice"}


def test_terminal_tasks_past_retention_await_the_trim(lab: Lab) -> None:
    # retention is 1 s and has passed: one finished task's keys have expired (its index entry
    # awaits expire.lua's trim), another's index entry was trimmed (its keys await expiry)
    lab.r.hset(lab.keys.config, "retention", "1")
    time.sleep(1.1)
    done, failed = lab.ids["done"], lab.ids["failed"]
    lab.r.delete(lab.keys.task(done), lab.keys.attempts(done))
    lab.r.zrem(lab.keys.status("failed"), failed)
    # a queue deadline outlives its finished task (entries are dropped lazily): not judged
    lab.r.zadd(lab.keys.deadlines, {done: time.time() * 1000 + 60_000})
    res = verify(lab.r, lab.pool)
    assert res.ok, [v.line() for v in res.violations]
    assert res.skipped["past_retention"] == 2
    assert res.skipped["deadline_entries_unjudged"] == 1
    # within the retention window the same state is a violation
    lab.r.hset(lab.keys.config, "retention", "3600")
    assert verify(lab.r, lab.pool).kinds() == {"orphan_index_entry", "task_unindexed"}


def test_bad_pool_and_url_are_one_line_errors(redis_url: str, pool: str) -> None:
    for args, needle in [
        (["--redis-url", redis_url, "--pool", "bad pool!"], "pool"),
        (["--redis-url", "http://nope", "--pool", pool], "invalid Redis URL"),
        (["--redis-url", "redis://127.0.0.1:1/0", "--pool", pool], "cannot reach Redis"),
        (["--redis-url", redis_url, "--pool", pool], "no keys"),
    ]:
        res = CliRunner().invoke(main, [*args, "verify", "--json"])
        assert res.exit_code == 1, res.output
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
        assert res.stdout == ""


def test_python_api_forms(lab: Lab, redis_url: str) -> None:
    pool = lab.pool
    by_url = verify(redis_url, pool)
    assert by_url.ok and by_url.checked["tasks"] == len(set(lab.ids.values()))
    admin = PoolAdmin(redis_url, pool)
    assert verify(admin).as_dict() == by_url.as_dict() == verify(lab.r, pool).as_dict()
    with pytest.raises(deviceq.InvalidInput):
        verify(admin, "other")
    with pytest.raises(deviceq.InvalidInput):
        verify(admin, batch=1)
    with pytest.raises(deviceq.InvalidInput):
        verify(redis.Redis.from_url(redis_url), pool)  # replies must be decoded
    with pytest.raises(deviceq.NotFound):
        verify(redis_url, pool + "x")
    with pytest.raises(deviceq.ConfigError):
        verify("http://nope", pool)


# -- bounded reads -----------------------------------------------------------------------------
class Recorder(redis.Redis):
    """A client that records every round trip: the commands sent and each reply's size."""

    trips: list[list[tuple[str, int]]]

    def execute_command(self, *args: Any, **options: Any) -> Any:
        reply = super().execute_command(*args, **options)
        self.trips.append([(str(args[0]).upper(), _size(reply))])
        return reply

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        return RecordingPipeline(self, transaction, shard_hint)


class RecordingPipeline(redis.client.Pipeline):
    def __init__(self, owner: Recorder, transaction: bool, shard_hint: Any) -> None:
        super().__init__(owner.connection_pool, owner.response_callbacks, transaction, shard_hint)
        self.owner = owner

    def execute(self, raise_on_error: bool = True) -> Any:
        names = [str(args[0]).upper() for args, _ in self.command_stack]
        replies = super().execute(raise_on_error)
        self.owner.trips.append([(n, _size(x)) for n, x in zip(names, replies, strict=True)])
        return replies


def _size(reply: Any) -> int:
    """Entries in a reply: a collection's length (a SCAN's page), else 1."""
    scan_page = (
        isinstance(reply, tuple | list)
        and len(reply) == 2
        and isinstance(reply[0], int | str | bytes)
        and isinstance(reply[1], list | dict)
    )
    if scan_page:
        return len(reply[1])  # SCAN, SSCAN, HSCAN: (cursor, page)
    if isinstance(reply, list | dict | set | tuple):
        return len(reply)
    return 1


READS = {
    "TIME", "HGET", "HMGET", "LLEN", "LRANGE", "ZCARD", "ZRANGE", "SCAN", "SSCAN", "HSCAN",
    "XRANGE", "XREVRANGE", "EXISTS", "MULTI", "EXEC",
}  # fmt: skip


@pytest.fixture
def big_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


def test_thousands_of_tasks_are_read_in_bounded_batches(big_server: RedisServer) -> None:
    pool, n, batch = "big", 3000, 100
    plain = redis.Redis.from_url(big_server.url, decode_responses=True)
    admin = PoolAdmin(plain, pool)
    host = HostClient(plain, pool, "h1", admin.add_host("h1"))
    devices = [DeviceReport(f"d{i}", "android", ("wifi",)) for i in range(40)]
    host.heartbeat(devices)
    client = deviceq.Client(plain, pool)
    ids = client.submit_many([{"goal": f"case {i}", "driver_type": "android"} for i in range(n)])
    store = deviceq.SchedulerClient(plain, pool)
    for round_ in range(5):  # some history: 200 assigned, claimed and done
        pairs = list(zip(ids[round_ * 40 :][:40], [d.device_id for d in devices], strict=True))
        assert all(x.startswith("ok:") for x in store.commit(pairs))
        for a in host.claim(100):
            assert host.report(a.task.id, a.lease_id, "done", payload="ok") == "ok:done"
    plain.zadd(admin.keys.leases, {ids[n // 2]: 1})  # one needle in the haystack

    rec = Recorder.from_url(big_server.url, decode_responses=True)
    rec.trips = []
    res = verify(rec, pool, batch=batch)
    assert [(v.kind, v.task) for v in res.violations] == [("lease_entry_stale", ids[n // 2])]
    assert res.checked["tasks"] == n and res.checked["events"] > n + 600

    sent = [name for trip in rec.trips for name, _ in trip]
    assert set(sent) <= READS, set(sent) - READS  # read-only, no KEYS/SMEMBERS/HGETALL
    for trip in rec.trips:
        assert len(trip) <= batch, trip[:3]
        for name, size in trip:
            limit = 2 * batch if name.endswith("SCAN") else batch
            assert size <= limit, (name, size)
        ranged = sum(size for name, size in trip if name in ("ZRANGE", "LRANGE", "XRANGE"))
        assert ranged <= batch or any(name == "HMGET" for name, _ in trip), trip[:3]
    # the whole pool went through many small round trips, not a few big ones
    assert len(rec.trips) >= (3 * n) // batch + n // batch
    assert sum(1 for trip in rec.trips for name, _ in trip if name == "XRANGE") >= 30


def test_key_of_the_wrong_type_is_reported_not_fatal(lab: Lab) -> None:
    lab.r.delete(lab.keys.leases)
    lab.r.set(lab.keys.leases, "oops")
    tid = lab.ids["done"]
    lab.r.delete(lab.keys.attempts(tid))
    lab.r.set(lab.keys.attempts(tid), "oops")
    res = verify(lab.r, lab.pool)
    assert {v.key for v in res.violations if v.kind == "wrong_type"} == {
        "leases",
        f"task:{tid}:attempts",
    }
    # what could not be read is missing: the live leases have no entry, the attempts no record
    lab.expect(
        "wrong_type",
        also=frozenset({"lease_entry_missing", "attempt_missing"}),
        key="leases",
    )


def test_a_retried_task_is_not_two_leases(real_fleet: Fleet) -> None:
    """A failure that is retried (`retrying` event) ends its lease: the next assignment is
    not a second live lease."""
    h = real_fleet.add_host("h1", ("d1", "android", ()))
    tid = real_fleet.client.submit("flaky", max_attempts=2, retry_on="runner_failed")
    for attempt in (1, 2):
        assert real_fleet.store.commit([(tid, "d1")])[0].startswith("ok:")
        (a,) = h.claim(1)
        outcome = "failed" if attempt == 1 else "done"
        h.report(tid, a.lease_id, outcome, "runner_failed" if attempt == 1 else None, "x")
    assert real_fleet.client.get(tid).status.value == "done"
    res = verify(real_fleet.r, real_fleet.pool)
    assert res.ok, [str(v) for v in res.violations]


def test_a_task_rewritten_to_another_host_is_reported(real_fleet: Fleet, redis_url: str) -> None:
    """The forgery a host with a Redis user can do: rewrite another host's running task to
    name itself (host_id and its own session), then report it with its own token. The
    report is accepted; the auditor flags the task, whose host is neither its device's nor
    its attempt's."""
    f = real_fleet
    ha = f.add_host("hA", ("dA", "android", ()))
    hb = f.add_host("hB", ("dB", "ios", ()))
    ha.start_session("sessA")
    hb.start_session("sessB")
    tid = f.client.submit("on B", driver_type="ios")
    assert f.store.commit([(tid, "dB")])[0].startswith("ok:")
    (a,) = hb.claim(1)
    assert verify(f.r, f.pool).ok
    f.r.hset(f.admin.keys.task(tid), mapping={"host_id": "hA", "session": "sessA"})
    assert ha.report(tid, a.lease_id, "done", payload="forged") == "ok:done"
    res = verify(f.r, f.pool)
    found = [v for v in res.violations if v.kind == "task_host_mismatch"]
    assert [(v.task, v.host, v.device) for v in found] == [(tid, "hA", "dB")], res.violations
    assert "hB" in found[0].detail
    # (the lease was counted for hB and ended as hA's: host_held is left wrong for hB too)
    assert [v.host for v in res.violations if v.kind == "host_held"] == ["hB"]
    lab = Lab(f.r, redis_url, f.pool, f.admin.keys, {})
    # (its done event names hA, but the lease was assigned to hB: report_host_mismatch too)
    lab.expect("task_host_mismatch", also=frozenset({"host_held", "report_host_mismatch"}),
               task=tid, host="hA")  # fmt: skip


# -- forgeries by direct-Redis ACL users (Redis runs a script with its caller's rights) -------
class AclUsers:
    """Redis users made from the lines ``deviceq acl --role R --password-file F`` prints,
    run as the administrator; ``close()`` deletes them."""

    def __init__(self, r: redis.Redis, port: int, pool: str, tmp: Any) -> None:
        self.r, self.port, self.pool, self.tmp = r, port, pool, tmp
        self.users: list[str] = []

    def url(self, role: str, host_id: str | None = None) -> str:
        password = uuid.uuid4().hex
        pw = self.tmp / f"{role}-{host_id}.pw"
        pw.write_text(password + "\n")
        args = ["acl", "--pool", self.pool, "--role", role, "--password-file", str(pw)]
        res = CliRunner().invoke(main, [*args, *(["--host-id", host_id] if host_id else [])])
        assert res.exit_code == 0, res.output
        assert "does NOT confine" in res.stderr and "HTTP API" in res.stderr  # the warning
        line = res.stdout.strip()
        user = line.split()[2]
        self.r.execute_command(*line.split())
        self.users.append(user)
        return f"redis://{user}:{password}@127.0.0.1:{self.port}/0"

    def close(self) -> None:
        for user in self.users:
            self.r.execute_command("ACL", "DELUSER", user)


@pytest.fixture
def acl_users(real_fleet: Fleet, redis_server: RedisServer, tmp_path: Any) -> Iterator[AclUsers]:
    users = AclUsers(real_fleet.r, redis_server.port, real_fleet.pool, tmp_path)
    try:
        yield users
    finally:
        users.close()


def test_the_acl_warning_says_what_direct_users_do_not_prevent() -> None:
    for role in ("producer", "host"):
        res = CliRunner().invoke(main, ["acl", "--pool", "lab", "--role", role, "--json"])
        assert res.exit_code == 0, res.output
        (user,) = json.loads(res.stdout)
        text = user["does_not_prevent"]
        assert "does NOT confine" in text and "caller's rights" in text and "HTTP API" in text
        assert text in res.stderr
    res = CliRunner().invoke(main, ["acl", "--pool", "lab", "--role", "scheduler", "--json"])
    assert json.loads(res.stdout)[0]["does_not_prevent"] is None and res.stderr == ""


def _running_on_a(f: Fleet, ha: HostClient, what: str) -> tuple[str, str]:
    """A task running on hA's device dA (claimed in hA's session): its id and lease."""
    tid = f.client.submit(what, driver_type="android")
    assert f.store.commit([(tid, "dA")])[0].startswith("ok:")
    (a,) = ha.claim(1)
    assert a.task.id == tid
    return tid, a.lease_id


def test_a_host_users_forged_report_of_another_hosts_task_is_reported(
    real_fleet: Fleet, acl_users: AclUsers, redis_url: str
) -> None:
    """hB's own ACL user (bound to hB) makes hA's running task its own: host_id and session
    in the task, host_id in its attempt record (LSET), host_held moved from hA to hB so the
    counts agree; then hB reports it done with its own token, and the report is accepted.
    verify reports the rewritten attempt record (its device belongs to hA) and the done
    event of a lease assigned to hA naming hB."""
    f = real_fleet
    ha = f.add_host("hA", ("dA", "android", ()))
    f.add_host("hB", ("dB", "ios", ())).start_session("sessB")
    ha.start_session("sessA")
    tid, lease = _running_on_a(f, ha, "hA's job")
    assert verify(f.r, f.pool).ok
    hb_r = redis.Redis.from_url(acl_users.url("host", "hB"), decode_responses=True)
    keys = f.admin.keys
    hb_r.hset(keys.task(tid), mapping={"host_id": "hB", "session": "sessB"})
    rec = json.loads(hb_r.lindex(keys.attempts(tid), -1))  # type: ignore[arg-type]
    hb_r.lset(keys.attempts(tid), -1, json.dumps({**rec, "host_id": "hB"}))
    hb_r.hincrby(keys.host_held, "hA", -1)
    hb_r.hincrby(keys.host_held, "hB", 1)
    hb = HostClient(hb_r, f.pool, "hB", f.tokens["hB"], session="sessB")
    assert hb.report(tid, lease, "done", payload="forged") == "ok:done"
    hb_r.close()

    lab = Lab(f.r, redis_url, f.pool, keys, {})
    both = frozenset({"attempt_host_mismatch", "report_host_mismatch"})
    lab.expect("attempt_host_mismatch", also=both, task=tid, host="hB", device="dA")
    lab.expect("report_host_mismatch", also=both, task=tid, host="hB")


FINISH_BY_HAND = """
--- @include "lib/tasks"
--- @include "lib/leases"
--- @include "lib/outcomes"
-- end task ARGV[1] as done with result ARGV[2], as report.lua would, with no host token:
-- lease dropped (host_held and tenant_held counted down), device idle again, the attempt
-- closed by hand, the status moved to done, a done event
local id = ARGV[1]
local t = load_task(id)
local old = t.status
drop_lease(id, t)
release_device(t.device_id, id, nil)
local ak = k('task', id, 'attempts')
local rec = cjson.decode(redis.call('LINDEX', ak, -1))
rec.outcome = 'done'
rec.ended_at = now_ms()
redis.call('LSET', ak, -1, cjson.encode(rec))
finish(id, t, old, 'done', '', ARGV[2])
return old
"""


def test_a_producer_users_one_eval_that_finishes_a_running_task_is_reported(
    real_fleet: Fleet, acl_users: AclUsers, redis_url: str
) -> None:
    """The producer's ACL user ends hA's running task with one EVAL and no host token
    (deviceq's own Lua helpers: the status moved to done, the attempt closed, the lease
    dropped, the device idle again, host_held counted down, a done event): every index and
    counter agrees, but no transition script closed the attempt, so its end is not in the
    device's history, and verify reports it."""
    from deviceq.core.scripts import assemble

    f = real_fleet
    ha = f.add_host("hA", ("dA", "android", ()))
    ha.start_session("sessA")
    first, lease = _running_on_a(f, ha, "a real one")
    assert ha.report(first, lease, "done", payload="real") == "ok:done"
    tid, _ = _running_on_a(f, ha, "hA's job")
    assert verify(f.r, f.pool).ok

    prod_r = redis.Redis.from_url(acl_users.url("producer"), decode_responses=True)
    script = assemble(FINISH_BY_HAND.lstrip())
    assert prod_r.eval(script, 1, f.admin.keys.prefix, tid, "forged") == "dispatched"
    prod_r.close()
    assert f.client.get(tid).status.value == "done"
    assert f.admin.device("dA").reserved_by in ("", None)

    lab = Lab(f.r, redis_url, f.pool, f.admin.keys, {})
    lab.expect("attempt_end_unrecorded", task=tid, device="dA")
    # the real report of the first task is in the history: only the forged end is reported
    res = verify(f.r, f.pool)
    assert [v.task for v in res.violations] == [tid]


def test_the_device_history_bound_mirrors_the_lua_one() -> None:
    from deviceq.core.scripts import lua_dir
    from deviceq.ops.verify.model import DEVICE_RECENT

    text = (lua_dir() / "lib" / "history.lua").read_text()
    assert f"local DEVICE_RECENT = {DEVICE_RECENT}\n" in text


def test_verify_says_what_it_checks_and_what_it_cannot(lab: Lab) -> None:
    from deviceq.ops.verify.results import CANNOT_CHECK, CHECKS

    res = CliRunner().invoke(main, ["verify", "--scope", "--json"])  # (reads no pool)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == {"checks": list(CHECKS), "cannot_check": list(CANNOT_CHECK)}
    text = CliRunner().invoke(main, ["verify", "--scope"]).stdout
    assert all(line in text for line in (*CHECKS, *CANNOT_CHECK))
    assert "direct Redis access" in text and "HTTP API" in text
    # every run says where its verdict stops (stderr: stdout keeps its one summary line)
    out = lab.cli()
    assert out.exit_code == 0 and "deviceq verify --scope" in out.stderr


def test_preemptible_holding_a_task_that_is_not_running(lab: Lab) -> None:
    lab.r.zadd(lab.keys.preemptible, {lab.ids["running"]: 1})  # running: as it should be
    assert verify(lab.r, lab.pool).ok
    lab.r.zadd(lab.keys.preemptible, {lab.ids["done"]: 2})
    lab.expect("preemptible_not_running", task=lab.ids["done"], key="preemptible")


def test_a_device_held_for_an_urgent_task_reserved_by_a_third_task(lab: Lab) -> None:
    run, uid = lab.task("running"), lab.ids["waiting"]
    did = run["device_id"]
    # the running task was preempted for the waiting one: the device is held, still reserved
    # by the preempted run until it stops (consistent)
    lab.r.hset(
        lab.keys.task(uid), mapping={"preempting": did, "preempting_task": lab.ids["running"]}
    )
    lab.r.hset(lab.keys.device(did), "preempt_for", uid)
    assert verify(lab.r, lab.pool).ok
    # the hold names another preempted run: the device's holder is a third task
    lab.r.hset(lab.keys.task(uid), "preempting_task", lab.ids["done"])
    lab.expect("preempt_hold_given_away", task=uid, device=did)
