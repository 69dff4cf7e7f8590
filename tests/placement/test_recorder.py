"""The pass with a recorder: the same pairs as without one (on the golden corpus), and what it
records per task: each filter's rejected classes with reasons, the chosen device's score keys,
the permit that denied a task, refine's moves, the tasks the limit left unoffered."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import pytest
from test_golden import RUNS, STRATEGIES, _base, _reader, scenario
from test_plugins import bucket, dev, view

from deviceq.core.models import satisfies
from deviceq.scheduler.placement import PROFILES, Avoid, FilterRecord, Need, Recorder, judge, place
from deviceq.scheduler.placement.builtin import Match
from deviceq.scheduler.placement.plugins import Requirement
from deviceq.scheduler.placement.view import DeviceClass
from deviceq.scheduler.strategies import IdleDevice, TenantShare


@pytest.mark.parametrize("name", STRATEGIES)
def test_a_recorded_pass_gives_the_same_pairs(name: str) -> None:
    """On every view of the golden corpus (as the scheduler's reader makes it), with every
    task watched."""
    profile = PROFILES[name]
    for seed in range(RUNS):
        sc = scenario(seed)
        base, heads = _base(sc)
        v = _reader(sc, profile.needs).make_view(base, heads)
        rec = Recorder()
        pairs = place(profile, v, rec)
        assert pairs == place(profile, v), seed
        placed = dict(pairs)
        for tid, got in rec.tasks.items():
            assert (got.outcome == "placed") == (tid in placed), (seed, tid)
            if tid in placed:
                assert got.device_id == placed[tid], (seed, tid)
        assert set(placed) <= set(rec.tasks)


def test_match_says_why_it_rejects_exactly_when_it_rejects() -> None:
    rng = random.Random(7)
    m = Match()
    for _ in range(2000):
        need = Need(
            rng.choice((None, "android", "ios")), frozenset(rng.sample("abcd", rng.randint(0, 3)))
        )
        c: DeviceClass = (rng.choice(("android", "ios")), frozenset(rng.sample("abcd", 2)))
        why = m.why(need, c)
        assert m.feasible(need, c) == (why == ()) == satisfies(need.driver_type, need.tags, *c)
        if need.driver_type and need.driver_type != c[0]:
            assert why == ("driver_type_mismatch",)
        else:
            assert why == tuple(f"missing_tag:{t}" for t in sorted(need.tags - c[1]))


def test_judge_records_each_rejected_class_with_its_reasons_and_devices() -> None:
    devs = [
        IdleDevice("a1", "h1", "android", frozenset({"wifi"})),
        IdleDevice("a2", "h1", "android", frozenset()),
        IdleDevice("a3", "h2", "android", frozenset()),
        IdleDevice("i1", "h2", "ios", frozenset({"wifi", "camera"})),
        IdleDevice("a4", "h2", "android", frozenset({"wifi", "camera"})),
    ]
    rec = judge((Match(),), Need("android", frozenset({"wifi", "camera"})), devs)
    assert rec.feasible == (("android", frozenset({"wifi", "camera"})),)
    assert rec.feasible_devices == ("a4",)
    assert rec.reasons() == {
        "missing_tag:camera": 3,
        "missing_tag:wifi": 2,
        "driver_type_mismatch": 1,
    }
    assert rec.by_filter() == {"match": 4}
    assert rec.devices_with("missing_tag:wifi") == {"a2", "a3"}
    first = rec.rejected[0]
    assert (first.filter, first.reasons, first.devices) == (
        "match",
        ("missing_tag:camera",),
        ("a1",),
    )


@dataclass(frozen=True)
class OnlyHost1:
    """A filter without ``why``: it is recorded by its name."""

    name: str = "only_h1_classes"
    needs: frozenset[str] = frozenset()

    def feasible(self, need: Requirement, device_class: DeviceClass) -> bool:
        return "h1" in device_class[1]


def test_a_filter_without_why_is_recorded_by_name_and_the_first_rejecting_filter_counts() -> None:
    devs = [dev("d1", tags="h1"), dev("d2", tags="x"), IdleDevice("i1", "h", "ios", frozenset())]
    rec = judge((Match(), OnlyHost1()), Need("android"), devs)
    assert rec.feasible_devices == ("d1",)
    assert rec.reasons() == {"driver_type_mismatch": 1, "only_h1_classes": 1}


def test_the_record_of_a_placed_task_has_the_chosen_devices_score_keys() -> None:
    b = bucket("a", [1])
    retry = replace(b.heads[0], avoid_devices=frozenset({"d1"}))
    b = replace(b, heads=(retry,))
    devs = [dev("d1", idle_since=5), dev("d2", idle_since=9), dev("d3", idle_since=20, tags="gpu")]
    v = view([b], devs, avoid={"a1": Avoid(frozenset({"d1"}))})
    rec = Recorder()
    assert place(PROFILES["lru_device"], v, rec) == [("a1", "d2")]
    got = rec.tasks["a1"]
    assert (got.outcome, got.device_id) == ("placed", "d2")
    assert got.scores == {"anti_affinity": 0, "prefer": 0, "lru": 9}  # (prefer: none set)
    assert got.filters.feasible_devices == ("d1", "d2", "d3")


def test_a_task_no_class_serves_and_one_whose_devices_were_taken() -> None:
    v = view([bucket("a", [1]), bucket("b", [2]), bucket("g", [3], tags="gpu")], [dev("d1")])
    rec = Recorder()
    assert place(PROFILES["fifo_match"], v, rec) == [("a1", "d1")]
    assert rec.outcome("b2") == "exhausted"
    g = rec.tasks["g3"]
    assert g.outcome == "no_feasible_class" and g.device_id is None
    assert g.filters.reasons() == {"missing_tag:gpu": 1}


def test_a_permit_denial_is_recorded_by_the_permits_name() -> None:
    b = bucket("x", [1, 2], tenant="acme")
    tenants = {"acme": TenantShare(1, 2, 1)}  # cap 2, holds 1: one more device
    rec = Recorder()
    pairs = place(PROFILES["fair_share"], view([b], [dev("d1"), dev("d2")], tenants=tenants), rec)
    assert pairs == [("x1", "d1")]
    denied = rec.tasks["x2"]
    assert (denied.outcome, denied.denied_by, denied.device_id) == ("denied", "tenant_cap", "d2")


def test_refine_moves_are_recorded() -> None:
    v = view([bucket("a", [1])], [dev("d1"), dev("d2")], faults={"d1": 2})
    rec = Recorder()
    assert place(PROFILES["fifo_match"], v, rec) == [("a1", "d2")]
    got = rec.tasks["a1"]
    assert (got.refined_from, got.device_id) == ("d1", "d2")
    assert got.refine == {"anti_affinity": 0, "faults": 0}


def test_watched_tasks_only_and_the_limit_leaves_the_rest_unoffered() -> None:
    v = view([bucket("a", [1, 2, 3])], [dev("d1"), dev("d2"), dev("d3")], limit=1)
    rec = Recorder(watch={"a3"})
    assert place(PROFILES["fifo_match"], v, rec) == [("a1", "d1")]
    assert rec.tasks == {} and rec.offered == 1
    assert rec.outcome("a3") == "not_reached"


def test_a_view_with_no_devices_records_that_nothing_serves() -> None:
    rec = Recorder()
    assert place(PROFILES["fifo_match"], view([bucket("a", [1])], []), rec) == []
    assert rec.tasks["a1"].outcome == "no_feasible_class"
    assert rec.tasks["a1"].filters == FilterRecord()
