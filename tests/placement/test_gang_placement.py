"""Multi-device (gang) placement with a profile (`deviceq.scheduler.placement.gang`), on hand-made
gangs and devices: the profile's order across gangs, its filters and scores per role (anti-affinity
of a role's part, faults, least recently used), the tenant cap over a gang's devices, the
roles' sharing of devices, and the reserve-then-hold gang permit."""

from __future__ import annotations

import pytest

from deviceq.core.limits import BY_NAME
from deviceq.scheduler.placement import PROFILES, Avoid, GangDecision, Profile
from deviceq.scheduler.placement.builtin import FifoSort, LimitCap, ReserveThenHold
from deviceq.scheduler.placement.builtin.gang_hold import HoldState
from deviceq.scheduler.placement.gang import (
    Gang,
    GangPick,
    GangView,
    Role,
    gang_scores,
    place_gangs,
)
from deviceq.scheduler.strategies import IdleDevice, TenantShare

NOW = 10_000_000
ALLOW, DENY, WAIT = GangDecision.ALLOW, GangDecision.DENY, GangDecision.WAIT


def dev(did: str, driver: str = "android", tags: str = "", host: str = "h1", idle: int = 0,
        faults: int = 0) -> IdleDevice:  # fmt: skip
    return IdleDevice(did, host, driver, frozenset(t for t in tags.split(",") if t), idle, faults)


def role(spec: str) -> Role:
    """``NAME=DRIVER[:TAGS]`` (an empty driver: any)."""
    name, _, rest = spec.partition("=")
    driver, _, tags = rest.partition(":")
    return Role(name, driver or None, frozenset(t for t in tags.split(",") if t))


def gang(gid: str, seq: int, *roles: str, prio: int = 0, tenant: str | None = None,
         sub: int = NOW, waited: int = 0) -> Gang:  # fmt: skip
    return Gang(gid, seq, tuple(role(r) for r in roles), prio, tenant, sub, waited)


def run(
    profile: str | Profile,
    gangs: list[Gang],
    devices: list[IdleDevice],
    permit: ReserveThenHold | None = None,
    **kw: object,
) -> dict[str, GangPick]:
    p = PROFILES[profile] if isinstance(profile, str) else profile
    gv = GangView.build(gangs, devices, NOW, **kw)  # type: ignore[arg-type]
    out = place_gangs(p, gv, permit or ReserveThenHold(60_000, 30_000))
    return {x.gang_id: x for x in out}


def placed(res: dict[str, GangPick]) -> dict[str, dict[str, str]]:
    """The allowed gangs: role -> device."""
    return {
        g: {r: d.device_id for r, d in p.picks if d is not None}
        for g, p in res.items()
        if p.decision is ALLOW
    }


PHONES = [dev("p1", host="ha"), dev("p2", host="hb"), dev("p3", host="hc")]


# -- order -------------------------------------------------------------------------------------
def test_the_higher_priority_gang_is_placed_first_when_devices_are_short() -> None:
    gangs = [gang("old", 1, "a=android", "b=android"), gang("urgent", 2, "a=android",
             "b=android", prio=5)]  # fmt: skip
    res = run("priority_match", gangs, PHONES)
    assert placed(res) == {"urgent": {"a": "p1", "b": "p2"}}
    assert res["old"].decision is DENY
    assert res["old"].devices == ["p3"]  # what was left for it, not taken
    # the order is the profile's: FIFO places the older one
    assert list(placed(run("fifo_match", gangs, PHONES))) == ["old"]


def test_aging_raises_an_old_gang_above_a_newer_higher_priority_one() -> None:
    # waited 5 x aging_ms: priority 0 ages to 5, above the newer gang's 3
    old = gang("old", 1, "a=android", "b=android", sub=NOW - 5_000)
    new = gang("new", 2, "a=android", "b=android", prio=3)
    assert list(placed(run("priority_match", [old, new], PHONES))) == ["new"]
    assert list(placed(run("priority_match", [old, new], PHONES, aging_ms=1_000))) == ["old"]


def test_fair_share_orders_gangs_by_tenant_and_counts_every_device_they_get() -> None:
    tenants = {"a": TenantShare(1, 0, 0), "b": TenantShare(1, 0, 1)}
    gangs = [
        gang("b1", 1, "x=android", tenant="b"),
        gang("a1", 2, "x=android", "y=android", tenant="a"),
        gang("a2", 3, "x=android", tenant="a"),
        gang("b2", 4, "x=android", tenant="b"),
    ]
    devs = [dev(f"p{i}") for i in range(1, 5)]
    res = run("fair_share", gangs, devs, tenants=tenants)
    # a (none held) first: a1 takes two; then b (1 held, a 2): b1; then a and b both hold 2
    # and a's next gang is older (seq 3 before 4): a2; no device is left for b2
    assert placed(res) == {"a1": {"x": "p1", "y": "p2"}, "b1": {"x": "p3"}, "a2": {"x": "p4"}}
    assert res["b2"].decision is DENY


