"""The pool setting ``prefer``: among the devices a task may take, the scheduler gives it the
one with the highest (max:) or lowest (min:) attribute first, or the least used in the last
24 h, in every built-in strategy."""

from __future__ import annotations

import pytest

from conftest import Fleet
from deviceq import TaskScheduler
from deviceq.core.errors import ConfigError

STRATEGIES = ["fifo_match", "priority_match", "lru_device", "fair_share"]


@pytest.fixture
def phones(real_fleet: Fleet) -> Fleet:
    f = real_fleet
    f.add_host("h1", ("a", "android", ()), ("b", "android", ()), ("c", "android", ()),
               ("d", "android", ()))  # fmt: skip
    for did, battery, temp in (("a", 40, 30.5), ("b", 95, 41), ("c", 70, 28), ("d", 10, 35)):
        f.admin.set_attributes(did, {"battery": battery, "temperature": temp})
    return f


def first_pick(f: Fleet, strategy: str) -> str:
    tid = f.client.submit("x", driver_type="android")
    TaskScheduler(f.admin, strategy=strategy).assign()
    return f.client.get(tid).device_id or ""


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_max_battery_picks_the_fullest_in_every_strategy(phones: Fleet, strategy: str) -> None:
    phones.admin.set_config("prefer", "max:battery")
    assert first_pick(phones, strategy) == "b"
    assert first_pick(phones, strategy) == "c"  # (b is taken now)


def test_min_temperature_and_where_together(phones: Fleet) -> None:
    f = phones
    f.admin.set_config("prefer", "min:temperature")
    assert first_pick(f, "fifo_match") == "c"
    tid = f.client.submit("y", where=["battery>=30"])
    TaskScheduler(f.admin).assign()
    assert f.client.get(tid).device_id == "a"  # the coolest of those with battery>=30 left


def test_least_used_spreads_runs(phones: Fleet) -> None:
    f = phones
    h = f.host("h1")
    for did in ("a", "b", "c"):  # one run each on a, b, c: d has none
        tid = f.client.submit("x", driver_type="android")
        assert f.store.commit([(tid, did)])[0].startswith("ok:")
        (a,) = h.claim(1)
        h.report(tid, a.lease_id, "done")
    f.admin.set_config("prefer", "least_used")
    assert first_pick(f, "fifo_match") == "d"


def test_a_bad_prefer_is_refused(phones: Fleet) -> None:
    for bad in ("max:", "biggest:battery", "max:Battery", "least"):
        with pytest.raises(ConfigError):
            phones.admin.set_config("prefer", bad)
