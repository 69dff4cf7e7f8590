"""What one scheduler pass reads, and in how many round trips: the hand-overs waiting come
with the base, the base of the pass after a wake-up comes with the wake-up, the heads of the
buckets a pass committed from are read with the next base as deep as that pass may want them,
and a commit's few pairs go in one ``assign.lua`` call however slow the calls before were."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import Fleet
from deviceq import TaskScheduler
from deviceq.core.lane import lane_of
from deviceq.core.pacing import pacer_for
from deviceq.host.link import Report
from deviceq.scheduler.client import COMMIT_FIRST, COMMIT_LEAST
from deviceq.scheduler.snapshot import SnapshotReader


def _count_calls(monkeypatch: pytest.MonkeyPatch, cls: type, name: str) -> list[int]:
    """A counter (one-item list) of the calls of ``cls.name`` from now on."""
    calls = [0]
    orig = getattr(cls, name)

    def counted(*args: Any, **kw: Any) -> Any:
        calls[0] += 1
        return orig(*args, **kw)

    monkeypatch.setattr(cls, name, counted)
    return calls


def test_a_pass_hands_over_only_while_a_hand_over_waits(
    real_fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = real_fleet
    fleet.add_host("h1", ("d1", "x", ()))
    fleet.client.submit_many([{"goal": "g"}] * 3)
    sched = TaskScheduler(fleet.admin)
    assert sched.try_lead()
    calls = _count_calls(monkeypatch, type(sched.preemptor), "hand_over")
    assert sched.assign().assigned == 1
    assert sched.assign().assigned == 0  # tasks queued, no device, no hand-over waiting
    assert sched.reader.handovers == [] and calls == [0]


def test_a_wake_up_reads_the_next_pass_base_in_its_round_trip(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = fleet.add_host("h1", ("d1", "x", ()), ("d2", "x", ()))
    ids = fleet.client.submit_many([{"goal": "g"}] * 4)
    sched = TaskScheduler(fleet.admin)
    assert sched.try_lead()
    assert sched.assign().assigned == 2  # two tasks left queued
    sched.wait_wake(0.01)  # (the heartbeat and the submit pushed the wake list)
    reads = _count_calls(monkeypatch, SnapshotReader, "_queue_base")
    (a, _) = h.claim(2)
    h.report_many([Report(a.task.id, a.lease_id, "done")])  # (a report pushes the wake list)
    assert sched.wait_wake(1.0)
    res = sched.assign(expire=False)
    assert [t for t, _, _ in res.assignments] == [ids[2]]
    # where the connection has a lane, the pass used the base read with the wake-up
    assert reads == [1]
    sched.wait_wake(0.01)  # (woken or not, the base is read with it)
    res = sched.assign()  # an expiry first: the base read with the wake-up may miss it
    assert res.assigned == 0 and reads == [3 if lane_of(fleet.r) is not None else 2]


def test_an_idle_pool_reads_nothing_with_its_wake_ups(
    real_fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = real_fleet
    fleet.add_host("h1", ("d1", "x", ()))
    sched = TaskScheduler(fleet.admin)
    assert sched.try_lead()
    assert sched.assign().assigned == 0  # nothing queued
    reads = _count_calls(monkeypatch, SnapshotReader, "_queue_base")
    sched.wait_wake(0.01)
    assert reads == [0]


def test_a_pass_reads_the_next_heads_with_its_base_as_deep_as_the_next_may_want(
    real_fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = real_fleet
    h = fleet.add_host("h1", *[(f"d{i}", "x", ()) for i in range(8)])
    fleet.client.submit_many([{"goal": "g"}] * 40)
    sched = TaskScheduler(fleet.admin)
    assert sched.assign().assigned == 8
    got = h.claim(8)
    h.report_many([Report(a.task.id, a.lease_id, "done") for a in got[:2]])
    assert sched.assign().assigned == 2  # two devices idle: two heads wanted
    got = got[2:] + h.claim(2)
    h.report_many([Report(a.task.id, a.lease_id, "done") for a in got])
    heads_read = _count_calls(monkeypatch, SnapshotReader, "_head_tasks")
    assert sched.assign().assigned == 8  # eight idle now: read with the base, as deep
    assert heads_read == [0]


def test_a_commit_of_a_few_pairs_is_one_call_however_slow_the_calls_before(
    real_fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = real_fleet
    fleet.add_host("h1", *[(f"d{i}", "x", ()) for i in range(10)])
    ids = fleet.client.submit_many([{"goal": "g"}] * 10)
    pacer = pacer_for(fleet.store, "assign", COMMIT_FIRST, COMMIT_LEAST)
    pacer.record(1, 0.010)  # one pair took 10 ms (the round trip of a busy host)
    assert pacer.size == COMMIT_LEAST
    # the commit's own script calls, counted on its client (the server's command counts also
    # hold whatever else runs on that server meanwhile)
    calls: list[str] = []
    run = fleet.store._run

    def counted(name: str, args: list[Any]) -> Any:
        calls.append(name)
        return run(name, args)

    monkeypatch.setattr(fleet.store, "_run", counted)
    out = fleet.store.commit([(t, f"d{i}") for i, t in enumerate(ids)])
    assert all(o.startswith("ok:") for o in out)
    assert calls == ["assign"]
