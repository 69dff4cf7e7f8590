"""The placement plugins one by one, and the pipeline's stages, on small hand-made views."""

from __future__ import annotations

from dataclasses import replace

import pytest

from deviceq.core.limits import BY_NAME
from deviceq.scheduler.placement import PROFILES, Avoid, MissingInputs, Profile, View, place
from deviceq.scheduler.placement.builtin import (
    AgingSort,
    AntiAffinity,
    FairShareSort,
    FaultCount,
    FifoSort,
    LeastRecentlyUsed,
    LimitCap,
    Match,
    PrioritySort,
)
from deviceq.scheduler.strategies import Bucket, IdleDevice, QueuedTask, TenantShare


def bucket(
    sig: str,
    seqs: list[int],
    prio: int = 0,
    driver: str | None = "android",
    tags: str = "",
    tenant: str | None = None,
) -> Bucket:
    heads = tuple(QueuedTask(f"{sig}{s}", s, sig, prio, tenant=tenant) for s in seqs)
    tagset = frozenset(t for t in tags.split(",") if t)
    return Bucket(sig, driver, tagset, prio, heads, seqs[0], tenant=tenant)


def dev(did: str, host: str = "h1", idle_since: int = 0, tags: str = "") -> IdleDevice:
    return IdleDevice(did, host, "android", frozenset(t for t in tags.split(",") if t), idle_since)


def view(buckets: list[Bucket], devices: list[IdleDevice], limit: int = 100, **kw: object) -> View:
    inputs: dict[str, object] = {
        "tenants": {},
        "submit_times": {},
        "avoid": {},
        "faults": {},
        "limits": {},
        "attributes": {},
    }
    inputs.update(kw)
    return View(tuple(buckets), tuple(devices), limit, 1_000_000, **inputs)  # type: ignore[arg-type]


def ids(order: object) -> list[str]:
    return [t.task_id for t in order]  # type: ignore[attr-defined]


# -- view ------------------------------------------------------------------------------------------
def test_view_is_read_only_and_sorts_devices_by_id() -> None:
    v = view([bucket("a", [1])], [dev("d2"), dev("d10"), dev("d1")], faults={"d2": 1})
    assert [d.device_id for d in v.devices] == ["d1", "d10", "d2"]
    with pytest.raises(TypeError):
        v.faults["d1"] = 3  # type: ignore[index]
    assert v.inputs == {"tenants", "submit_times", "avoid", "faults", "limits", "attributes"}
    assert View((), (), 1).inputs == frozenset()


# -- filter ----------------------------------------------------------------------------------------
def test_match_filter_is_the_constraint_rule() -> None:
    m = Match()
    assert m.feasible(bucket("a", [1], driver=None), ("ios", frozenset()))
    assert m.feasible(bucket("a", [1], tags="gpu"), ("android", frozenset({"gpu", "5g"})))
    assert not m.feasible(bucket("a", [1], tags="gpu,5g"), ("android", frozenset({"gpu"})))
    assert not m.feasible(bucket("a", [1]), ("ios", frozenset()))


# -- sorts -----------------------------------------------------------------------------------------
def test_fifo_sort_merges_buckets_oldest_first() -> None:
    v = view([bucket("a", [5, 9]), bucket("b", [3, 7])], [])
    assert ids(FifoSort().order(v)) == ["b3", "a5", "b7", "a9"]


def test_priority_sort_higher_first_then_oldest() -> None:
    aged = bucket("c", [1])
    aged = replace(aged, heads=(replace(aged.heads[0], effective_priority=9),))
    v = view([bucket("a", [5, 9], prio=1), bucket("b", [7], prio=5), aged], [])
    assert ids(PrioritySort().order(v)) == ["c1", "b7", "a5", "a9"]


