"""Work split by time, not count: ``expire.lua`` stops between items once its time budget
(``budget_us``, `lib/budget.lua`) is spent and says ``more``, ``claim.lua`` likewise (and
says ``more``: `HostClient.claim` claims again), ``assign.lua`` likewise (the pairs past it
answer ``later``: the scheduler's commit sends them again); ``report_many`` and the
scheduler's commit size their calls with `deviceq.core.pacing.Pacer`; ``submit_many`` (all or
nothing per call) sizes them before sending, by the tasks' declared cost
(`deviceq.producer.submission.submit_chunks`). A tiny budget (1 us), a tiny pacer target or a
small ``chunk`` forces the split; the end state must be the one of an unsplit
run: every item handled once, nothing lost, idempotency kept. No timing is asserted."""

from __future__ import annotations

import json
import math
import time
from typing import Any

import pytest
import redis

from deviceq import Client, Report, TaskScheduler
from deviceq.core.errors import InvalidInput
from deviceq.core.keys import Keys
from deviceq.core.pacing import Pacer, pacer_for
from deviceq.core.script_args import ASSIGN
from deviceq.host.claims import assignments, claimed_all
from deviceq.ops.verify import verify
from deviceq.scheduler.client import SchedulerClient
from invariants import check_pool

TINY_MS = 0.001  # 1 us: each step of an expiry call does its first item only


def script_calls(r: redis.Redis) -> int:
    """EVALSHA calls the server has run so far."""
    return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def starve(owner: object, name: str, least: int = 1) -> Pacer:
    """The owner's pacer for ``name`` with a target no call can meet: every chunk is
    ``least`` items (or the caller's most)."""
    p = pacer_for(owner, name, 1)
    p.target_ms = 1e-9
    p.least = p.size = least
    return p


def lapsed_leases(fleet: Any, n: int, max_attempts: int | None = None) -> list[str]:
    """``n`` tasks assigned on ``n`` devices whose claim leases have lapsed."""
    fleet.admin.set_config("claim_ttl", 1)
    fleet.add_host("h1", *[(f"d{i:03d}", "x", ()) for i in range(n)])
    ids = fleet.client.submit_many(
        [{"goal": f"g{i}", "max_attempts": max_attempts} for i in range(n)]
    )
    sched = TaskScheduler(fleet.admin, batch=n)
    assigned = 0
    while assigned < n:
        got = sched.assign(expire=False).assigned
        assert got, "every task finds a device"
        assigned += got
    fleet.admin.set_config("claim_ttl", 3600)
    time.sleep(1.1)  # every claim lease (1 s) has lapsed
    return list(ids)


def test_expire_many_leases_across_budgeted_calls_ends_each_once(real_fleet: Any) -> None:
    fleet = real_fleet
    ids = lapsed_leases(fleet, 40)
    store: SchedulerClient = fleet.store
    first = store.expire(1000, TINY_MS)
    assert first["requeued"] == 1 and first["more"] == 1  # the budget stopped it after one
    ended, calls = first["requeued"] + first["failed"], 1
    while True:
        got = store.expire(1000, TINY_MS)
        calls += 1
        ended += got["requeued"] + got["failed"] + got["cancelled"]
        if not got["more"]:
            break
        assert calls < 200, "bounded"
    assert ended == 40 and calls >= 40
    keys = Keys(fleet.pool)
    assert fleet.r.zcard(keys.leases) == 0
    expired_events: dict[str, int] = {}
    for _, e in fleet.r.xrange(keys.events):
        if e["type"] == "expired":
            expired_events[e["task"]] = expired_events.get(e["task"], 0) + 1
    assert expired_events == dict.fromkeys(ids, 1)
    for tid in ids:
        t = fleet.client.get(tid)
        assert t.status.value == "queued" and t.attempt == 1
        records = [json.loads(a) for a in fleet.r.lrange(keys.attempts(tid), 0, -1)]
        assert [a["outcome"] for a in records] == ["expired"], records  # ended once, kept
    assert fleet.r.zcard(keys.status("queued")) == 40


