"""The scheduler's head cache (`deviceq.scheduler.snapshot`): a bucket's heads are read again
only when its head changed, so a pass over hundreds of tenant buckets reads the few it
assigned from; the snapshot it plans on is the one a scheduler without a cache would read; a
retry that comes back to a cached bucket with its old ``seq`` is read with its anti-affinity
record. Real Redis."""

from __future__ import annotations

import time
from typing import Any

from deviceq import TaskScheduler, TaskStatus
from deviceq.scheduler.snapshot import SnapshotReader
from invariants import check_pool


def _spy_reads(sched: TaskScheduler) -> list[str]:
    """The buckets whose heads the scheduler reads from Redis (the heads script and the
    speculative reads with the base), in order."""
    reader: Any = sched.reader
    seen: list[str] = []
    head_tasks, queued = reader._head_tasks, reader._queued

    def spy_head_tasks(sig: str, flat: list[Any]) -> Any:
        seen.append(sig)
        return head_tasks(sig, flat)

    def spy_queued(sig: str, pairs: list[Any]) -> Any:
        seen.append(sig)
        return queued(sig, pairs)

    reader._head_tasks, reader._queued = spy_head_tasks, spy_queued
    return seen


def _heads(snap: Any) -> dict[str, list[str]]:
    return {b.sig: [t.task_id for t in b.heads] for b in snap.buckets}


def test_a_pass_reads_only_the_buckets_whose_head_changed(real_fleet: Any) -> None:
    f = real_fleet
    h = f.add_host("h1", *[(f"d{i}", "x", ()) for i in range(4)])
    f.admin.set_config("aging_seconds", 3600)
    for i in range(40):  # 40 tenants x 2 priorities: 80 buckets of 2 tasks
        for p in (1, 2):
            f.client.submit_many([{"goal": "g", "tenant": f"t{i}", "priority": p}] * 2)
    sched = TaskScheduler(f.admin, strategy="fair_share")
    reads = _spy_reads(sched)
    first = sched.assign()
    assert first.assigned == 4 and len(set(reads)) == 80
    for n in range(3):
        # the hosts end what they got; a new task lands in a bucket of its own
        assigned_sigs = {f.r.hget(f.admin.keys.task(t), "sig") for t, _, _ in first.assignments}
        for a in h.claim(10):
            h.report(a.task.id, a.lease_id, "done")
        new = f.client.submit("new", tenant=f"fresh{n}")
        new_sig = f.r.hget(f.admin.keys.task(new), "sig")
        # only the buckets assigned from (their heads changed) that still hold tasks, and the
        # new one, are read
        changed = {s for s in assigned_sigs | {new_sig} if f.r.zcard(f.admin.keys.queue(s))}
        del reads[:]
        first = sched.assign()
        assert first.assigned == 4
        assert set(reads) == changed, (set(reads), changed)
    # what it plans on is what a scheduler with no cache reads
    fresh = TaskScheduler(f.admin, strategy="fair_share")
    assert _heads(sched.snapshot()) == _heads(fresh.snapshot())
    check_pool(f.r, f.admin.keys)


def test_a_retry_back_in_a_cached_bucket_keeps_its_anti_affinity(real_fleet: Any) -> None:
    f = real_fleet
    h = f.add_host("h1", ("d1", "x", ()), ("d2", "x", ()))
    tid = f.client.submit("flaky", driver_type="x")
    f.client.submit("other", driver_type="y")  # a second bucket: the cache has work to do
    sched = TaskScheduler(f.admin, strategy="fifo_match")
    res = sched.assign()
    assert [(t, d) for t, d, _ in res.assignments] == [(tid, "d1")]
    (a,) = h.claim(1)
    assert sched.assign().assigned == 0  # a pass meanwhile (nothing to read speculatively)
    # an infrastructure failure is retried at once (no backoff), with d1 to avoid: the task
    # is back in its bucket with its old seq, the bucket's head score as before
    assert h.report(a.task.id, a.lease_id, "failed", "infrastructure", "usb reset") == "ok:queued"
    res = sched.assign()
    assert [(t, d) for t, d, _ in res.assignments] == [(tid, "d2")], "the retry went to d1"
    (a,) = h.claim(1)
    h.report(a.task.id, a.lease_id, "done")
    assert f.client.get(tid).status == TaskStatus.done
    check_pool(f.r, f.admin.keys)