# -- scores per role -----------------------------------------------------------------------------
def test_an_anti_affinity_record_applies_to_its_own_role_only() -> None:
    g = gang("g", 1, "a=android", "b=android")
    assert placed(run("fifo_match", [g], PHONES)) == {"g": {"a": "p1", "b": "p2"}}
    # part g.a lost an attempt on p1: role a avoids it; role b may take it
    res = run("fifo_match", [g], PHONES, avoid={"g.a": Avoid(frozenset({"p1"}))})
    assert placed(res) == {"g": {"a": "p2", "b": "p1"}}
    # a host it failed on is avoided too (after the device itself)
    res = run("fifo_match", [g], PHONES, avoid={"g.b": Avoid(frozenset(), frozenset({"ha"}))})
    assert placed(res) == {"g": {"a": "p1", "b": "p2"}}
    res = run("fifo_match", [g], PHONES, avoid={"g.a": Avoid(frozenset(), frozenset({"ha"}))})
    assert placed(res) == {"g": {"a": "p2", "b": "p1"}}


def test_faulty_devices_last_and_least_recently_used_where_the_profile_says() -> None:
    devs = [dev("p1", idle=300), dev("p2", idle=100, faults=2), dev("p3", idle=200)]
    g = gang("g", 1, "a=android")
    # fifo_match: anti-affinity, faults, then device_id
    assert placed(run("fifo_match", [g], devs)) == {"g": {"a": "p1"}}
    # lru_device: faults before the longest idle (p2 idled longest, but it is faulty)
    assert placed(run("lru_device", [g], devs)) == {"g": {"a": "p3"}}
    assert [s.name for s in gang_scores(PROFILES["lru_device"])] == [
        "anti_affinity", "faults", "prefer", "lru"]  # fmt: skip


def test_the_profile_filters_decide_feasibility() -> None:
    devs = [dev("p1", tags="sim"), dev("w1", "browser")]
    g = gang("g", 1, "phone=android:sim", "web=browser")
    assert placed(run("fifo_match", [g], devs)) == {"g": {"phone": "p1", "web": "w1"}}
    res = run("fifo_match", [gang("g", 1, "phone=android:5g", "web=browser")], devs)
    assert res["g"].decision is DENY and res["g"].picks == (("phone", None), ("web", devs[1]))


# -- roles sharing devices -----------------------------------------------------------------------
def test_a_more_constrained_role_keeps_the_only_device_it_can_use() -> None:
    devs = [dev("p1", tags="sim"), dev("p2")]
    g = gang("g", 1, "any=android", "calls=android:sim")
    assert placed(run("fifo_match", [g], devs)) == {"g": {"any": "p2", "calls": "p1"}}


def test_roles_are_rearranged_when_the_greedy_choice_leaves_one_without_a_device() -> None:
    devs = [dev("d1", tags="x,z"), dev("d2", tags="x,y,z"), dev("d3", tags="y")]
    g = gang("g", 1, "a=android:x", "b=android:y", "c=android:z")
    # a takes d1, b d2; c (d1 or d2) then moves a to d2 and b to d3
    assert placed(run("fifo_match", [g], devs)) == {"g": {"a": "d2", "b": "d3", "c": "d1"}}


def test_a_role_never_gets_a_device_of_an_earlier_gang() -> None:
    gangs = [gang("g1", 1, "a=android"), gang("g2", 2, "a=android", "b=android")]
    res = run("fifo_match", gangs, PHONES)
    assert placed(res) == {"g1": {"a": "p1"}, "g2": {"a": "p2", "b": "p3"}}