def test_scheduler_expiry_with_a_tiny_budget_goes_on_in_later_passes(real_fleet: Any) -> None:
    fleet = real_fleet
    ids = lapsed_leases(fleet, 12, max_attempts=1)
    sched = TaskScheduler(fleet.admin, expire_rounds=3, expire_budget_ms=TINY_MS)
    res = sched.assign()
    assert res.expired["failed"] == 3 and res.expired["more"] == 1 and res.more
    total, passes = 3, 1
    while res.more:
        res = sched.assign()
        total += res.expired["failed"]
        passes += 1
        assert passes < 50
    assert total == 12
    assert all(fleet.client.get(t).failure_kind == "lease_expired" for t in ids)


def fill_terminal(r: redis.Redis, keys: Keys, old: int, recent: int) -> None:
    """``old`` entries far past retention and ``recent`` within it in each terminal index,
    and old events (explicit ids from the distant past) in the event stream."""
    now = int(time.time() * 1000)
    pipe = r.pipeline(transaction=False)
    for st in ("done", "failed", "cancelled"):
        pipe.zadd(keys.status(st), {f"{st}-old{i}": 1000 + i for i in range(old)})
        pipe.zadd(keys.status(st), {f"{st}-new{i}": now + i for i in range(recent)})
    for i in range(1, 1001):
        pipe.xadd(keys.events, {"type": "x"}, id=f"{i}-0")
    pipe.xadd(keys.events, {"type": "x"}, id=f"{now + 60_000}-0")
    pipe.execute()


def terminal_state(r: redis.Redis, keys: Keys) -> tuple[list[list[str]], int]:
    return [r.zrange(keys.status(s), 0, -1) for s in ("done", "failed", "cancelled")], r.xlen(
        keys.events
    )


def test_budgeted_retention_trim_reaches_the_same_end_state(real_r: redis.Redis) -> None:
    whole, split = (f"trim{time.time_ns()}{x}" for x in "ab")
    for p in (whole, split):
        fill_terminal(real_r, Keys(p), old=950, recent=7)
    out = SchedulerClient(real_r, whole).expire(1000)  # unbudgeted: all of it in one call
    assert out["trimmed"] == 3 * 950 and out["more"] == 0
    store = SchedulerClient(real_r, split)
    first = store.expire(1000, TINY_MS)
    # its budget spent at once: a page of 100 entries of the first terminal index, then 10 of
    # each other (once the budget cut a step)
    assert first["trimmed"] == 120 and first["more"] == 1
    trimmed, calls = first["trimmed"], 1
    while True:
        got = store.expire(1000, TINY_MS)
        trimmed, calls = trimmed + got["trimmed"], calls + 1
        if not got["more"]:
            break
        assert calls < 200
    assert trimmed == 3 * 950 and calls == 25
    a, b = terminal_state(real_r, Keys(whole)), terminal_state(real_r, Keys(split))
    assert a == b
    assert a[0][0] == [f"done-new{i}" for i in range(7)]
    assert a[1] < 1001  # the old events went too (whole stream nodes)


def test_expire_refuses_a_bad_budget(real_r: redis.Redis) -> None:
    from deviceq.core.errors import InvalidInput

    store = SchedulerClient(real_r, f"bad{time.time_ns()}")
    for bad in ("0", "-1", "x", "10000001", "1.5"):
        with pytest.raises(InvalidInput):
            store._run("expire", ["10", bad])
    assert store._run("expire", ["10", ""])[4] == 0  # '' is no budget


