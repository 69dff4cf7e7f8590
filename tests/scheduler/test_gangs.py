"""Multi-device (gang) tasks on real Redis: every role placed at once or none, never
blocking single-device tasks, devices kept for a starving gang for at most gang_hold_seconds,
and an attempt that ends for every part together (report, failure, expiry, cancel)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis

from conftest import Fleet
from deviceq import InvalidInput, PoolAdmin, TaskStatus
from deviceq.core.keys import Keys
from deviceq.ops.verify import verify
from deviceq.scheduler.task_scheduler import TaskScheduler
from harness import wait_for
from invariants import check_pool

PHONE = ("p1", "android", ("sim",))
WEB = ("w1", "browser", ())
ROLES = {"phone": "android:sim", "web": "browser"}


def two_hosts(fleet: Fleet) -> None:
    fleet.add_host("ha", PHONE)
    fleet.add_host("hb", WEB)


def idle(r: redis.Redis, pool: str) -> set[str]:
    return set(r.zrange(Keys(pool).idle, 0, -1))


def sound(fleet: Fleet) -> None:
    """The pool's invariants hold (the test's own model and `deviceq verify`)."""
    check_pool(fleet.r, Keys(fleet.pool))
    res = verify(fleet.r, fleet.pool)
    assert res.ok, [str(v) for v in res.violations]


def claim_all(fleet: Fleet, *hosts: str) -> dict[str, tuple[str, str]]:
    """Each host claims what its inbox holds: part id -> (host, lease)."""
    out = {}
    for h in hosts:
        for a in fleet.host(h).claim(10):
            out[a.task.id] = (h, a.lease_id)
    return out


def test_submit_validates_roles_and_writes_nothing_on_bad_input(real_fleet: Fleet) -> None:
    c = real_fleet.client
    bad: list[dict[str, object]] = [
        {},
        {"bad name": "android"},
        {"phone": "android:not a tag"},
        {f"r{i}": "android" for i in range(9)},
        {"x" * 33: "android"},
    ]
    for roles in bad:
        with pytest.raises(InvalidInput):
            c.submit("g", roles=roles)
    with pytest.raises(InvalidInput, match="per role"):
        c.submit("g", driver_type="android", roles=ROLES)
    assert c.counts().get("queued", 0) == 0
    tid = c.submit("log in on both", roles=ROLES)
    t = c.get(tid)
    assert t.status is TaskStatus.queued and t.roles is not None
    assert list(t.roles) == ["phone", "web"]
    assert t.roles["phone"].driver_type == "android" and t.roles["phone"].tags == ("sim",)
    assert real_fleet.r.zrange(Keys(real_fleet.pool).gangs, 0, -1) == [tid]
    assert real_fleet.r.zcard(Keys(real_fleet.pool).queues) == 0  # in no single-task bucket
    sound(real_fleet)


def test_all_roles_placed_at_once_on_two_hosts_and_done_together(real_fleet: Fleet) -> None:
    two_hosts(real_fleet)
    tid = real_fleet.client.submit("log in on both", roles=ROLES)
    s = TaskScheduler(real_fleet.r, real_fleet.pool)
    res = s.assign()
    assert res.gangs_assigned == 1
    t = real_fleet.client.get(tid)
    assert t.status is TaskStatus.assigned and t.roles is not None
    assert (t.roles["phone"].device_id, t.roles["phone"].host_id) == ("p1", "ha")
    assert (t.roles["web"].device_id, t.roles["web"].host_id) == ("w1", "hb")
    assert idle(real_fleet.r, real_fleet.pool) == set()
    sound(real_fleet)
    claimed = claim_all(real_fleet, "hb")
    assert list(claimed) == [f"{tid}.web"]
    assert real_fleet.client.get(tid).status is TaskStatus.assigned  # not every part yet
    leader = real_fleet.host("ha").claim(10)
    assert [a.task.id for a in leader] == [f"{tid}.phone"]
    lt = leader[0].task
    assert lt.leader and lt.gang == tid and lt.role == "phone" and lt.goal == "log in on both"
    assert lt.roles is not None and lt.roles["web"].device_id == "w1"
    assert real_fleet.client.get(tid).status is TaskStatus.dispatched
    sound(real_fleet)
    ans = real_fleet.host("ha").report(lt.id, leader[0].lease_id, "done", None, "ok")
    assert ans == "ok:done"
    t = real_fleet.client.get(tid)
    assert t.status is TaskStatus.done and t.result == "ok"
    assert t.roles is not None and {r.status for r in t.roles.values()} == {"done"}
    assert idle(real_fleet.r, real_fleet.pool) == {"p1", "w1"}
    # the web part ended with it: its host's late report changes nothing
    web_lease = claimed[f"{tid}.web"][1]
    assert real_fleet.host("hb").report(f"{tid}.web", web_lease, "done").startswith("rejected")
    counts = real_fleet.client.counts()
    assert counts.get("done") == 1 and not counts.get("assigned") and not counts.get("dispatched")
    sound(real_fleet)


def test_a_gang_that_does_not_fit_takes_nothing_and_blocks_nobody(real_fleet: Fleet) -> None:
    real_fleet.add_host("ha", PHONE)  # no browser at all
    gid = real_fleet.client.submit("needs both", roles=ROLES)
    single = real_fleet.client.submit("phone only", driver_type="android")
    res = TaskScheduler(real_fleet.r, real_fleet.pool).assign()
    assert res.gangs_assigned == 0 and res.assigned == 1
    assert real_fleet.client.get(single).device_id == "p1"
    assert real_fleet.client.get(gid).status is TaskStatus.queued


def test_a_failure_of_one_part_retries_the_whole_gang(real_fleet: Fleet) -> None:
    two_hosts(real_fleet)
    tid = real_fleet.client.submit("flaky", roles=ROLES, max_attempts=2)
    s = TaskScheduler(real_fleet.r, real_fleet.pool)
    s.assign()
    claimed = claim_all(real_fleet, "hb", "ha")
    host, lease = claimed[f"{tid}.web"]
    # the non-leader's device fails under it (infrastructure is in the pool's retry_on)
    assert real_fleet.host(host).report(
        f"{tid}.web", lease, "failed", "infrastructure", "usb gone"
    ) == "ok:queued"  # fmt: skip
    t = real_fleet.client.get(tid)
    assert t.status is TaskStatus.queued and t.attempt == 1
    assert t.roles is not None and {r.status for r in t.roles.values()} == {"queued"}
    assert idle(real_fleet.r, real_fleet.pool) == {"p1", "w1"}  # both devices released
    assert real_fleet.r.zrange(Keys(real_fleet.pool).gangs, 0, -1) == [tid]
    sound(real_fleet)
    # the leader's part ended too: its late report is refused
    ph, pl = claimed[f"{tid}.phone"]
    assert real_fleet.host(ph).report(f"{tid}.phone", pl, "done").startswith("rejected")
    assert s.assign().gangs_assigned == 1
    assert real_fleet.client.get(tid).attempt == 2
    sound(real_fleet)


def test_an_expired_part_ends_every_part(real_fleet: Fleet) -> None:
    two_hosts(real_fleet)
    PoolAdmin(real_fleet.r, real_fleet.pool).set_config("claim_ttl", 1)
    tid = real_fleet.client.submit("slow start", roles=ROLES, max_attempts=1)
    s = TaskScheduler(real_fleet.r, real_fleet.pool)
    s.assign()
    claim_all(real_fleet, "ha")  # the leader claims; the web host never does
    time.sleep(1.2)
    s.assign()  # expiry: the unclaimed web part's lease ends the attempt for both
    t = real_fleet.client.get(tid)
    assert t.status is TaskStatus.failed and t.failure_kind == "lease_expired"
    assert t.roles is not None and {r.status for r in t.roles.values()} == {"failed"}
    assert real_fleet.r.zcard(Keys(real_fleet.pool).leases) == 0
    dev = {d.device_id: d for d in real_fleet.admin.devices()}
    assert dev["p1"].reserved_by is None and dev["w1"].reserved_by is None
    sound(real_fleet)


def test_cancel_ends_a_running_gang_at_once(real_fleet: Fleet) -> None:
    two_hosts(real_fleet)
    tid = real_fleet.client.submit("long", roles=ROLES)
    TaskScheduler(real_fleet.r, real_fleet.pool).assign()
    claim_all(real_fleet, "ha", "hb")
    with pytest.raises(InvalidInput, match="part"):
        real_fleet.client.cancel(f"{tid}.web")
    assert real_fleet.client.cancel(tid) == "cancelled"
    t = real_fleet.client.get(tid)
    assert t.status is TaskStatus.cancelled
    assert t.roles is not None and {r.status for r in t.roles.values()} == {"cancelled"}
    assert idle(real_fleet.r, real_fleet.pool) == {"p1", "w1"}
    assert real_fleet.r.lrange(Keys(real_fleet.pool).host_ctl("ha"), 0, -1)  # told at once
    sound(real_fleet)


def test_a_starving_gang_keeps_devices_for_at_most_gang_hold_seconds(real_fleet: Fleet) -> None:
    admin = PoolAdmin(real_fleet.r, real_fleet.pool)
    admin.set_config("gang_reserve_after", 0)
    admin.set_config("gang_hold_seconds", 1)
    real_fleet.add_host("ha", PHONE, ("p2", "android", ("sim",)))
    real_fleet.add_host("hb", WEB)
    k = Keys(real_fleet.pool)
    s = TaskScheduler(real_fleet.r, real_fleet.pool)
    # the browser is busy with a single task: the gang cannot be placed
    busy = real_fleet.client.submit("browse", driver_type="browser")
    s.assign()
    gid = real_fleet.client.submit("needs both", roles=ROLES)
    singles = [real_fleet.client.submit(f"phone {i}", driver_type="android") for i in range(2)]
    res = s.assign()
    # one phone is kept for the gang; the other serves the oldest single task
    assert res.assigned == 1
    hold = real_fleet.r.hget(k.gang_holds, gid)
    assert hold is not None and hold.split("|")[1] in ("p1", "p2")
    kept = hold.split("|")[1]
    assert kept in idle(real_fleet.r, real_fleet.pool)
    assert real_fleet.client.get(singles[1]).status is TaskStatus.queued
    time.sleep(1.1)
    res = s.assign()  # the hold ran out: the kept phone serves the waiting single task
    assert real_fleet.r.hget(k.gang_holds, gid) is None
    assert real_fleet.client.get(singles[1]).device_id == kept
    # the browser frees up while a phone is idle: the gang is placed at once
    a = next(a for a in real_fleet.host("hb").claim(5) if a.task.id == busy)
    real_fleet.host("hb").report(busy, a.lease_id, "done")
    for sid in singles:
        t = real_fleet.client.get(sid)
        host = real_fleet.host(t.host_id or "")
        for a in host.claim(5):
            host.report(a.task.id, a.lease_id, "done")
    res = s.assign()
    assert res.gangs_assigned == 1
    assert real_fleet.client.get(gid).status is TaskStatus.assigned


def test_single_task_commit_refuses_a_gang_and_its_parts(real_fleet: Fleet) -> None:
    two_hosts(real_fleet)
    tid = real_fleet.client.submit("both", roles=ROLES)
    assert real_fleet.store.commit([(tid, "p1")]) == ["err:task_multi_device"]
    wait_for(lambda: TaskScheduler(real_fleet.r, real_fleet.pool).assign().gangs_assigned, 5)
    assert real_fleet.store.commit([(f"{tid}.phone", "p1")]) == ["err:task_multi_device"]


def test_verify_finds_a_gang_holding_only_some_of_its_devices(real_fleet: Fleet) -> None:
    two_hosts(real_fleet)
    tid = real_fleet.client.submit("both", roles=ROLES)
    TaskScheduler(real_fleet.r, real_fleet.pool).assign()
    sound(real_fleet)
    # break it by hand: the web part loses its lease while the task still runs
    k = Keys(real_fleet.pool)
    real_fleet.r.hset(k.task(f"{tid}.web"), "status", "failed")
    real_fleet.r.zrem(k.leases, f"{tid}.web")
    real_fleet.r.hset(k.device("w1"), mapping={"reserved_by": "", "lease_id": ""})
    res = verify(real_fleet.r, real_fleet.pool)
    assert "gang_partial" in res.kinds(), [str(v) for v in res.violations]


def test_explain_a_waiting_gang_role_by_role(real_fleet: Fleet) -> None:
    from deviceq.ops.explain import explain

    real_fleet.add_host("ha", PHONE)
    tid = real_fleet.client.submit("needs both", roles=ROLES)
    exp = explain(real_fleet.admin, tid)
    assert exp.summary == "no registered device could run role(s) web"
    assert {r.code for r in exp.reasons} >= {"role_devices", "role_unmatched", "gang_policy"}
    assert exp.constraints == {"phone": {"driver_type": "android", "tags": ["sim"]},
                               "web": {"driver_type": "browser", "tags": []}}  # fmt: skip
    # a browser that is busy: the gang waits, and (reserve 0) the scheduler keeps the phone
    real_fleet.add_host("hb", WEB)
    real_fleet.admin.set_config("gang_reserve_after", 0)
    busy = real_fleet.client.submit("browse", driver_type="browser")
    assert real_fleet.store.commit([(busy, "w1")])[0].startswith("ok:")
    TaskScheduler(real_fleet.r, real_fleet.pool).assign()
    exp = explain(real_fleet.admin, tid)
    assert "none idle for: web" in exp.summary, exp.summary
    kept = next(r for r in exp.reasons if r.code == "kept_devices")
    assert kept.detail["devices"] == ["p1"] and "keeps p1" in kept.message
    # placed: the explanation names every role's device
    a = real_fleet.host("hb").claim(1)[0]
    real_fleet.host("hb").report(busy, a.lease_id, "done")
    TaskScheduler(real_fleet.r, real_fleet.pool).assign()
    exp = explain(real_fleet.admin, tid)
    assert exp.status == "assigned" and "phone on p1 (ha), web on w1 (hb)" in exp.summary


def test_cli_role_option_and_task_show(real_fleet: Fleet, cli: Any) -> None:
    run = cli
    for bad in ("phone", "=android", "phone=", "phone=:sim", "bad name=android"):
        res = run("submit", "x", "--role", bad)
        assert res.exit_code == 2 or "invalid role name" in res.output, (bad, res.output)
    res = run("submit", "x", "--role", "a=android", "--role", "a=browser")
    assert res.exit_code == 2 and "given twice" in res.output
    res = run("submit", "x", "--role", "a=android", "--driver-type", "android")
    assert res.exit_code != 0 and "per role" in res.output
    assert real_fleet.client.counts().get("queued", 0) == 0  # nothing was written
    res = run("submit", "both", "--role", "phone=android:sim", "--role", "web=browser", "--json")
    assert res.exit_code == 0, res.output
    shown = json.loads(res.output)
    assert shown["roles"] == {
        "phone": {"driver_type": "android", "tags": ["sim"], "where": [], "device_id": None,
                  "host_id": None, "status": None},
        "web": {"driver_type": "browser", "tags": [], "where": [], "device_id": None,
                "host_id": None, "status": None},
    }  # fmt: skip
    res = run("task", "show", shown["id"])
    assert res.exit_code == 0 and "phone (leader)" in res.output, res.output


def test_metrics_count_a_multi_device_task_once(real_fleet: Fleet) -> None:
    import urllib.request

    from deviceq.services.metrics import parse_metrics, serve_metrics
    from harness import free_port

    two_hosts(real_fleet)
    pool = real_fleet.pool
    server = serve_metrics(real_fleet.admin, free_port(), lambda: True, addr="127.0.0.1")

    def scrape() -> dict[Any, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as r:
            return parse_metrics(r.read().decode())

    def value(samples: dict[Any, float], name: str, **labels: str) -> float:
        return samples.get((name, tuple(sorted({"pool": pool, **labels}.items()))), 0.0)

    try:
        tid = real_fleet.client.submit("both", roles=ROLES, max_attempts=2)
        assert value(scrape(), "deviceq_gangs_waiting") == 1
        s = TaskScheduler(real_fleet.r, real_fleet.pool)
        s.assign()
        claimed = claim_all(real_fleet, "hb", "ha")
        host, lease = claimed[f"{tid}.web"]
        real_fleet.host(host).report(f"{tid}.web", lease, "failed", "infrastructure", "usb")
        s.assign()
        claimed = claim_all(real_fleet, "hb", "ha")
        host, lease = claimed[f"{tid}.phone"]
        real_fleet.host(host).report(f"{tid}.phone", lease, "done")
        assert server.wait_caught_up()
        got = scrape()
        assert value(got, "deviceq_assignments_total") == 2  # two attempts of one task
        assert value(got, "deviceq_dispatches_total") == 2
        assert value(got, "deviceq_completions_total", status="done") == 1
        assert value(got, "deviceq_retries_total", reason="part_ended") == 1
        assert value(got, "deviceq_gangs_waiting") == 0
    finally:
        server.stop()


def test_retry_of_a_cancelled_gang_keeps_its_roles(real_fleet: Fleet) -> None:
    two_hosts(real_fleet)
    tid = real_fleet.client.submit("both", roles=ROLES)
    TaskScheduler(real_fleet.r, real_fleet.pool).assign()
    real_fleet.client.cancel(tid)
    with pytest.raises(InvalidInput, match="part"):
        real_fleet.client.retry(f"{tid}.web")
    new = real_fleet.client.get(real_fleet.client.retry(tid))
    assert new.roles is not None and list(new.roles) == ["phone", "web"]
    assert new.roles["phone"].tags == ("sim",) and new.driver_type is None
    assert new.status is TaskStatus.queued


def test_a_part_handed_back_at_claim_retries_the_whole_gang(real_fleet: Fleet) -> None:
    """The web device is quarantined between the commit and its host's claim: claim hands
    the part back (a hand-back uses no attempt), which ends the other part as well."""
    two_hosts(real_fleet)
    tid = real_fleet.client.submit("both", roles=ROLES)
    s = TaskScheduler(real_fleet.r, real_fleet.pool)
    s.assign()
    claim_all(real_fleet, "ha")
    real_fleet.admin.quarantine("w1")
    assert real_fleet.host("hb").claim(5) == []  # handed back inside the claim
    t = real_fleet.client.get(tid)
    assert t.status is TaskStatus.queued
    assert t.roles is not None and {r.status for r in t.roles.values()} == {"queued"}
    assert idle(real_fleet.r, real_fleet.pool) == {"p1"}  # w1 quarantined, p1 free again
    sound(real_fleet)
    real_fleet.admin.quarantine("w1", False)
    real_fleet.beat()
    assert s.assign().gangs_assigned == 1
    sound(real_fleet)


def test_gangs_are_ordered_by_the_profile_a_higher_priority_first(real_fleet: Fleet) -> None:
    """Gangs wanting the one phone and browser: the default (FIFO) profile places the oldest;
    the priority profile the most urgent, by the priority in its row as of this pass (a
    set-priority after submission counts)."""
    from deviceq.scheduler.gangs import GangPlanner

    two_hosts(real_fleet)
    old = real_fleet.client.submit("old", roles=ROLES)
    urgent = real_fleet.client.submit("urgent", roles=ROLES, priority=5)
    newest = real_fleet.client.submit("newest", roles=ROLES)
    s = TaskScheduler(real_fleet.r, real_fleet.pool)
    assert s.gangs.profile.name == "fifo_match"
    assert s.assign().gangs_assigned == 1
    assert real_fleet.client.get(old).status is TaskStatus.assigned
    real_fleet.client.cancel(old)  # both devices free again
    assert real_fleet.admin.set_priority([newest], 9) == {newest: "ok"}
    s = TaskScheduler(real_fleet.r, real_fleet.pool, strategy="priority_match")
    # (a TaskScheduler does not hand its strategy to the planner yet: given here)
    s.gangs = GangPlanner(real_fleet.r, Keys(real_fleet.pool), "priority_match")
    assert s.assign().gangs_assigned == 1
    assert real_fleet.client.get(newest).status is TaskStatus.assigned
    assert real_fleet.client.get(urgent).status is TaskStatus.queued
    sound(real_fleet)


def test_a_retried_gang_role_avoids_the_device_its_part_failed_on(real_fleet: Fleet) -> None:
    """Two phone roles on three phones: role a's part fails on p1 (host ha; runner_failed, not
    the device's fault); the retry gives role a another device and host, while role b (no
    record of its own) takes p1."""
    for h, d in (("ha", "p1"), ("hb", "p2"), ("hc", "p3")):
        real_fleet.add_host(h, (d, "android", ()))
    tid = real_fleet.client.submit("pair", roles={"a": "android", "b": "android"},
                                   max_attempts=2, retry_on="runner_failed")  # fmt: skip
    s = TaskScheduler(real_fleet.r, real_fleet.pool)
    assert s.assign().gangs_assigned == 1
    t = real_fleet.client.get(tid)
    assert t.roles is not None
    assert (t.roles["a"].device_id, t.roles["b"].device_id) == ("p1", "p2")
    claimed = claim_all(real_fleet, "ha", "hb")
    host, lease = claimed[f"{tid}.a"]
    assert real_fleet.host(host).report(
        f"{tid}.a", lease, "failed", "runner_failed", "exit 1"
    ) == "ok:queued"  # fmt: skip
    assert s.assign().gangs_assigned == 1
    t = real_fleet.client.get(tid)
    assert t.attempt == 2 and t.roles is not None
    assert (t.roles["a"].device_id, t.roles["b"].device_id) == ("p2", "p1")
    sound(real_fleet)


def test_the_planner_reads_a_gangs_tenant_and_caps_its_devices(real_fleet: Fleet) -> None:
    """A submission refuses a tenant on a multi-device task today; a gang row that has one
    (written here by hand) is read with its tenant's cap and held devices: under fair share
    a cap of 4 with 1 held lets one two-role gang in, not the second (without the held one
    both would fit)."""
    from deviceq.scheduler.gangs import GangPlanner
    from deviceq.scheduler.strategies import IdleDevice

    k = Keys(real_fleet.pool)
    gids = [real_fleet.client.submit(f"g{i}", roles=ROLES) for i in range(2)]
    for g in gids:
        real_fleet.r.hset(k.task(g), "tenant", "t")
    real_fleet.admin.set_tenant("t", max_devices=4)
    real_fleet.r.hset(k.tenant_held, "t", 1)
    devices = [IdleDevice(f"p{i}", "ha", "android", frozenset({"sim"})) for i in range(2)] + [
        IdleDevice(f"w{i}", "hb", "browser", frozenset()) for i in range(2)
    ]
    plan = GangPlanner(real_fleet.r, k, "fair_share").plan(gids, devices, 1_000, 60_000, 0)
    assert plan.place == [(gids[0], ["p0", "w0"])] and not plan.kept
    plan = GangPlanner(real_fleet.r, k, "fifo_match").plan(gids, devices, 1_000, 60_000, 0)
    assert [g for g, _ in plan.place] == gids  # (a profile without the cap)
