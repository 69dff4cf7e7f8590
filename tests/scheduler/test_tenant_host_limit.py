"""The declared limit ``tenant_host`` (pool setting ``max_tasks_per_tenant_per_host``) on the real
Redis server: ``tenant_host_held`` counts a tenant's leases on each host, assign.lua refuses
``tenant_host_cap`` past the setting (other tenants, other hosts and tasks without a tenant are
not concerned), every end of a lease counts down, the scheduler proposes no pair past it,
explain names it, the metrics give it, ``deviceq limit list`` shows it and verify checks it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import Fleet
from deviceq import ConfigError, TaskStatus
from deviceq.core.keys import Keys
from deviceq.core.limits import BY_NAME, LIMITS
from deviceq.ops.explain import explain
from deviceq.ops.limits import limit_summary
from deviceq.ops.verify import verify
from deviceq.scheduler.task_scheduler import TaskScheduler
from invariants import check_pool

SETTING = "max_tasks_per_tenant_per_host"


def phones(*ids: str) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    return tuple((d, "android", ()) for d in ids)


def counts(fleet: Fleet) -> dict[str, int]:
    raw = fleet.r.hgetall(Keys(fleet.pool).counter("tenant_host_held"))
    return {k: int(v) for k, v in raw.items()}


def sound(fleet: Fleet) -> None:
    check_pool(fleet.r, Keys(fleet.pool))
    res = verify(fleet.r, fleet.pool)
    assert res.ok, [str(v) for v in res.violations]


def submit(fleet: Fleet, n: int, tenant: str | None) -> list[str]:
    return [fleet.client.submit(f"g{i}", driver_type="android", tenant=tenant) for i in range(n)]


def test_the_declaration() -> None:
    lim = BY_NAME["tenant_host"]
    assert (lim.scope, lim.setting, lim.counter) == (
        ("tenant", "host"),
        SETTING,
        "tenant_host_held",
    )
    assert lim.reason == "tenant_host_cap"
    assert lim.field(host="h1", tenant="a") == "a|h1" and lim.field(host="h1", tenant="") is None
    assert lim.values("a|h1") == {"tenant": "a", "host": "h1"}
    assert [x.name for x in LIMITS] == ["tenant", "host", "tenant_host"]


def test_the_setting_is_validated_and_defaults_to_no_limit(real_fleet: Fleet) -> None:
    admin = real_fleet.admin
    assert admin.get_config(SETTING) == {SETTING: 0}
    assert admin.set_config(SETTING, "2") == 2
    for bad in ("-1", "100001", "1.5", "many"):
        with pytest.raises(ConfigError, match=SETTING):
            admin.set_config(SETTING, bad)
    assert admin.get_config(SETTING) == {SETTING: 2}


def test_assign_refuses_a_tenants_pair_past_the_limit_on_that_host(real_fleet: Fleet) -> None:
    real_fleet.admin.set_config(SETTING, 1)
    h1 = real_fleet.add_host("h1", *phones("d1", "d2", "d3", "d4"))
    real_fleet.add_host("h2", *phones("e1"))
    a = submit(real_fleet, 3, "a")
    b = submit(real_fleet, 1, "b")
    plain = submit(real_fleet, 1, None)
    out = real_fleet.store.commit([(a[0], "d1"), (a[1], "d2"), (b[0], "d3"), (plain[0], "d4")])
    assert [o[:3] for o in out] == ["ok:", "err", "ok:", "ok:"] and out[1] == "err:tenant_host_cap"
    assert real_fleet.client.get(a[1]).status is TaskStatus.queued
    assert real_fleet.admin.device("d2").reserved_by is None
    # the same tenant on another host is not concerned
    assert real_fleet.store.commit([(a[1], "e1")])[0].startswith("ok:")
    assert counts(real_fleet) == {"a|h1": 1, "a|h2": 1, "b|h1": 1}
    with pytest.raises(Exception, match="tenant_host_cap"):
        real_fleet.admin.dispatch(a[2], "d2")
    sound(real_fleet)
    # the end of a lease counts down: a's lease on h1 ends, a may take h1 again
    claimed = {x.task.id: x.lease_id for x in h1.claim(5)}
    assert h1.report(a[0], claimed[a[0]], "done") == "ok:done"
    assert counts(real_fleet) == {"a|h2": 1, "b|h1": 1}
    assert real_fleet.store.commit([(a[2], "d1")])[0].startswith("ok:")
    real_fleet.client.cancel(a[2])  # (assigned, not claimed: its lease ends at once)
    assert counts(real_fleet) == {"a|h2": 1, "b|h1": 1}
    sound(real_fleet)


def test_one_call_refuses_the_second_pair_of_its_own(real_fleet: Fleet) -> None:
    """The counts a commit call adds are seen by its later pairs (they are written once per
    field, at the end)."""
    real_fleet.admin.set_config(SETTING, 2)
    real_fleet.add_host("h1", *phones("d1", "d2", "d3"))
    a = submit(real_fleet, 3, "a")
    out = real_fleet.store.commit(list(zip(a, ("d1", "d2", "d3"), strict=True)))
    assert out[2] == "err:tenant_host_cap" and all(o.startswith("ok:") for o in out[:2])
    assert counts(real_fleet) == {"a|h1": 2}
    sound(real_fleet)


@pytest.mark.parametrize("strategy", ["fifo_match", "priority_match", "lru_device", "fair_share"])
def test_the_scheduler_proposes_no_pair_past_the_limit(real_fleet: Fleet, strategy: str) -> None:
    real_fleet.admin.set_config(SETTING, 1)
    real_fleet.add_host("h1", *phones("d1", "d2", "d3"))
    real_fleet.add_host("h2", *phones("e1", "e2"))
    submit(real_fleet, 4, "a")
    submit(real_fleet, 1, "b")
    s = TaskScheduler(real_fleet.r, real_fleet.pool, strategy=strategy)
    res = s.assign()
    assert res.assigned == 3 and not res.rejected, res.rejected
    assert counts(real_fleet) == {"a|h1": 1, "a|h2": 1, "b|h1": 1} or counts(real_fleet) == {
        "a|h1": 1,
        "a|h2": 1,
        "b|h2": 1,
    }
    assert not s.assign().rejected
    real_fleet.admin.set_config(SETTING, 0)
    assert s.assign().assigned == 2
    sound(real_fleet)


def test_explain_metrics_and_limit_list(real_fleet: Fleet, cli: Any) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from deviceq.services.metrics import PoolCollector, parse_metrics

    real_fleet.admin.set_config(SETTING, 1)
    real_fleet.add_host("h1", *phones("d1", "d2"))
    a = submit(real_fleet, 2, "a")
    assert real_fleet.store.commit([(a[0], "d1")])[0].startswith("ok:")
    exp = explain(real_fleet.admin, a[1])
    first = exp.reasons[0]
    assert first.code == "tenant_host_cap" and first.count == 1, exp.reasons
    assert first.detail == {SETTING: 1, "hosts": {"h1": 1}}
    assert f"{SETTING} (1)" in first.message and "h1" in first.message
    reg = CollectorRegistry()
    reg.register(PoolCollector(real_fleet.admin, lambda: True))
    got = parse_metrics(generate_latest(reg).decode())
    labels = (("host", "h1"), (SETTING, "1"), ("pool", real_fleet.pool), ("tenant", "a"))
    assert {k: v for k, v in got.items() if k[0] == "deviceq_tenant_host_held"} == {
        ("deviceq_tenant_host_held", labels): 1
    }
    rows = {r["name"]: r for r in limit_summary(real_fleet.admin)}
    assert list(rows) == ["tenant", "host", "tenant_host"]
    th = rows["tenant_host"]
    assert (th["setting"], th["bound"], th["held"]) == (SETTING, 1, 1)
    assert th["highest"] == [{"key": {"tenant": "a", "host": "h1"}, "held": 1, "bound": 1}]
    assert rows["host"]["highest"] == [{"key": {"host": "h1"}, "held": 1, "bound": 0}]
    assert rows["tenant"]["bound"] is None and rows["tenant"]["setting"] is None
    res = cli("limit", "list", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == list(rows.values())
    res = cli("limit", "list")
    assert res.exit_code == 0, res.output
    assert f"tenant_host: by tenant x host; bound 1 ({SETTING}); 1 lease(s) counted" in res.output
    assert "  tenant a, host h1: 1 of 1" in res.output
