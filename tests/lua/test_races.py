"""Races with real threads and real processes (multiprocessing, spawn start method, each with
its own Redis connection) against the real private redis-server:

- 32 concurrent claimers on the same assignments: exactly one winner per assignment;
- concurrent assign commits of overlapping pairs from several processes: no device is ever
  double booked (checked on the event stream and on the final state);
- report vs. expire on the same lease, repeated with a tiny lease ttl: one outcome wins, the
  other is rejected cleanly.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import threading
import time
from collections import Counter, defaultdict
from typing import Any

import pytest

from deviceq import Client, HostClient, Report, SchedulerClient, TaskStatus

SPAWN = mp.get_context("spawn")
TERMINAL_EVENTS = {"done", "failed", "cancelled", "released", "expired"}


# -- process bodies (module level: spawn imports this module in the child) ----------------------


def _claimer(
    url: str, pool: str, host: str, token: str, threads: int, start: Any, out: Any
) -> None:
    """``threads`` claimers in this process, each with its own connection."""
    got: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()

    def one() -> None:
        h = HostClient(url, pool, host, token)
        mine: list[str] = []
        try:
            start.wait(60)
            empty = 0
            while empty < 3:
                batch = h.claim(1)
                if batch:
                    mine += [a.task.id for a in batch]
                    empty = 0
                else:
                    empty += 1
        except BaseException as exc:  # reported to the parent
            errors.append(repr(exc))
        finally:
            h.close()
            with lock:
                got.extend(mine)

    workers = [threading.Thread(target=one) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    out.put(("error", errors) if errors else ("ok", got))


def _committer(
    url: str,
    pool: str,
    tasks: list[str],
    devices: list[str],
    seed: int,
    rounds: int,
    start: Any,
    out: Any,
) -> None:
    admin = SchedulerClient(url, pool)
    rng = random.Random(seed)
    oks: list[tuple[str, str, str]] = []
    try:
        start.wait(60)
        for _ in range(rounds):
            pairs = [(rng.choice(tasks), rng.choice(devices)) for _ in range(8)]
            for (t, d), res in zip(pairs, admin.commit(pairs), strict=True):
                if res.startswith("ok:"):
                    oks.append((t, d, res[3:]))
                else:
                    assert res.startswith("err:"), res
        out.put(("ok", oks))
    except BaseException as exc:
        out.put(("error", repr(exc)))
    finally:
        admin.close()


def _finisher(
    url: str, pool: str, host: str, token: str, seconds: float, start: Any, out: Any
) -> None:
    """Claims what is assigned to its host and ends it at once (done / failed / released), so
    devices are freed and committed again while the committers race."""
    h = HostClient(url, pool, host, token)
    rng = random.Random(7)
    n = 0
    try:
        start.wait(60)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for a in h.claim(4):
                outcome = rng.choice(["done", "failed", "released"])
                kind = "rejected" if outcome == "failed" else None
                res = h.report(a.task.id, a.lease_id, outcome, kind, "x")
                assert res.startswith("ok:"), res
                n += 1
        out.put(("ok", n))
    except BaseException as exc:
        out.put(("error", repr(exc)))
    finally:
        h.close()


def _reporter(
    url: str, pool: str, host: str, token: str, n: int, barrier: Any, jobs: Any, out: Any
) -> None:
    h = HostClient(url, pool, host, token)
    rng = random.Random(11)
    try:
        for _ in range(n):
            task_id, lease = jobs.get(timeout=60)
            barrier.wait(60)
            time.sleep(rng.uniform(0.96, 1.04))  # around the 1 s lease's expiry
            out.put(("report", task_id, h.report(task_id, lease, "done", None, "r")))
            barrier.wait(60)
    except BaseException as exc:
        out.put(("error", repr(exc), ""))
    finally:
        h.close()


def _expirer(url: str, pool: str, n: int, barrier: Any, out: Any) -> None:
    admin = SchedulerClient(url, pool)
    rng = random.Random(13)
    try:
        for _ in range(n):
            barrier.wait(60)
            time.sleep(rng.uniform(0.96, 1.04))  # around the 1 s lease's expiry
            out.put(("expire", "", str(admin.expire())))
            barrier.wait(60)
    except BaseException as exc:
        out.put(("error", repr(exc), ""))
    finally:
        admin.close()


def _collect(procs: list[Any], out: Any, n: int, timeout: float = 90) -> list[Any]:
    results = []
    try:
        for _ in range(n):
            kind, payload = out.get(timeout=timeout)
            assert kind == "ok", payload
            results.append(payload)
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
    return results


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture
def url(redis_server: Any) -> str:
    return str(redis_server.url)


def _assigned(real_fleet: Any, n: int, host: str = "h1") -> list[str]:
    real_fleet.add_host(host, *[(f"d{i}", "android", ()) for i in range(n)])
    ids = real_fleet.client.submit_many([{"goal": f"g{i}"} for i in range(n)])
    res = real_fleet.store.commit([(t, f"d{i}") for i, t in enumerate(ids)])
    assert all(r.startswith("ok:") for r in res)
    return ids


def _check_claimed_once(real_fleet: Any, ids: list[str], winners: list[str]) -> None:
    counts = Counter(winners)
    assert set(counts) == set(ids), "every assignment was claimed"
    assert max(counts.values()) == 1, [t for t, c in counts.items() if c > 1]
    for t in (real_fleet.client.get(i) for i in ids):
        assert t.status is TaskStatus.dispatched
        assert len(t.attempts) == 1 and t.attempts[0].dispatched_at
    ev = Counter(e.task for e in real_fleet.client.events() if e.type == "dispatched")
    assert ev == Counter(ids), "one dispatched event per assignment"


# -- claims --------------------------------------------------------------------------------------


def test_32_thread_claimers_exactly_one_winner(real_fleet: Any, url: str) -> None:
    ids = _assigned(real_fleet, 200)
    token = real_fleet.tokens["h1"]
    barrier = threading.Barrier(32)
    got: list[list[str]] = [[] for _ in range(32)]
    errors: list[BaseException] = []

    def claimer(i: int) -> None:
        h = HostClient(url, real_fleet.pool, "h1", token)  # its own connection
        try:
            barrier.wait(30)
            while batch := h.claim(1 + i % 3):
                got[i] += [a.task.id for a in batch]
        except BaseException as exc:
            errors.append(exc)
        finally:
            h.close()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert sum(1 for g in got if g) > 1, "the claimers really competed"
    _check_claimed_once(real_fleet, ids, [t for g in got for t in g])


@pytest.mark.slow
def test_32_process_claimers_exactly_one_winner(real_fleet: Any, url: str) -> None:
    """32 claimers: 8 spawned processes of 4 threads, each claimer on its own connection."""
    ids = _assigned(real_fleet, 300)
    start, out = SPAWN.Barrier(33), SPAWN.Queue()  # all 32 claimers start together
    procs = [
        SPAWN.Process(
            target=_claimer,
            args=(url, real_fleet.pool, "h1", real_fleet.tokens["h1"], 4, start, out),
        )
        for _ in range(8)
    ]
    for p in procs:
        p.start()
    start.wait(120)
    results = _collect(procs, out, len(procs))
    assert sum(1 for g in results if g) > 1, "the processes really competed"
    _check_claimed_once(real_fleet, ids, [t for g in results for t in g])


# -- assign commits ------------------------------------------------------------------------------


def _check_never_double_booked(real_fleet: Any) -> None:
    """Replay the event stream per device: an assignment is only ever made to a free device."""
    holder: dict[str, str | None] = defaultdict(lambda: None)
    lease_device: dict[str, str] = {}
    n_assigned = 0
    for e in real_fleet.client.events():
        f = e.fields
        if e.type == "assigned":
            n_assigned += 1
            assert holder[f["device"]] is None, f"{f['device']} double booked: {e}"
            holder[f["device"]] = f["lease"]
            lease_device[f["lease"]] = f["device"]
        elif e.type in TERMINAL_EVENTS and f.get("lease") in lease_device:
            d = lease_device[f["lease"]]
            if holder[d] == f["lease"]:
                holder[d] = None
    assert n_assigned > 0
    # the final state agrees with the replay
    for d in real_fleet.admin.devices():
        lease = real_fleet.r.hget(real_fleet.admin.keys.device(d.device_id), "lease_id") or None
        assert lease == holder[d.device_id], d.device_id
        if d.reserved_by:
            t = real_fleet.client.get(d.reserved_by)
            assert t.status in (TaskStatus.assigned, TaskStatus.dispatched)
            assert (t.device_id, t.lease_id) == (d.device_id, lease)
    reserved = [d.reserved_by for d in real_fleet.admin.devices() if d.reserved_by]
    assert len(reserved) == len(set(reserved)), "a task holds at most one device"


@pytest.mark.slow
def test_concurrent_overlapping_commits_never_double_book(real_fleet: Any, url: str) -> None:
    devices = [f"d{i}" for i in range(12)]
    real_fleet.add_host("h1", *[(d, "android", ()) for d in devices])
    tasks = real_fleet.client.submit_many([{"goal": f"g{i}"} for i in range(40)])
    start, out = SPAWN.Barrier(7), SPAWN.Queue()
    procs = [
        SPAWN.Process(
            target=_committer, args=(url, real_fleet.pool, tasks, devices, seed, 150, start, out)
        )
        for seed in range(5)
    ]
    procs.append(
        SPAWN.Process(
            target=_finisher,
            args=(url, real_fleet.pool, "h1", real_fleet.tokens["h1"], 4.0, start, out),
        )
    )
    for p in procs:
        p.start()
    start.wait(120)
    results = _collect(procs, out, len(procs))
    oks = [ok for r in results if isinstance(r, list) for ok in r]
    finished = sum(r for r in results if isinstance(r, int))
    assert oks and finished, "commits and completions really interleaved"
    leases = [lease for _, _, lease in oks]
    assert len(leases) == len(set(leases)), "each lease committed once"
    assigned_events = [e for e in real_fleet.client.events() if e.type == "assigned"]
    assert sorted(e.fields["lease"] for e in assigned_events) == sorted(leases)
    _check_never_double_booked(real_fleet)


def test_thread_commits_of_the_same_pairs(real_fleet: Any, url: str) -> None:
    devices = [f"d{i}" for i in range(8)]
    real_fleet.add_host("h1", *[(d, "android", ()) for d in devices])
    tasks = real_fleet.client.submit_many([{"goal": f"g{i}"} for i in range(16)])
    barrier = threading.Barrier(8)
    oks: list[tuple[str, str]] = []
    lock = threading.Lock()

    def committer(seed: int) -> None:
        admin = SchedulerClient(url, real_fleet.pool)
        rng = random.Random(seed)
        pairs = [(t, d) for t in tasks for d in devices]
        rng.shuffle(pairs)
        barrier.wait(30)
        for i in range(0, len(pairs), 16):
            chunk = pairs[i : i + 16]
            for p, res in zip(chunk, admin.commit(chunk), strict=True):
                if res.startswith("ok:"):
                    with lock:
                        oks.append(p)
        admin.close()

    threads = [threading.Thread(target=committer, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(oks) == len(devices), "each device booked exactly once"
    assert len({d for _, d in oks}) == len(devices) and len({t for t, _ in oks}) == len(devices)
    _check_never_double_booked(real_fleet)


# -- report vs. expire ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("max_attempts", [1, 3])
def test_report_vs_expire_one_outcome_wins(real_fleet: Any, url: str, max_attempts: int) -> None:
    rounds = 14
    h = real_fleet.add_host("h1", ("d1", "android", ()))
    real_fleet.admin.set_config("lease_ttl", 1)
    barrier, jobs, out = SPAWN.Barrier(3), SPAWN.Queue(), SPAWN.Queue()
    procs = [
        SPAWN.Process(
            target=_reporter,
            args=(url, real_fleet.pool, "h1", real_fleet.tokens["h1"], rounds, barrier, jobs, out),
        ),
        SPAWN.Process(target=_expirer, args=(url, real_fleet.pool, rounds, barrier, out)),
    ]
    for p in procs:
        p.start()
    wins: Counter[str] = Counter()
    try:
        for _ in range(rounds):
            tid = real_fleet.client.submit("g", max_attempts=max_attempts)
            real_fleet.beat()  # after an expiry the device is suspect until a heartbeat
            assert real_fleet.store.commit([(tid, "d1")])[0].startswith("ok:")
            (a,) = h.claim(1)
            jobs.put((tid, a.lease_id))
            barrier.wait(60)  # both racers go
            barrier.wait(60)  # both done
            got = {}
            for _ in range(2):
                kind, _, res = out.get(timeout=30)
                assert kind != "error", res
                got[kind] = res
            report = got["report"]
            t = real_fleet.client.get(tid)
            if report == "ok:done":
                wins["report"] += 1
                assert t.status is TaskStatus.done and t.result == "r"
                assert [x.outcome for x in t.attempts] == ["done"]
            else:
                wins["expire"] += 1
                assert report.startswith("rejected:"), report
                assert [x.outcome for x in t.attempts] == ["expired"]
                if max_attempts == 1:
                    assert (t.status, t.failure_kind.value) == (TaskStatus.failed, "lease_expired")
                else:
                    assert t.status is TaskStatus.queued
                    assert real_fleet.client.cancel(tid) == "cancelled"
            assert real_fleet.admin.device("d1").reserved_by is None
            assert real_fleet.r.zscore(real_fleet.admin.keys.leases, tid) is None
            ends = [
                e.type
                for e in real_fleet.client.events(task=tid)
                if e.type in ("done", "failed", "expired")
            ]
            assert ends in (["done"], ["expired", "failed"], ["expired"]), ends
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                p.join(5)
    assert wins["report"] and wins["expire"], f"both outcomes were exercised: {wins}"


def test_report_vs_expire_threads(real_fleet: Any, url: str) -> None:
    """The same race with threads, many rounds, several leases at once."""
    h = real_fleet.add_host("h1", *[(f"d{i}", "android", ()) for i in range(4)])
    real_fleet.admin.set_config("lease_ttl", 1)
    reporter = HostClient(url, real_fleet.pool, "h1", real_fleet.tokens["h1"])
    expirer = SchedulerClient(url, real_fleet.pool)
    client = Client(url, real_fleet.pool)
    outcomes: Counter[str] = Counter()
    try:
        for _ in range(10):
            ids = real_fleet.client.submit_many([{"goal": "g", "max_attempts": 1}] * 4)
            real_fleet.beat()
            real_fleet.store.commit([(t, f"d{i}") for i, t in enumerate(ids)])
            claimed = h.claim(4)
            assert len(claimed) == 4
            res: dict[str, Any] = {}
            delay = random.uniform(0.96, 1.04)

            def do_report(
                claimed: list[Any] = claimed, res: dict[str, Any] = res, delay: float = delay
            ) -> None:
                time.sleep(delay)
                res["report"] = reporter.report_many(
                    [Report(a.task.id, a.lease_id, "done") for a in claimed]
                )

            def do_expire(res: dict[str, Any] = res) -> None:
                time.sleep(1.0)
                res["expire"] = expirer.expire()

            threads = [threading.Thread(target=do_report), threading.Thread(target=do_expire)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(10)
            for a, r in zip(claimed, res["report"], strict=True):
                t = client.get(a.task.id)
                if r == "ok:done":
                    assert t.status is TaskStatus.done
                else:
                    assert r.startswith("rejected:") and t.status is TaskStatus.failed
                outcomes[t.status.value] += 1
            assert res["expire"]["failed"] == sum(1 for r in res["report"] if r != "ok:done")
            assert all(d.reserved_by is None for d in real_fleet.admin.devices())
    finally:
        reporter.close()
        expirer.close()
        client.close()
    assert sum(outcomes.values()) == 40
