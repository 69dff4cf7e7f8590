"""The idle sets per device class (``idle:c:CLASS``, lua/lib/idle.lua) stay in step with the
``idle`` zset through every transition that adds or removes an idle device, and the scheduler
reads only the classes its queued buckets can use, as deep as the pass can place: a device
that alone matches a task is seen among tens of thousands of other idle devices, and a pass
with nothing queued reads no idle device. Real Redis throughout."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from deviceq import DeviceReport, HostClient, Report, TaskScheduler
from deviceq.core.keys import Keys, class_id
from deviceq.core.models import DeviceState
from deviceq.scheduler.idle_classes import FACTOR, SLACK


def class_sets(r: redis.Redis, keys: Keys) -> dict[str, dict[str, float]]:
    """Every non-empty class idle set of the pool: key -> {device: score}."""
    out = {}
    for key in r.scan_iter(match=keys.idle_class("*"), count=1000):
        out[str(key)] = dict(r.zrange(key, 0, -1, withscores=True))
    return out


def assert_in_step(r: redis.Redis, keys: Keys) -> set[str]:
    """The class sets partition ``idle`` exactly (same members, same scores), each device
    in the set of its own profile's class. Returns the idle devices."""
    idle = dict(r.zrange(keys.idle, 0, -1, withscores=True))
    seen: dict[str, float] = {}
    for key, members in class_sets(r, keys).items():
        for did, score in members.items():
            drv, tags = r.hmget(keys.device(did), "driver_type", "tags")
            assert key == keys.idle_class(class_id(f"{drv}|{tags or ''}")), did
            assert did not in seen
            seen[did] = score
    assert seen == idle
    return set(idle)


def test_class_sets_follow_every_transition(real_fleet: Any) -> None:
    f = real_fleet
    r, keys = f.r, f.admin.keys
    h = f.add_host(
        "h1", ("a1", "android", ("x",)), ("a2", "android", ("x", "y")), ("i1", "ios", ())
    )
    assert assert_in_step(r, keys) == {"a1", "a2", "i1"}
    assert len(class_sets(r, keys)) == 3

    sched = TaskScheduler(f.admin)
    tid = f.client.submit("g", driver_type="android", tags=["y"])
    assert [a[1] for a in sched.assign().assignments] == ["a2"]  # assign.lua
    assert assert_in_step(r, keys) == {"a1", "i1"}
    (got,) = h.claim(5)
    h.report_many([Report(tid, got.lease_id, "done")])  # report.lua: back among the idle
    assert assert_in_step(r, keys) == {"a1", "a2", "i1"}

    f.admin.quarantine("a1")  # device_quarantine.lua
    assert assert_in_step(r, keys) == {"a2", "i1"}
    f.admin.quarantine("a1", False)
    assert assert_in_step(r, keys) == {"a1", "a2", "i1"}

    f.admin.reserve("i1", 60_000, "alice")  # device_reserve.lua
    assert assert_in_step(r, keys) == {"a1", "a2"}
    f.admin.release("i1")  # lib/bookings.lua
    assert assert_in_step(r, keys) == {"a1", "a2", "i1"}

    assert h.health_begin("a2")  # device_health.lua
    assert assert_in_step(r, keys) == {"a1", "i1"}
    h.health_end("a2", "healthy")
    assert assert_in_step(r, keys) == {"a1", "a2", "i1"}

    # heartbeat.lua: busy, a changed profile (another class), a device left out (offline)
    h.heartbeat(
        [
            DeviceReport("a1", "android", ("x", "z")),
            DeviceReport("a2", "android", ("x", "y"), DeviceState.busy, "flashing"),
        ]
    )
    assert assert_in_step(r, keys) == {"a1"}
    assert set(class_sets(r, keys)) == {keys.idle_class(class_id("android|x,z"))}
    f.beat("h1")
    assert assert_in_step(r, keys) == {"a1", "a2", "i1"}

    f.admin.remove_device("i1", force=True)  # device_remove.lua (lib/removal.lua)
    assert assert_in_step(r, keys) == {"a1", "a2"}
    f.admin.remove_host("h1", force=True)  # host_remove.lua
    assert assert_in_step(r, keys) == set()
    assert class_sets(r, keys) == {}


def test_gang_and_expiry_keep_class_sets_in_step(real_fleet: Any) -> None:
    f = real_fleet
    r, keys = f.r, f.admin.keys
    f.admin.set_config("claim_ttl", 1)
    f.add_host("h1", ("a1", "android", ()), ("a2", "android", ()), ("a3", "android", ("x",)))
    f.client.submit("g", roles={"one": "android", "two": "android:x"})
    sched = TaskScheduler(f.admin)
    assert sched.assign().gangs_assigned == 1  # gang_assign.lua
    assert len(assert_in_step(r, keys)) == 1
    f.client.submit("solo")
    assert sched.assign().assigned == 1
    assert assert_in_step(r, keys) == set()
    time.sleep(1.2)
    assert sum(sched.expire().values()) > 0  # expire.lua: the leases lapse
    assert_in_step(r, keys)
    f.beat("h1")  # the host proves itself alive: they come back
    assert assert_in_step(r, keys) == {"a1", "a2", "a3"}