def test_submit_many_in_chunks_stores_exactly_n_keeping_idempotency(
    real_r: redis.Redis, pool: str
) -> None:
    client = Client(real_r, pool)
    earlier = client.submit("before", idempotency_key="k-early")
    specs: list[dict[str, Any]] = [{"goal": f"g{i}"} for i in range(100)]
    specs[3]["idempotency_key"] = "k-dup"
    specs[90]["idempotency_key"] = "k-dup"  # a later chunk: the key is stored by then
    specs[4]["idempotency_key"] = "k-early"
    specs[5]["idempotency_key"] = "k5"
    specs[6]["idempotency_key"] = "k5"  # the same chunk
    c0 = script_calls(real_r)
    ids = client.submit_many(specs, chunk=8)
    calls = script_calls(real_r) - c0
    assert calls == 13  # 100 tasks in chunks of 8
    assert len(ids) == 100
    assert ids[90] == ids[3] and ids[4] == earlier and ids[6] == ids[5]
    assert len(set(ids)) == 1 + 97  # 'before' and 97 new ones
    keys = Keys(pool)
    assert real_r.zcard(keys.status("queued")) == 1 + 97
    assert [client.get(t, attempts=False).goal for t in ids[7:12]] == [
        f"g{i}" for i in range(7, 12)
    ]


def test_submit_chunks_hold_the_declared_cost_per_call() -> None:
    from deviceq.core.bounds import SUBMIT_CALL_US, SUBMIT_MOST_TASKS
    from deviceq.producer.submission import spec_from, submit_chunks, task_cost_us, task_items

    def sizes(shape: dict[str, Any], n: int, most: int = SUBMIT_MOST_TASKS) -> list[int]:
        items = task_items([spec_from(shape)] * n)
        chunks = submit_chunks(items, most)
        assert [a for a, _ in chunks] == [0] + [b for _, b in chunks[:-1]]  # consecutive
        assert chunks[-1][1] == n
        for a, b in chunks:
            assert b - a == 1 or sum(task_cost_us(t) for t in items[a:b]) <= SUBMIT_CALL_US
        return [b - a for a, b in chunks]

    plain = sizes({"goal": "g"}, 1000)
    assert max(plain) <= SUBMIT_MOST_TASKS and len(plain) == 1000 // max(plain) + 1
    assert max(sizes({"goal": "x" * 16384}, 20)) == 4  # 16 KiB goals: 4 a call
    assert max(sizes({"goal": "é" * 8192}, 20)) == 4  # (bytes, not characters)
    assert max(sizes({"goal": "x" * 8192}, 20)) == 9
    assert set(sizes({"goal": "t", "tests": [f"t{i:05d}" for i in range(8000)]}, 3)) == {1}
    assert set(sizes({"goal": "g"}, 100, most=7)[:-1]) == {7}  # the caller's most
    assert sizes({"goal": "g"}, 1) == [1]


def test_submit_many_sends_big_tasks_in_smaller_calls(real_r: redis.Redis, pool: str) -> None:
    client = Client(real_r, pool)
    c0 = script_calls(real_r)
    ids = client.submit_many([{"goal": f"{i} " + "x" * 16382} for i in range(10)])
    # 16 KiB goals: 4 a call at most (the first call carries half the budget: 2)
    assert 4 <= script_calls(real_r) - c0 <= 10
    assert len(set(ids)) == 10
    assert client.get(ids[9], attempts=False).goal.startswith("9 ")


def test_submit_many_sends_fewer_tasks_a_call_after_slow_calls(
    real_r: redis.Redis, pool: str
) -> None:
    from deviceq.core.bounds import SUBMIT_CALL_US
    from deviceq.producer.submission import spec_from, submit_pacer, task_cost_us, task_items

    client = Client(real_r, pool)
    assert submit_pacer(client).size == SUBMIT_CALL_US // 2  # the first call: half the budget
    one = task_cost_us(task_items([spec_from({"goal": "g00"})])[0])
    starve(client, "submit", least=math.ceil(3 * one))  # as if every call had been slow
    c0 = script_calls(real_r)
    ids = client.submit_many([{"goal": f"g{i:02d}"} for i in range(30)])
    assert script_calls(real_r) - c0 == 10  # 3 tasks' declared cost a call
    assert len(set(ids)) == 30 and client.counts()["queued"] == 30


