"""The pool setting ``max_tasks_per_host`` on the real Redis server: ``host_held`` counts the
leases on each host's devices (assign and gang_assign count up; report, expiry, cancel, a
hand-back and a removed host count down), assign.lua and gang_assign.lua refuse ``host_cap``
past the setting, the scripts clamp a raw value, and `verify` checks the count."""

from __future__ import annotations

import time
from typing import Any

import pytest

from conftest import Fleet
from deviceq import ConfigError, TaskStatus
from deviceq.core.keys import Keys
from deviceq.host.link import Report
from deviceq.ops.explain import explain
from deviceq.ops.verify import verify
from deviceq.scheduler.limit_load import read_limits
from deviceq.scheduler.task_scheduler import TaskScheduler
from invariants import check_pool


def phones(*ids: str) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    return tuple((d, "android", ()) for d in ids)


def held(fleet: Fleet) -> dict[str, int]:
    return {h: int(n) for h, n in fleet.r.hgetall(Keys(fleet.pool).host_held).items()}


def sound(fleet: Fleet) -> None:
    """The test model's invariants (host_held included) and `deviceq verify` hold."""
    check_pool(fleet.r, Keys(fleet.pool))
    res = verify(fleet.r, fleet.pool)
    assert res.ok, [str(v) for v in res.violations]


def submit(fleet: Fleet, n: int, **kw: Any) -> list[str]:
    return [fleet.client.submit(f"g{i}", driver_type="android", **kw) for i in range(n)]


# -- the setting -----------------------------------------------------------------------------------
def test_the_setting_is_validated_and_defaults_to_no_limit(real_fleet: Fleet) -> None:
    admin = real_fleet.admin
    assert admin.get_config("max_tasks_per_host") == {"max_tasks_per_host": 0}
    assert admin.set_config("max_tasks_per_host", "2") == 2
    assert admin.get_config("max_tasks_per_host") == {"max_tasks_per_host": 2}
    for bad in ("-1", "100001", "1.5", "many"):
        with pytest.raises(ConfigError, match="max_tasks_per_host"):
            admin.set_config("max_tasks_per_host", bad)
    assert admin.get_config("max_tasks_per_host") == {"max_tasks_per_host": 2}


def test_config_set_on_the_command_line(cli: Any) -> None:
    res = cli("config", "set", "max_tasks_per_host", "2")
    assert res.exit_code == 0, res.output
    assert "max_tasks_per_host" in res.output and "2" in res.output
    res = cli("config", "set", "max_tasks_per_host", "-3")
    assert res.exit_code != 0
    res = cli("config", "get", "max_tasks_per_host")
    assert res.exit_code == 0 and "2" in res.output, res.output


# -- assign ----------------------------------------------------------------------------------------
def test_without_the_setting_every_device_of_a_host_is_used(real_fleet: Fleet) -> None:
    real_fleet.add_host("h1", *phones("d1", "d2", "d3"))
    ids = submit(real_fleet, 3)
    out = real_fleet.store.commit(list(zip(ids, ("d1", "d2", "d3"), strict=True)))
    assert all(o.startswith("ok:") for o in out)
    assert held(real_fleet) == {"h1": 3}
    sound(real_fleet)


def test_assign_refuses_a_pair_past_the_cap(real_fleet: Fleet) -> None:
    real_fleet.admin.set_config("max_tasks_per_host", 2)
    real_fleet.add_host("h1", *phones("d1", "d2", "d3"))
    real_fleet.add_host("h2", *phones("e1"))
    ids = submit(real_fleet, 4)
    out = real_fleet.store.commit([(ids[0], "d1"), (ids[1], "d2"), (ids[2], "d3")])
    assert [o[:3] for o in out[:2]] == ["ok:", "ok:"] and out[2] == "err:host_cap"
    assert real_fleet.client.get(ids[2]).status is TaskStatus.queued
    assert real_fleet.admin.device("d3").reserved_by is None
    # another host is not concerned
    assert real_fleet.store.commit([(ids[2], "e1")])[0].startswith("ok:")
    assert held(real_fleet) == {"h1": 2, "h2": 1}
    loads = read_limits(
        real_fleet.r, Keys(real_fleet.pool), {"max_tasks_per_host": "2"}, ["h1", "h2", "h3"], ()
    )
    assert {h: loads["host"].held.get(h, 0) for h in ("h1", "h2", "h3")} == {
        "h1": 2,
        "h2": 1,
        "h3": 0,
    }
    # the manual dispatch goes through the same commit
    with pytest.raises(Exception, match="host_cap"):
        real_fleet.admin.dispatch(ids[3], "d3")
    sound(real_fleet)