def test_aging_sort_raises_a_waiting_task_one_level_per_period() -> None:
    low, high = bucket("lo", [1], prio=0), bucket("hi", [2], prio=3)
    now = 1_000_000
    # lo waited 4 periods (0 -> 4), hi just came (3)
    subs = {"lo1": now - 4_000, "hi2": now}
    v = view([low, high], [], submit_times=subs, aging_ms=1_000)
    assert ids(AgingSort().order(v)) == ["lo1", "hi2"]
    assert ids(AgingSort().order(replace(v, aging_ms=0))) == ["hi2", "lo1"]
    # one priority among the buckets: no aging (it could not change an order within one)
    same = view([bucket("x", [2]), bucket("y", [1])], [], submit_times={"x2": 1}, aging_ms=1)
    assert ids(AgingSort().order(same)) == ["y1", "x2"]


def test_fair_share_sort_gives_the_tenant_with_the_fewest_held_per_weight_next() -> None:
    x = bucket("x", [1, 2, 3, 4], tenant="x")
    y = bucket("y", [10, 11, 12, 13], tenant="y")
    tenants = {"x": TenantShare(1, 0, 2), "y": TenantShare(1, 0, 0)}
    order = FairShareSort().order(view([x, y], [], tenants=tenants))
    got = []
    for t in order:
        got.append(t.tenant)
        order.placed(t, dev("d"))
    assert got[:4] == ["y", "y", "x", "y"]  # y catches up with x's 2, then they alternate


def test_fair_share_sort_counts_only_what_was_placed() -> None:
    x = bucket("x", [1, 2], tenant="x")
    y = bucket("y", [10, 11], tenant="y")
    order = FairShareSort().order(view([x, y], []))
    first = next(iter(order))  # x1 (oldest, both hold 0); not placed: x stays ahead
    assert first.task_id == "x1"
    assert next(iter(order)).task_id == "x2"


# -- permit ----------------------------------------------------------------------------------------
def test_tenant_cap_counts_held_and_this_passs_devices() -> None:
    t = QueuedTask("t", 1, "s", tenant="acme")
    free = QueuedTask("u", 2, "s")
    state = LimitCap(BY_NAME["tenant"]).start(view([], [], tenants={"acme": TenantShare(1, 2, 1)}))
    assert state is not None
    assert state.allows(t, dev("d1"))
    state.placed(t, dev("d1"))
    assert not state.allows(t, dev("d2"))
    assert state.allows(free, dev("d2"))  # no tenant, no cap


# -- scores ----------------------------------------------------------------------------------------
def test_anti_affinity_ranks_failed_device_then_failed_host() -> None:
    t = QueuedTask("t", 1, "s")
    v = view([], [], avoid={"t": Avoid(frozenset({"d1"}), frozenset({"h2"}))})
    aa = AntiAffinity()
    assert aa.applies(v, t) and not aa.applies(v, QueuedTask("u", 2, "s"))
    assert aa.task_key(v, t, dev("d1", "h1")) == 2
    assert aa.task_key(v, t, dev("d2", "h2")) == 1
    assert aa.task_key(v, t, dev("d3", "h3")) == 0


def test_lru_and_fault_scores() -> None:
    v = view([], [], faults={"d1": 3})
    assert LeastRecentlyUsed().device_key(v, dev("d1", idle_since=42)) == 42
    assert FaultCount().device_key(v, dev("d1")) == 3
    assert FaultCount().device_key(v, dev("d2")) == 0


# -- the pipeline ----------------------------------------------------------------------------------
def test_lru_profile_gives_the_longest_idle_device() -> None:
    devs = [dev("d1", idle_since=30), dev("d2", idle_since=10), dev("d3", idle_since=20)]
    pairs = place(PROFILES["lru_device"], view([bucket("a", [1, 2])], devs))
    assert pairs == [("a1", "d2"), ("a2", "d3")]