def test_report_many_and_commit_in_paced_chunks_answer_each_once(real_fleet: Any) -> None:
    fleet = real_fleet
    h = fleet.add_host("h1", *[(f"d{i:02d}", "x", ()) for i in range(30)])
    ids = fleet.client.submit_many([{"goal": f"g{i}"} for i in range(30)])
    starve(fleet.store, "assign")
    pairs = [(t, f"d{i:02d}") for i, t in enumerate(ids)] + [(ids[0], "d29")]
    c0 = script_calls(fleet.r)
    out = fleet.store.commit(pairs)
    assert script_calls(fleet.r) - c0 == len(pairs)  # a pair a call
    assert all(o.startswith("ok:") for o in out[:30]) and out[30] == "err:task_not_queued"
    got = h.claim(100)
    assert len(got) == 30
    starve(h, "report")
    reports = [Report(a.task.id, a.lease_id, "done") for a in got]
    c0 = script_calls(fleet.r)
    answers = h.report_many([*reports, reports[0]])
    assert script_calls(fleet.r) - c0 == 31
    assert answers == ["ok:done"] * 30 + ["dup:done"]
    assert real_done(fleet) == 30


def _assigned(fleet: Any, n: int) -> tuple[Any, list[str]]:
    """A host of ``n`` devices with ``n`` assignments in its inbox."""
    h = fleet.add_host("h1", *[(f"d{i:02d}", "x", ()) for i in range(n)])
    ids = fleet.client.submit_many([{"goal": f"g{i}"} for i in range(n)])
    pairs = [(t, f"d{i:02d}") for i, t in enumerate(ids)]
    assert all(o.startswith("ok:") for o in fleet.store.commit(pairs))
    return h, list(ids)


def test_claim_stops_once_its_budget_is_spent_and_says_more(real_fleet: Any) -> None:
    fleet = real_fleet
    h, ids = _assigned(fleet, 20)
    claimed: list[str] = []
    replies = []
    while True:  # a 1 us budget: 8 entries a call (it is checked every 8), the rest left
        rows = h._run("claim", [*h._auth(), "1000", "1"])
        got = assignments(rows)
        replies.append((len(got), claimed_all(rows)))
        if not got:
            break
        claimed += [a.task.id for a in got]
    assert replies == [(8, False), (8, False), (4, True), (0, True)]
    assert sorted(claimed) == sorted(ids)  # each once
    assert {fleet.client.get(t).status.value for t in ids} == {"dispatched"}
    with pytest.raises(InvalidInput, match="budget_us"):
        h._run("claim", [*h._auth(), "10", "0"])