def test_lowering_the_cap_below_what_a_host_holds_refuses_more(real_fleet: Fleet) -> None:
    real_fleet.add_host("h1", *phones("d1", "d2", "d3"))
    ids = submit(real_fleet, 3)
    real_fleet.store.commit([(ids[0], "d1"), (ids[1], "d2")])
    real_fleet.admin.set_config("max_tasks_per_host", 1)
    assert real_fleet.store.commit([(ids[2], "d3")]) == ["err:host_cap"]
    assert held(real_fleet) == {"h1": 2}


def test_the_scripts_clamp_a_raw_value(real_fleet: Fleet) -> None:
    """A value written around the validation: garbage is the default (no limit), a negative
    one 0, a huge one the upper bound."""
    k = Keys(real_fleet.pool)
    real_fleet.add_host("h1", *phones("d1", "d2"))
    ids = submit(real_fleet, 2)
    for raw in ("abc", "-4"):
        real_fleet.r.hset(k.config, "max_tasks_per_host", raw)
        assert real_fleet.store.commit([(ids[0], "d1")])[0].startswith("ok:")
        assert real_fleet.client.cancel(ids[0]) == "cancelled"
        ids[0] = submit(real_fleet, 1)[0]
    real_fleet.r.hset(k.config, "max_tasks_per_host", "1.9")  # (floored: 1)
    out = real_fleet.store.commit([(ids[0], "d1"), (ids[1], "d2")])
    assert out[0].startswith("ok:") and out[1] == "err:host_cap"
    sound(real_fleet)


# -- every end of a lease counts down --------------------------------------------------------------
def test_every_end_of_a_lease_frees_its_place(real_fleet: Fleet) -> None:
    """With a cap of 1, each way a lease ends (done, failed and retried, failed for good,
    handed back, cancelled while assigned, cancelled while running, expired) empties host_held
    and lets the next task onto the host."""
    real_fleet.admin.set_config("max_tasks_per_host", 1)
    h = real_fleet.add_host("h1", *phones("d1", "d2"))
    k = Keys(real_fleet.pool)

    def place() -> tuple[str, str]:
        """A new task onto h1 (the other device refused: the host is full)."""
        tid = submit(real_fleet, 1)[0]
        out = real_fleet.store.commit([(tid, "d1"), (tid, "d2")])
        assert out[0].startswith("ok:"), out
        assert held(real_fleet) == {"h1": 1}
        other = submit(real_fleet, 1)[0]
        assert real_fleet.store.commit([(other, "d2")]) == ["err:host_cap"]
        real_fleet.client.cancel(other)
        return tid, out[0][3:]

    def freed() -> None:
        assert held(real_fleet) == {}
        sound(real_fleet)

    tid, lease = place()
    h.claim(5)
    assert h.report(tid, lease, "done", None, "ok") == "ok:done"
    freed()
    tid, lease = place()
    h.claim(5)
    assert h.report(tid, lease, "failed", "infrastructure", "usb") == "ok:queued"  # a retry
    freed()
    real_fleet.beat()  # (no device is held after the failure; the retry is queued again)
    real_fleet.client.cancel(tid)
    tid, lease = place()
    h.claim(5)
    assert h.report(tid, lease, "failed", "runner_failed", "exit 1") == "ok:failed"
    freed()
    tid, lease = place()
    h.claim(5)
    assert h.release(tid, lease).startswith("ok:")
    freed()
    real_fleet.client.cancel(tid)
    real_fleet.beat()  # (the hand-back holds the device until the next heartbeat)
    tid, lease = place()
    assert real_fleet.client.cancel(tid) == "cancelled"  # assigned: ends at once
    freed()
    tid, lease = place()
    h.claim(5)
    assert real_fleet.client.cancel(tid) == "requested"
    assert held(real_fleet) == {"h1": 1}  # still running
    assert h.report(tid, lease, "cancelled", None, "stopped") == "ok:cancelled"
    freed()
    real_fleet.admin.set_config("claim_ttl", 1)
    tid, lease = place()
    time.sleep(1.2)
    assert real_fleet.store.expire()["requeued"] == 1
    freed()
    assert not real_fleet.r.exists(k.host_held)