def register(r: redis.Redis, f: Any, host_id: str, devices: list[DeviceReport]) -> HostClient:
    token = f.admin.add_host(host_id)
    h = HostClient(r, f.pool, host_id, token)
    h.heartbeat(devices)  # (at most 10,000 devices per heartbeat)
    return h


def test_needle_among_thirty_thousand_idle_devices_is_assigned_in_one_pass(
    real_fleet: Any,
) -> None:
    f = real_fleet
    r, keys = f.r, f.admin.keys
    for n in range(3):
        hay = [DeviceReport(f"hay{n}-{i}", "android", ("common",)) for i in range(10_000)]
        register(r, f, f"hay{n}", hay)
    register(r, f, "needle-host", [DeviceReport("needle", "android", ("needle",))])
    assert r.zcard(keys.idle) == 30_001  # the needle is the newest idle device of all
    sched = TaskScheduler(f.admin)
    tid = f.client.submit("find it", driver_type="android", tags=["needle"])
    res = sched.assign()
    assert [(t, d) for t, d, _ in res.assignments] == [(tid, "needle")]
    assert res.idle_devices == 1  # the haystack's class was not read at all
    # a task any device can take reads only as deep as one placement needs
    f.client.submit("any", driver_type="android")
    res = sched.assign()
    assert res.assigned == 1 and res.idle_devices < 100


def test_classes_read_deeper_past_devices_of_hosts_that_cannot_take_work(
    real_fleet: Any,
) -> None:
    f = real_fleet
    f.add_host("drained", *[(f"old{i}", "x", ()) for i in range(100)])  # the longest idle
    f.add_host("live", ("new", "x", ()))
    f.admin.drain("drained")
    tid = f.client.submit("g", driver_type="x")
    res = TaskScheduler(f.admin).assign()
    assert [(t, d) for t, d, _ in res.assignments] == [(tid, "new")]


def test_classes_read_deeper_past_hosts_at_their_task_cap(real_fleet: Any) -> None:
    f = real_fleet
    f.admin.set_config("max_tasks_per_host", 1)
    f.add_host("full", *[(f"old{i}", "x", ()) for i in range(100)])  # the longest idle
    f.add_host("free", ("new", "x", ()))
    sched = TaskScheduler(f.admin)
    f.client.submit("first", driver_type="x")
    (first,) = sched.assign().assignments
    assert first[1].startswith("old")  # "full" now holds its one task
    tid = f.client.submit("second", driver_type="x")
    res = sched.assign()
    assert [(t, d) for t, d, _ in res.assignments] == [(tid, "new")]


def _calls(r: redis.Redis) -> dict[str, int]:
    stats = r.info("commandstats")
    return {k: int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info"}


@pytest.mark.parametrize("devices", [1, 5000])
def test_a_pass_with_nothing_queued_reads_no_idle_device(real_fleet: Any, devices: int) -> None:
    f = real_fleet
    f.add_host("h1", *[(f"d{i}", "x", ()) for i in range(devices)])
    f.client.submit("warm", driver_type="x")
    sched = TaskScheduler(f.admin)
    assert sched.assign().assigned == 1
    sched.assign()  # nothing queued: the last pass's classes are read speculatively once
    before = _calls(f.r)
    res = sched.assign(expire=False)
    after = _calls(f.r)
    assert res.idle_devices == 0 and sched.reader.idle.got == {}
    delta = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    # the base's round trip only: TIME, the config, devgen, the queued count, the buckets,
    # the next retry, the gangs, the hand-overs (ZRANGE x4), the avoid and faults hashes;
    # whatever the fleet
    assert delta == {
        "cmdstat_exists": 1,
        "cmdstat_time": 1,
        "cmdstat_hmget": 1,
        "cmdstat_get": 1,
        "cmdstat_zcard": 1,
        "cmdstat_zrange": 4,
        "cmdstat_hlen": 1,
        "cmdstat_hgetall": 1,
    }


class _SeesAll:
    """A whole-pass strategy whose policy needs every idle device."""

    name = "sees_all"
    reads_all_idle = True

    def __init__(self) -> None:
        self.seen: list[int] = []

    def propose(self, snapshot: Any) -> list[tuple[str, str]]:
        self.seen.append(len(snapshot.devices))
        return []


def test_a_strategy_that_reads_all_idle_devices_gets_every_one(real_fleet: Any) -> None:
    f = real_fleet
    f.add_host("h1", *[(f"d{i}", "x", ()) for i in range(100)])
    f.add_host("h2", ("other", "y", ()))  # a class no bucket can use: still not read
    f.client.submit("g", driver_type="x")
    base, _, _ = TaskScheduler(f.admin).reader.read()  # the default: as deep as one task needs
    assert len(base.devices) == FACTOR * 1 + SLACK
    whole = _SeesAll()
    TaskScheduler(f.admin, strategy=whole).assign()
    assert whole.seen == [100]
