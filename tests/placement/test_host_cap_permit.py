"""The host limit's permit (`LimitCap` of the declared limit ``host``): at most
``max_tasks_per_host`` leases on one host's devices, counting those held when the snapshot was
read (the view's ``limits``) and the pairs placed in the pass; run through `placement.place` on
hand-made and random views."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from deviceq.core.limits import BY_NAME
from deviceq.scheduler.placement import PROFILES, GangDecision, MissingInputs, Profile, View, place
from deviceq.scheduler.placement.builtin import LimitCap, ReserveThenHold
from deviceq.scheduler.placement.gang import Gang, GangView, Role, place_gangs
from deviceq.scheduler.placement.rows import (
    Bucket,
    IdleDevice,
    Pair,
    QueuedTask,
    Snapshot,
    TenantShare,
)
from deviceq.scheduler.placement.view import LimitLoad


def bucket(sig: str, seqs: list[int], tenant: str | None = None) -> Bucket:
    heads = tuple(QueuedTask(f"{sig}{s}", s, sig, 0, tenant=tenant) for s in seqs)
    return Bucket(sig, "android", frozenset(), 0, heads, seqs[0], tenant=tenant)


def dev(did: str, host: str, idle_since: int = 0, faults: int = 0) -> IdleDevice:
    return IdleDevice(did, host, "android", frozenset(), idle_since, faults)


def host_limit(cap: int, held: dict[str, int] | None) -> dict[str, LimitLoad]:
    """The view's ``limits`` with the host limit at ``cap`` and ``held`` leases per host."""
    return {"host": LimitLoad(held or {}, cap)}


def view(
    buckets: list[Bucket],
    devices: list[IdleDevice],
    cap: int,
    held: dict[str, int] | None = None,
    limit: int = 100,
    **kw: object,
) -> View:
    inputs: dict[str, object] = {"tenants": {}, "submit_times": {}, "avoid": {}, "faults": {}}
    inputs.update(kw)
    return View(
        tuple(buckets),
        tuple(devices),
        limit,
        1_000_000,
        limits=host_limit(cap, held),
        **inputs,  # type: ignore[arg-type]
    )


def per_host(v: View, pairs: list[Pair]) -> Counter[str]:
    host = {d.device_id: d.host_id for d in v.devices}
    return Counter(host[d] for _, d in pairs)


def without_cap(profile: Profile) -> Profile:
    return replace(profile, permits=tuple(p for p in profile.permits if p.name != "host_cap"))


# -- hand-made views -------------------------------------------------------------------------------
def test_every_builtin_profile_has_the_host_cap() -> None:
    for p in PROFILES.values():
        assert "host_cap" in [x.name for x in p.permits], p.name
        assert "limits" in p.needs
    assert LimitCap(BY_NAME["host"]).needs == {"limits"}


def test_cap_zero_allows_every_pair_whatever_the_hosts_hold() -> None:
    devs = [dev("d1", "h1"), dev("d2", "h1"), dev("d3", "h1")]
    v = view([bucket("a", [1, 2, 3])], devs, cap=0, held={"h1": 50})
    assert place(PROFILES["fifo_match"], v) == [("a1", "d1"), ("a2", "d2"), ("a3", "d3")]


def test_one_host_gets_at_most_the_cap_in_a_pass() -> None:
    devs = [dev("d1", "h1"), dev("d2", "h1"), dev("d3", "h1")]
    for cap in (1, 2, 3):
        v = view([bucket("a", [1, 2, 3])], devs, cap=cap)
        pairs = place(PROFILES["fifo_match"], v)
        assert pairs == [("a1", "d1"), ("a2", "d2"), ("a3", "d3")][:cap]


def test_the_leases_a_host_holds_count_against_its_cap() -> None:
    """h1 holds 1 of its cap of 2: one more there; h2 holds none: two there."""
    devs = [dev("d1", "h1"), dev("d2", "h2"), dev("d3", "h1"), dev("d4", "h2"), dev("d5", "h1")]
    v = view([bucket("a", [1, 2, 3, 4, 5])], devs, cap=2, held={"h1": 1})
    pairs = place(PROFILES["fifo_match"], v)
    assert per_host(v, pairs) == {"h1": 1, "h2": 2}
    assert pairs[:2] == [("a1", "d1"), ("a2", "d2")]