def test_one_report_of_many_outcomes_counts_each_lease_down(real_fleet: Fleet) -> None:
    """report.lua writes host_held once per call: a call ending leases by every outcome
    (done, failed and retried, failed for good, handed back) and refusing one (an unknown
    lease) counts exactly those it ended down; the host's other leases stay counted."""
    h = real_fleet.add_host("h1", *phones("d1", "d2", "d3", "d4", "d5"))
    ids = submit(real_fleet, 5)
    out = real_fleet.store.commit(list(zip(ids, ("d1", "d2", "d3", "d4", "d5"), strict=True)))
    leases = [o[3:] for o in out]
    assert held(real_fleet) == {"h1": 5}
    h.claim(5)
    got = h.report_many([
        Report(ids[0], leases[0], "done", payload="ok"),
        Report(ids[1], leases[1], "failed", "infrastructure", "usb"),
        Report(ids[2], leases[2], "failed", "runner_failed", "exit 1"),
        Report(ids[3], leases[3], "released"),
        Report(ids[4], ids[4] + "-a9", "done", payload="not this lease"),
    ])  # fmt: skip
    assert [g.split(":")[0] for g in got] == ["ok", "ok", "ok", "ok", "rejected"], got
    assert held(real_fleet) == {"h1": 1}
    sound(real_fleet)
    assert h.report_many([Report(ids[4], leases[4], "done", payload="ok")]) == ["ok:done"]
    assert held(real_fleet) == {}
    sound(real_fleet)


def test_a_removed_host_leaves_no_count(real_fleet: Fleet) -> None:
    real_fleet.add_host("h1", *phones("d1", "d2"))
    ids = submit(real_fleet, 2)
    real_fleet.store.commit([(ids[0], "d1"), (ids[1], "d2")])
    assert held(real_fleet) == {"h1": 2}
    real_fleet.admin.remove_device("d2", force=True)
    assert held(real_fleet) == {"h1": 1}
    sound(real_fleet)
    real_fleet.admin.remove_host("h1", force=True)
    assert held(real_fleet) == {}
    sound(real_fleet)


# -- multi-device tasks ----------------------------------------------------------------------------
TWO_PHONES = {"a": "android", "b": "android"}


def test_a_gang_counts_one_per_device_on_the_host(real_fleet: Fleet) -> None:
    real_fleet.admin.set_config("max_tasks_per_host", 2)
    real_fleet.add_host("h1", *phones("p1", "p2", "p3"))
    real_fleet.add_host("h2", *phones("q1"))
    gid = real_fleet.client.submit("two phones", roles=TWO_PHONES)
    single = submit(real_fleet, 1)[0]
    assert real_fleet.store.commit([(single, "p3")])[0].startswith("ok:")
    # h1 holds 1: two more would be 3
    assert real_fleet.store.commit_gang(gid, ["p1", "p2"]) == "err:host_cap@b"
    assert real_fleet.client.get(gid).status is TaskStatus.queued
    assert held(real_fleet) == {"h1": 1}
    # one device on each host fits
    assert real_fleet.store.commit_gang(gid, ["p1", "q1"]) == "ok:1"
    assert held(real_fleet) == {"h1": 2, "h2": 1}
    sound(real_fleet)
    # the gang's end frees both of its places
    assert real_fleet.client.cancel(gid) == "cancelled"
    assert held(real_fleet) == {"h1": 1}
    sound(real_fleet)