def test_the_cache_is_bounded_and_expires(real_fleet: Any, monkeypatch: Any) -> None:
    """Entries older than HEAD_CACHE_SECONDS are read again; emptied buckets are forgotten."""
    from deviceq.scheduler import head_cache

    f = real_fleet
    f.add_host("h1", ("d1", "x", ()))
    for i in range(5):
        f.client.submit("g", tenant=f"t{i}")
    sched = TaskScheduler(f.admin, strategy="fair_share")
    reads = _spy_reads(sched)
    sched.snapshot()
    assert len(set(reads)) == 5
    del reads[:]
    sched.snapshot()
    assert reads == []  # nothing changed: all five from the cache
    monkeypatch.setattr(head_cache, "HEAD_CACHE_SECONDS", 0.0)
    sched.snapshot()
    assert len(set(reads)) == 5
    reader: SnapshotReader = sched.reader
    assert set(reader.head_cache.entries) <= set(reader.head_cache.head_seq)


def test_a_new_leadership_reads_every_bucket_afresh(real_fleet: Any) -> None:
    """Another scheduler may lead (and assign) between two leaderships of this one: taking
    the lead again drops the head cache."""
    f = real_fleet
    f.add_host("h1", ("d1", "x", ()))
    for i in range(3):
        f.client.submit("g", tenant=f"t{i}")
    a = TaskScheduler(f.admin, strategy="fair_share", owner="sched-a")
    assert a.try_lead()
    a.snapshot()
    assert len(a.reader.head_cache.entries) == 3
    a.release()
    b = TaskScheduler(f.admin, strategy="fair_share", owner="sched-b")
    assert b.try_lead()
    b.release()
    reads = _spy_reads(a)
    assert a.try_lead()  # a new epoch
    assert a.reader.head_cache.entries == {}
    a.snapshot()
    assert len(set(reads)) == 3


def test_a_cached_bucket_read_deeper_is_read_from_its_head(real_fleet: Any) -> None:
    """Cached heads [A, B]; B is cancelled (the head, A, is unchanged, so the cache stays
    valid); more devices come, the bucket must be read deeper: it is read again from its head,
    so C is not skipped (reading on from rank 2 would have given [A, B, D, E])."""
    f = real_fleet
    f.add_host("h1", ("d1", "x", ()), ("d2", "x", ()))
    a, b, c, d, e = (f.client.submit(g, driver_type="x") for g in "abcde")
    sched = TaskScheduler(f.admin, strategy="fifo_match")
    assert _heads(sched.snapshot()) == {f.r.hget(f.admin.keys.task(a), "sig"): [a, b]}
    f.client.cancel(b)
    f.add_host("h2", ("d3", "x", ()), ("d4", "x", ()))
    (got,) = _heads(sched.snapshot()).values()
    assert got == [a, c, d, e]
    res = sched.assign()
    assert sorted(t for t, _, _ in res.assignments) == sorted([a, c, d, e])
    check_pool(f.r, f.admin.keys)


def test_changing_aging_seconds_while_running_applies_at_the_next_pass(real_fleet: Any) -> None:
    """Aged copies are kept until their next level is due, by the aging in force when they
    were made: a changed ``aging_seconds`` drops them, so the next snapshot ages by the new
    setting (with 3600 s the prio-0 task stays 0; with 0.01 s it is 9 at once)."""
    f = real_fleet
    f.add_host("h1", ("d1", "x", ()))
    f.admin.set_config("aging_seconds", 3600)
    low = f.client.submit("low", driver_type="x", priority=0)
    f.client.submit("high", driver_type="x", priority=5)
    sched = TaskScheduler(f.admin, strategy="priority_match")

    def effective(task_id: str) -> int:
        snap = sched.snapshot()
        return next(
            t.effective_priority for b in snap.buckets for t in b.heads if t.task_id == task_id
        )

    assert effective(low) == 0
    f.admin.set_config("aging_seconds", 0.01)
    time.sleep(0.2)
    assert effective(low) == 9