def test_a_host_past_its_cap_gets_nothing() -> None:
    """A host can hold more than the cap (the cap was lowered): it gets none until below."""
    devs = [dev("d1", "h1"), dev("d2", "h1")]
    v = view([bucket("a", [1, 2])], devs, cap=2, held={"h1": 3})
    assert place(PROFILES["lru_device"], v) == []
    v = view([bucket("a", [1, 2])], devs, cap=2, held={"h1": 1})
    assert place(PROFILES["lru_device"], v) == [("a1", "d1")]


def test_a_host_at_its_cap_closes_for_the_rest_of_the_pass() -> None:
    """h1 is full after a1: a2 and a3 take h2's devices rather than being refused d2."""
    devs = [dev("d1", "h1"), dev("d2", "h1"), dev("d3", "h2"), dev("d4", "h2")]
    v = view([bucket("a", [1, 2, 3])], devs, cap=1)
    assert place(PROFILES["fifo_match"], v) == [("a1", "d1"), ("a2", "d3")]
    v = view([bucket("a", [1, 2, 3])], devs, cap=2, held={"h1": 2})
    assert place(PROFILES["fifo_match"], v) == [("a1", "d3"), ("a2", "d4")]


def test_refine_does_not_move_a_pair_onto_a_full_host() -> None:
    """a1 gets the faulty d1 (h1); refine would move it to the unused d3, but h2 is full with
    a2's d2: a1 stays on d1. Without the cap it moves."""
    devs = [dev("d1", "h1", faults=1), dev("d2", "h2"), dev("d3", "h2")]
    faults = {"d1": 1}
    v = view([bucket("a", [1, 2])], devs, cap=1, faults=faults)
    assert place(PROFILES["fifo_match"], v) == [("a1", "d1"), ("a2", "d2")]
    v = view([bucket("a", [1, 2])], devs, cap=2, faults=faults)
    assert place(PROFILES["fifo_match"], v) == [("a1", "d3"), ("a2", "d2")]


def test_fair_share_applies_both_caps() -> None:
    """Tenant x (cap 1 device) and the host cap (2 leases per host) together."""
    x = bucket("x", [1, 2], tenant="x")
    y = bucket("y", [10, 11, 12], tenant="y")
    devs = [dev("d1", "h1"), dev("d2", "h1"), dev("d3", "h1")]
    v = view([x, y], devs, cap=2, tenants={"x": TenantShare(1, 1, 0)})
    pairs = place(PROFILES["fair_share"], v)
    assert per_host(v, pairs) == {"h1": 2}
    assert sum(1 for t, _ in pairs if t.startswith("x")) == 1


def test_a_view_without_the_limits_is_refused() -> None:
    v = View((bucket("a", [1]),), (dev("d1", "h1"),), 10, avoid={}, faults={})
    with pytest.raises(MissingInputs, match="limits"):
        place(PROFILES["fifo_match"], v)


def test_from_snapshot_takes_the_limits_and_sets_none_without_them() -> None:
    b = bucket("a", [1, 2])
    snap = Snapshot.build([b], [dev("d1", "h1"), dev("d2", "h1")], 10, 0)
    assert View.from_snapshot(snap).limits == {}
    assert place(PROFILES["fifo_match"], View.from_snapshot(snap)) == [("a1", "d1"), ("a2", "d2")]
    v = View.from_snapshot(snap, limits=host_limit(2, {"h1": 1}))
    assert v.limits is not None and v.limits["host"].held == {"h1": 1}
    assert v.limits["host"].bound == 2
    assert place(PROFILES["fifo_match"], v) == [("a1", "d1")]