def test_a_gang_on_one_host_and_its_end_by_one_part(real_fleet: Fleet) -> None:
    real_fleet.admin.set_config("max_tasks_per_host", 2)
    h = real_fleet.add_host("h1", *phones("p1", "p2", "p3"))
    gid = real_fleet.client.submit("two phones", roles=TWO_PHONES, max_attempts=2)
    assert real_fleet.store.commit_gang(gid, ["p1", "p2"]) == "ok:1"
    assert held(real_fleet) == {"h1": 2}
    assert real_fleet.store.commit([(submit(real_fleet, 1)[0], "p3")]) == ["err:host_cap"]
    claimed = {a.task.id: a.lease_id for a in h.claim(5)}
    # one part fails: the whole gang is retried, both places freed
    assert h.report(f"{gid}.b", claimed[f"{gid}.b"], "failed", "infrastructure", "x") == (
        "ok:queued"
    )
    assert held(real_fleet) == {}
    sound(real_fleet)
    real_fleet.beat()
    # placed again by the scheduler, then done by its leader
    assert TaskScheduler(real_fleet.r, real_fleet.pool).assign().gangs_assigned == 1
    assert held(real_fleet) == {"h1": 2}
    claimed = {a.task.id: a.lease_id for a in h.claim(5)}
    assert h.report(f"{gid}.a", claimed[f"{gid}.a"], "done", None, "ok") == "ok:done"
    assert real_fleet.client.get(gid).status is TaskStatus.done
    assert held(real_fleet) == {}
    sound(real_fleet)


def test_an_expired_gang_part_frees_every_place(real_fleet: Fleet) -> None:
    real_fleet.admin.set_config("claim_ttl", 1)
    real_fleet.add_host("h1", *phones("p1"))
    real_fleet.add_host("h2", *phones("q1"))
    gid = real_fleet.client.submit("two phones", roles=TWO_PHONES, max_attempts=1)
    assert real_fleet.store.commit_gang(gid, ["p1", "q1"]) == "ok:1"
    assert held(real_fleet) == {"h1": 1, "h2": 1}
    time.sleep(1.2)
    real_fleet.store.expire()
    assert real_fleet.client.get(gid).status is TaskStatus.failed
    assert held(real_fleet) == {}
    sound(real_fleet)


# -- the scheduler and verify ----------------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["fifo_match", "priority_match", "lru_device", "fair_share"])
def test_the_scheduler_proposes_no_pair_past_the_cap(real_fleet: Fleet, strategy: str) -> None:
    """The profile's host cap reads host_held and the setting: one pass fills each host to
    the cap and proposes nothing the commit refuses; a changed setting applies next pass."""
    real_fleet.admin.set_config("max_tasks_per_host", 2)
    real_fleet.add_host("h1", *phones("d1", "d2", "d3"))
    real_fleet.add_host("h2", *phones("e1", "e2", "e3"))
    ids = submit(real_fleet, 7)
    assert real_fleet.store.commit([(ids[0], "d1")])[0].startswith("ok:")  # h1 holds 1
    s = TaskScheduler(real_fleet.r, real_fleet.pool, strategy=strategy)
    res = s.assign()
    assert res.assigned == 3 and not res.rejected, res.rejected
    assert held(real_fleet) == {"h1": 2, "h2": 2}
    assert not s.assign().rejected
    real_fleet.admin.set_config("max_tasks_per_host", 3)
    res = s.assign()
    assert res.assigned == 2 and not res.rejected, res.rejected
    assert held(real_fleet) == {"h1": 3, "h2": 3}
    sound(real_fleet)