def test_a_retry_avoids_the_device_and_host_it_failed_on() -> None:
    devs = [dev("d1", "h1"), dev("d2", "h1"), dev("d3", "h2")]
    rec = {"a1": Avoid(frozenset({"d1"}), frozenset({"h1"}))}
    assert place(PROFILES["fifo_match"], view([bucket("a", [1])], devs, avoid=rec)) == [
        ("a1", "d3")
    ]


def test_refine_swaps_a_faulty_device_for_an_unused_one() -> None:
    """Faults are applied after choosing (as the old pass did): t1 is first given d1, then
    moved to the unused d3, not to d2 (which t2 already has)."""
    devs = [dev("d1"), dev("d2"), dev("d3")]
    v = view([bucket("t", [1, 2])], devs, faults={"d1": 1})
    assert place(PROFILES["fifo_match"], v) == [("t1", "d3"), ("t2", "d2")]
    # every device needed: the faulty one is used
    v3 = view([bucket("t", [1, 2, 3])], devs, faults={"d1": 1})
    assert sorted(d for _, d in place(PROFILES["fifo_match"], v3)) == ["d1", "d2", "d3"]


def test_fair_share_profile_stops_a_tenant_at_its_cap() -> None:
    x = bucket("x", [1, 2, 3], tenant="x")
    y = bucket("y", [10], tenant="y")
    devs = [dev(f"d{i}") for i in range(5)]
    v = view([x, y], devs, tenants={"x": TenantShare(1, 2, 1)})
    pairs = place(PROFILES["fair_share"], v)
    assert sorted(t for t, _ in pairs) == ["x1", "y10"]


def test_limit_stops_the_pass() -> None:
    v = view([bucket("a", [1, 2, 3])], [dev("d1"), dev("d2"), dev("d3")], limit=2)
    assert len(place(PROFILES["priority_match"], v)) == 2


def test_the_window_keeps_a_big_class_to_its_limit_best_for_a_retry() -> None:
    """Greedy profiles rank a class of more than 4 x limit devices as its limit best: a retry
    that failed on all of those gets one of them first, then refine moves it off."""
    devs = [dev(f"d{i}") for i in range(6)]
    rec = {"a1": Avoid(frozenset({"d0"}), frozenset())}
    v = view([bucket("a", [1])], devs, limit=1, avoid=rec)
    no_refine = replace(PROFILES["fifo_match"], refine=())
    assert place(no_refine, v) == [("a1", "d0")]
    assert place(replace(no_refine, window=False), v) == [("a1", "d1")]
    assert place(PROFILES["fifo_match"], v) == [("a1", "d1")]


def test_a_view_without_an_input_a_plugin_needs_is_refused() -> None:
    v = View((bucket("a", [1]),), (dev("d1"),), 10, avoid={}, faults={}, limits={})
    assert place(PROFILES["fifo_match"], v) == [("a1", "d1")]
    with pytest.raises(MissingInputs, match="submit_times"):
        place(PROFILES["priority_match"], v)


def test_profile_needs_are_the_union_of_its_plugins() -> None:
    assert PROFILES["fifo_match"].needs == {"avoid", "faults", "limits"}
    assert PROFILES["fair_share"].needs == {
        "tenants",
        "submit_times",
        "avoid",
        "faults",
        "limits",
    }
    p = Profile("plain", FifoSort())
    assert p.needs == frozenset() and p.plugins == (p.sort, *p.filters)
    assert place(p, View((bucket("a", [1]),), (dev("d1"),), 10)) == [("a1", "d1")]


def test_a_filter_rejects_a_whole_device_class() -> None:
    class NoGpu:
        name = "no_gpu"
        needs: frozenset[str] = frozenset()

        def feasible(self, need: object, device_class: tuple[str, frozenset[str]]) -> bool:
            return "gpu" not in device_class[1]

    p = Profile("no_gpu", FifoSort(), filters=(Match(), NoGpu()))
    v = View((bucket("a", [1, 2]),), (dev("d1", tags="gpu"), dev("d2")), 10)
    assert place(p, v) == [("a1", "d2")]