# -- random views ----------------------------------------------------------------------------------
def random_view(rng: random.Random, cap: int) -> View:
    n_hosts = rng.randint(1, 4)
    devices = [
        dev(
            f"d{j:02d}",
            f"h{rng.randrange(n_hosts)}",
            idle_since=rng.randint(0, 20),
            faults=rng.randint(1, 2) if rng.random() < 0.2 else 0,
        )
        for j in range(rng.randint(1, 16))
    ]
    seqs = rng.sample(range(1, 1000), rng.randint(1, 20))
    hosts = [f"h{i}" for i in range(n_hosts)]
    buckets = []
    for i, chunk in enumerate((seqs[: len(seqs) // 2], seqs[len(seqs) // 2 :])):
        if chunk:
            b = bucket(f"b{i}", sorted(chunk), tenant=rng.choice((None, "x", "y")))
            heads = tuple(
                replace(
                    t,
                    avoid_devices=frozenset(rng.sample([d.device_id for d in devices], 1)),
                    avoid_hosts=frozenset(rng.sample(hosts, 1)),
                )
                if rng.random() < 0.3
                else t
                for t in b.heads
            )
            buckets.append(replace(b, heads=heads))
    held = {h: rng.randint(0, 3) for h in hosts if rng.random() < 0.6}
    snap = Snapshot.build(buckets, devices, rng.choice((1, 3, 100)), 1_000_000)
    tenants = {"x": TenantShare(2, rng.choice((0, 1, 3)), rng.randint(0, 2))}
    snap = replace(snap, tenants=tenants)
    sub = {t.task_id: t.seq for b in buckets for t in b.heads}
    return View.from_snapshot(snap, submit_times=sub, aging_ms=0, limits=host_limit(cap, held))


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_no_host_ever_exceeds_its_cap(name: str) -> None:
    """On many random views: every host's leases held plus the pairs placed on it stay within
    the cap (a host already past it gets none), and each task and device is used once."""
    rng = random.Random(name)
    checked = 0
    for _ in range(400):
        cap = rng.randint(1, 3)
        v = random_view(rng, cap)
        pairs = place(PROFILES[name], v)
        held = dict(v.limits["host"].held) if v.limits else {}
        for host, n in per_host(v, pairs).items():
            assert n <= max(0, cap - held.get(host, 0)), (host, n, held, pairs)
        assert len({t for t, _ in pairs}) == len(pairs) == len({d for _, d in pairs})
        checked += bool(pairs)
    assert checked > 100


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_cap_zero_or_out_of_reach_changes_no_pair(name: str) -> None:
    """The permit is inert at cap 0 (whatever the counts say) and when no host can reach the
    cap in the pass: the same pairs as the profile without it."""
    rng = random.Random(name + "inert")
    for _ in range(300):
        v = random_view(rng, 0)
        bare = place(without_cap(PROFILES[name]), v)
        assert place(PROFILES[name], v) == bare
        far = replace(v, limits=host_limit(len(v.devices), {}))
        assert place(PROFILES[name], far) == bare


# -- multi-device tasks ----------------------------------------------------------------------------
def gangs_placed(
    gangs: list[Gang], devices: list[IdleDevice], cap: int, held: dict[str, int]
) -> dict[str, list[str]]:
    gv = GangView.build(gangs, devices, 1_000_000, limits=host_limit(cap, held))
    picks = place_gangs(PROFILES["fifo_match"], gv, ReserveThenHold(60_000, 30_000))
    return {p.gang_id: p.devices for p in picks if p.decision is GangDecision.ALLOW}


def two(gid: str, seq: int) -> Gang:
    return Gang(gid, seq, (Role("a", "android"), Role("b", "android")))


def test_a_gang_counts_each_of_its_devices_on_a_host() -> None:
    devs = [dev("p1", "ha"), dev("p2", "ha"), dev("q1", "hb"), dev("q2", "hb")]
    # ha holds 1 of 2: the gang's two picks there (p1, p2) would make 3
    assert gangs_placed([two("g1", 1)], devs[:2], cap=2, held={"ha": 1}) == {}
    assert gangs_placed([two("g1", 1)], devs[:2], cap=2, held={}) == {"g1": ["p1", "p2"]}
    # a host full after the first gang is closed to the next one
    got = gangs_placed([two("g1", 1), two("g2", 2)], devs, cap=2, held={})
    assert got == {"g1": ["p1", "p2"], "g2": ["q1", "q2"]}
    # cap 0: every gang placed whatever the hosts hold
    assert gangs_placed([two("g1", 1)], devs[:2], cap=0, held={"ha": 9}) == {"g1": ["p1", "p2"]}


def test_a_gang_view_without_limits_sets_none() -> None:
    gv = GangView.build([two("g1", 1)], [dev("p1", "ha")], 0)
    assert gv.view.limits == {}