def test_the_scheduler_places_gangs_within_the_cap(real_fleet: Fleet) -> None:
    real_fleet.admin.set_config("max_tasks_per_host", 1)
    real_fleet.add_host("ha", *phones("p1"))
    hb = real_fleet.add_host("hb", *phones("q1", "q2"))
    real_fleet.add_host("hc", *phones("r1"))
    g1 = real_fleet.client.submit("first", roles=TWO_PHONES)
    g2 = real_fleet.client.submit("second", roles=TWO_PHONES)
    s = TaskScheduler(real_fleet.r, real_fleet.pool)
    res = s.assign()
    assert res.gangs_assigned == 1 and not res.rejected, res.rejected
    t = real_fleet.client.get(g1)
    assert t.roles is not None
    assert sorted(r.host_id or "" for r in t.roles.values()) == ["ha", "hb"]
    assert held(real_fleet) == {"ha": 1, "hb": 1}
    assert real_fleet.client.get(g2).status is TaskStatus.queued  # hc alone is one device
    claimed = {a.task.id: a.lease_id for a in hb.claim(5)}
    part = next(iter(claimed))
    assert hb.report(part, claimed[part], "failed", "runner_failed", "x") == "ok:failed"
    real_fleet.beat()
    res = s.assign()
    assert res.gangs_assigned == 1 and not res.rejected, res.rejected
    assert real_fleet.client.get(g2).status is TaskStatus.assigned
    assert max(held(real_fleet).values()) == 1
    sound(real_fleet)


def test_verify_finds_a_wrong_host_count(real_fleet: Fleet) -> None:
    real_fleet.add_host("h1", *phones("d1"))
    tid = submit(real_fleet, 1)[0]
    real_fleet.store.commit([(tid, "d1")])
    sound(real_fleet)
    k = Keys(real_fleet.pool)
    for bad in ({"h1": "2"}, {"h1": "0"}, {"h9": "1", "h1": "1"}):
        real_fleet.r.delete(k.host_held)
        real_fleet.r.hset(k.host_held, mapping=bad)
        res = verify(real_fleet.r, real_fleet.pool)
        found = [v for v in res.violations if v.kind == "host_held"]
        assert len(found) == 1 and found[0].key == "host_held", [str(v) for v in res.violations]
    real_fleet.r.delete(k.host_held)
    real_fleet.r.hset(k.host_held, "h1", 1)
    sound(real_fleet)


def test_explain_names_the_full_hosts(real_fleet: Fleet) -> None:
    real_fleet.admin.set_config("max_tasks_per_host", 1)
    real_fleet.add_host("h1", *phones("d1", "d2"))
    real_fleet.add_host("h2", *phones("e1"))
    ids = submit(real_fleet, 3)
    real_fleet.store.commit([(ids[0], "d1"), (ids[1], "e1")])
    exp = explain(real_fleet.admin, ids[2])
    first = exp.reasons[0]
    assert first.code == "host_cap" and first.count == 1, exp.reasons
    assert first.detail == {"max_tasks_per_host": 1, "hosts": {"h1": 1}}
    assert "h1" in first.message and "max_tasks_per_host (1)" in first.message
    # no cap: no such reason
    real_fleet.admin.set_config("max_tasks_per_host", 0)
    exp = explain(real_fleet.admin, ids[2])
    assert "host_cap" not in [r.code for r in exp.reasons]


def test_metrics_give_the_leases_per_host_and_the_cap(real_fleet: Fleet) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from deviceq.services.metrics import PoolCollector, parse_metrics

    real_fleet.admin.set_config("max_tasks_per_host", 2)
    real_fleet.add_host("h1", *phones("d1", "d2"))
    real_fleet.add_host("h2", *phones("e1"))
    ids = submit(real_fleet, 2)
    real_fleet.store.commit([(ids[0], "d1"), (ids[1], "d2")])
    reg = CollectorRegistry()
    reg.register(PoolCollector(real_fleet.admin, lambda: True))
    got = parse_metrics(generate_latest(reg).decode())
    per_host = {k: v for k, v in got.items() if k[0] == "deviceq_host_held"}
    labels = (("host", "h1"), ("max_tasks_per_host", "2"), ("pool", real_fleet.pool))
    assert per_host == {("deviceq_host_held", labels): 2}