def test_a_host_claim_takes_all_it_asks_for_across_budgeted_calls(
    real_fleet: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = real_fleet
    h, ids = _assigned(fleet, 20)
    tiny = h._claim_args
    monkeypatch.setattr(h, "_claim_args", lambda n: [*tiny(n), "1"])  # a 1 us budget
    c0 = script_calls(fleet.r)
    got = h.claim(9)
    assert len(got) == 9 and script_calls(fleet.r) - c0 == 2  # 8 (more), then 1
    c0 = script_calls(fleet.r)
    rest = h.wait_and_claim(0.05, 100)  # the same after the one-round-trip wait
    assert len(rest) == 11 and script_calls(fleet.r) - c0 == 2  # 8 (more), then 3
    assert sorted(a.task.id for a in got + rest) == sorted(ids)


def test_assign_stops_once_its_budget_is_spent_and_answers_later(real_fleet: Any) -> None:
    fleet = real_fleet
    fleet.add_host("h1", *[(f"d{i:02d}", "x", ()) for i in range(10)])
    ids = fleet.client.submit_many([{"goal": f"g{i}"} for i in range(10)])
    pairs = ASSIGN.pack({"task_id": t, "device_id": f"d{i:02d}"} for i, t in enumerate(ids))
    args = ["", "10", pairs]
    # a 1 us budget: 4 pairs (it is checked every 4), the rest not looked at
    out = fleet.store._run("assign", [*args, "1"])
    assert [o[:3] for o in out[:4]] == ["ok:"] * 4 and out[4:] == ["later"] * 6
    assert {fleet.client.get(t).status.value for t in ids[4:]} == {"queued"}
    assert {fleet.admin.device(f"d{i:02d}").reserved_by for i in range(4, 10)} == {None}
    sound(fleet)
    with pytest.raises(InvalidInput, match="budget_us"):
        fleet.store._run("assign", [*args, "0"])
    with pytest.raises(InvalidInput, match="argument count"):
        fleet.store._run("assign", [*args, "1", "1"])


def test_a_commit_sends_again_the_pairs_past_a_budget(
    real_fleet: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = real_fleet
    fleet.add_host("h1", *[(f"d{i:02d}", "x", ()) for i in range(10)])
    ids = fleet.client.submit_many([{"goal": f"g{i}"} for i in range(10)])
    monkeypatch.setattr("deviceq.scheduler.client.COMMIT_BUDGET_US", 1)
    p = pacer_for(fleet.store, "assign", 1)  # every chunk all that is left: only the budget splits
    p.target_ms, p.size = 1e9, 1000
    pairs = [(t, f"d{i:02d}") for i, t in enumerate(ids)] + [(ids[0], "d09")]
    c0 = script_calls(fleet.r)
    out = fleet.store.commit(pairs)
    assert script_calls(fleet.r) - c0 == 3  # 4 pairs, 4, then the last 3
    assert all(o.startswith("ok:") for o in out[:10]) and out[10] == "err:task_not_queued"
    assert {fleet.client.get(t).status.value for t in ids} == {"assigned"}
    sound(fleet)


def sound(fleet: Any) -> None:
    """The test model's invariants and `deviceq verify` hold."""
    check_pool(fleet.r, Keys(fleet.pool))
    res = verify(fleet.r, fleet.pool)
    assert res.ok, [str(v) for v in res.violations]


def real_done(fleet: Any) -> int:
    return int(fleet.r.zcard(Keys(fleet.pool).status("done")))


def test_pacer_sizes_chunks_toward_the_target() -> None:
    p = Pacer(10, target_ms=2.0, least=2)
    assert p.next_size(100, 50) == 10
    p.record(10, 0.010)  # 1 ms an item: 2 fit in 2 ms (a first call goes by its own time)
    assert p.size == 2
    p.record(2, 0.0001)  # fast: grows at most 2x a full-size call
    assert p.size == 4
    p.record(1, 0.00001)  # a short (last) chunk proves nothing bigger
    assert p.size == 4
    p.record(3, 0.00001)  # 3/4 of the size counts as full
    assert p.size == 8
    p.record(8, 0.003)  # one slow call of the last three: the median is fast
    assert p.size == 8
    p.record(8, 0.003)  # two of three slow: 0.375 ms an item, 5 in 2 ms
    assert p.size == 5
    p.record(5, 1.0)
    p.record(5, 1.0)  # very slow: never below least
    assert p.size == 2
    q = Pacer(100, target_ms=2.0)
    q.record(30, 0.0005, full=True)  # the caller says its chunk was full (its next item did
    assert q.size == 120  # not fit): it grows toward the target, at most 2x the size
    q.record(30, 0.0001, full=False)
    assert q.size == 120
    assert p.next_size(1, 50) == 1 and p.next_size(100, 1) == 1
    assert [len(c) for c in p.chunks(list(range(5)), 50)] == [2, 2, 1]
    with pytest.raises(ValueError):
        Pacer(0)