# -- permits -------------------------------------------------------------------------------------
def test_the_tenant_cap_counts_every_device_of_a_gang() -> None:
    devs = [dev(f"p{i}") for i in range(1, 7)]
    # t may hold 3 and holds 2: a two-role gang would make 4
    tenants = {"t": TenantShare(1, 3, 2)}
    res = run("fair_share", [gang("g", 1, "a=android", "b=android", tenant="t")], devs,
              tenants=tenants)  # fmt: skip
    assert res["g"].decision is DENY and len(res["g"].devices) == 2
    res = run("fair_share", [gang("g", 1, "a=android", tenant="t")], devs, tenants=tenants)
    assert placed(res) == {"g": {"a": "p1"}}
    # what a gang was given counts for the next: cap 4, two gangs of two, a third refused
    tenants = {"t": TenantShare(1, 4, 0)}
    gangs = [gang(f"g{i}", i, "a=android", "b=android", tenant="t") for i in range(3)]
    res = run("fair_share", gangs, devs, tenants=tenants)
    assert list(placed(res)) == ["g0", "g1"] and res["g2"].decision is DENY
    # a role still without a device counts too: a capped tenant's gang keeps nothing
    res = run("fair_share", [gang("g", 1, "a=android", "b=browser", tenant="t", waited=10**9)],
              devs, tenants={"t": TenantShare(1, 1, 0)})  # fmt: skip
    assert res["g"].decision is DENY


def test_a_profile_without_the_tenant_cap_ignores_caps() -> None:
    tenants = {"t": TenantShare(1, 1, 1)}
    g = gang("g", 1, "a=android", "b=android", tenant="t")
    assert list(placed(run("fifo_match", [g], PHONES, tenants=tenants))) == ["g"]
    capped = Profile("capped_fifo", FifoSort(), permits=(LimitCap(BY_NAME["tenant"]),))
    assert run(capped, [g], PHONES, tenants=tenants)["g"].decision is DENY


# -- the gang permit: reserve, then hold ---------------------------------------------------------
def test_a_gang_that_does_not_fit_takes_nothing_before_its_reserve_time() -> None:
    g = gang("g", 1, "phone=android", "web=browser", waited=59_999)
    after = gang("single", 2, "a=android")
    res = run("fifo_match", [g, after], PHONES[:1])
    assert res["g"].decision is DENY and res["g"].devices == ["p1"]
    assert placed(res) == {"single": {"a": "p1"}}  # the device went on to the next gang


def test_a_gang_past_its_reserve_time_keeps_its_picks_for_at_most_the_hold() -> None:
    holds: dict[str, HoldState] = {}
    permit = ReserveThenHold(60_000, 30_000, holds)
    g = gang("g", 1, "phone=android", "web=browser", waited=60_000)
    after = gang("single", 2, "a=android")
    res = run("fifo_match", [g, after], PHONES[:1], permit)
    assert res["g"].decision is WAIT and res["g"].devices == ["p1"]
    assert res["single"].decision is DENY  # p1 is kept for g
    assert permit.until("g") == NOW + 30_000 and holds["g"].hold_from == NOW

    def at(now: int, waited: int) -> dict[str, GangPick]:
        gs = [gang("g", 1, "phone=android", "web=browser", waited=waited), after]
        gv = GangView.build(gs, PHONES[:1], now)
        return {x.gang_id: x for x in place_gangs(PROFILES["fifo_match"], gv, permit)}

    assert at(NOW + 29_999, 89_999)["g"].decision is WAIT  # still within the hold
    res = at(NOW + 30_000, 90_000)  # the hold ran out: let go, single takes p1
    assert res["g"].decision is DENY and res["single"].decision is ALLOW
    assert permit.until("g") == 0
    assert at(NOW + 89_999, 149_999)["g"].decision is DENY  # not again for reserve_after
    assert at(NOW + 90_000, 150_000)["g"].decision is WAIT
    # hold 0: never keeps
    assert run("fifo_match", [g], PHONES[:1], ReserveThenHold(0, 0))["g"].decision is DENY


def test_a_complete_pick_is_allowed_while_the_gang_keeps_devices() -> None:
    permit = ReserveThenHold(0, 30_000)
    g = gang("g", 1, "phone=android", "web=browser")
    assert run("fifo_match", [g], PHONES[:1], permit)["g"].decision is WAIT
    res = run("fifo_match", [g], [PHONES[0], dev("w1", "browser")], permit)
    assert placed(res) == {"g": {"phone": "p1", "web": "w1"}}


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_built_in_profile_places_gangs(name: str) -> None:
    devs = [dev("p1", tags="sim"), dev("p2"), dev("w1", "browser")]
    gangs = [gang("g1", 1, "phone=android:sim", "web=browser"), gang("g2", 2, "x=android")]
    res = run(name, gangs, devs)
    assert placed(res) == {"g1": {"phone": "p1", "web": "w1"}, "g2": {"x": "p2"}}
    assert run(name, [], devs) == {}
