"""TaskScheduler.assign(), the daemon loop, explain, manual dispatch and drain, on real Redis
(the seed scenarios also on fakeredis through the ``fleet`` fixture)."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from click.testing import CliRunner

from deviceq import ConfigError, DeviceReport, Fenced, TaskStatus
from deviceq.cli import main
from deviceq.ops.explain import explain
from deviceq.scheduler import TaskScheduler
from deviceq.scheduler.strategies import Snapshot, register_strategy


def statuses(fleet, *ids):
    return [fleet.client.get(t).status.value for t in ids]


# -- seed scenarios --------------------------------------------------------------------------------
def test_seed_fifo_a_before_b(fleet):
    fleet.add_host("h1", ("d1", "android", ("camera", "wifi")))
    a = fleet.client.submit("A", driver_type="android", tags=["wifi"])
    b = fleet.client.submit("B", driver_type="android", tags=["camera"])
    res = TaskScheduler(fleet.admin).assign()
    assert (res.proposed, res.assigned, res.rejected) == (1, 1, {})
    assert statuses(fleet, a, b) == ["assigned", "queued"]
    t = fleet.client.get(a)
    assert (t.device_id, t.host_id, t.attempt) == ("d1", "h1", 1)


def test_seed_no_match_stays_queued(fleet):
    fleet.add_host("h1", ("d1", "android", ("wifi",)))
    t1 = fleet.client.submit("needs ios", driver_type="ios")
    t2 = fleet.client.submit("needs 5g", driver_type="android", tags=["5g"])
    sched = TaskScheduler(fleet.admin)
    for _ in range(3):  # retried on later calls, still no error
        res = sched.assign()
        assert (res.assigned, res.proposed, res.heads) == (0, 0, 0)
    assert statuses(fleet, t1, t2) == ["queued", "queued"]
    assert fleet.admin.device("d1").reserved_by is None


def test_seed_unknown_strategy_is_a_clear_error_at_start(fleet):
    with pytest.raises(ConfigError, match="unknown assignment strategy 'nope'.*fifo_match"):
        TaskScheduler(fleet.admin, strategy="nope")


@register_strategy("test_newest_first")
class NewestFirst:
    """Defined here, registered by name: the scheduler uses it with no edit of its own."""

    name = "test_newest_first"
    lookahead = 10  # wants to see more than the oldest task of each bucket

    def propose(self, snapshot: Snapshot) -> list[tuple[str, str]]:
        order = sorted(snapshot.tasks(), key=lambda t: -t.seq)
        return snapshot.greedy(order, device_key=lambda d: d.device_id)


def test_seed_strategy_registered_in_test_module_used_by_name(fleet):
    fleet.add_host("h1", ("d1", "android", ()))
    old = fleet.client.submit("old")
    new = fleet.client.submit("new")
    res = TaskScheduler(fleet.admin, strategy="test_newest_first").assign()
    assert res.assigned == 1
    assert statuses(fleet, old, new) == ["queued", "assigned"]


def test_seed_stale_idle_snapshot_excluded(fleet):
    h = fleet.add_host("h1", ("d1", "android", ()), ("d2", "android", ()))
    first = fleet.client.submit("first")
    assert fleet.admin.dispatch(first, "d1") == f"{first}-a1"
    # the host snapshot still says d1 is idle, but d1 holds an active assignment lease
    h.heartbeat([DeviceReport("d1", "android"), DeviceReport("d2", "android")])
    sched = TaskScheduler(fleet.admin)
    snap = sched.snapshot()
    assert [d.device_id for d in snap.devices] == ["d2"]
    others = fleet.client.submit_many([{"goal": "x"}, {"goal": "y"}])
    res = sched.assign()
    assert res.assigned == 1 and res.idle_devices == 1
    assert fleet.client.get(others[0]).device_id == "d2"
    assert fleet.client.get(others[1]).status is TaskStatus.queued


def test_stale_entry_in_idle_index_is_excluded(real_fleet, real_r):
    fleet = real_fleet
    fleet.add_host("h1", ("d1", "x", ()), ("d2", "x", ()))
    first = fleet.client.submit("first")
    fleet.admin.dispatch(first, "d1")
    sched = TaskScheduler(fleet.admin)
    sched.assign()  # d2's attributes are now cached
    # a foreign writer puts the reserved d1 back into the idle index: the state check drops it
    real_r.zadd(fleet.admin.keys.idle, {"d1": 1})
    assert [d.device_id for d in sched.snapshot().devices] == ["d2"]
    second, third = fleet.client.submit_many([{"goal": "2"}, {"goal": "3"}])
    res = sched.assign()
    assert res.assigned == 1 and res.rejected == {}
    assert fleet.client.get(second).device_id == "d2"
    assert fleet.client.get(third).status is TaskStatus.queued


def test_stale_snapshot_costs_a_rejected_pair_never_a_double_booking(fleet):
    fleet.add_host("h1", ("d1", "android", ()), ("d2", "android", ()))
    t1, t2 = fleet.client.submit_many([{"goal": "1"}, {"goal": "2"}])
    sched = TaskScheduler(fleet.admin)
    snap = sched.snapshot()
    pairs, dropped = sched.plan(snap)
    assert pairs == [(t1, "d1"), (t2, "d2")] and dropped == 0
    # between snapshot and commit an operator dispatches t2 onto d1
    fleet.admin.dispatch(t2, "d1")
    assert sched.commit(pairs) == ["err:device_reserved", "err:task_not_queued"]
    assert fleet.admin.device("d1").reserved_by == t2
    assert fleet.admin.device("d2").reserved_by is None
    res = sched.assign()  # the next pass sees the truth
    assert res.assigned == 1 and fleet.client.get(t1).device_id == "d2"


def test_invalid_strategy_pairs_are_dropped_not_committed(fleet):
    class Bad:
        name = "bad"

        def propose(self, snapshot):
            t = next(snapshot.tasks()).task_id
            return [(t, "ios-1"), (t, "and-1"), (t, "and-2"), ("ghost", "and-2"), "junk"]

    fleet.add_host("h1", ("and-1", "android", ()), ("and-2", "android", ()), ("ios-1", "ios", ()))
    tid = fleet.client.submit("x", driver_type="android")
    res = TaskScheduler(fleet.admin, strategy=Bad()).assign()
    assert res.assigned == 1 and res.rejected == {"strategy_invalid": 4}
    assert fleet.client.get(tid).device_id == "and-1"


# -- constraints, scale ----------------------------------------------------------------------------
def test_mixed_constraints_twenty_signatures_unrunnable_never_delays_others(real_fleet):
    fleet = real_fleet
    drivers = ["android", "ios", "chrome", "firefox"]
    tags = [(), ("wifi",), ("camera",), ("wifi", "camera"), ("5g",)]
    devs = []
    for drv in drivers:
        for j in range(3):
            devs.append((f"{drv}-{j}", drv, ("wifi", "camera", "5g")[: j + 1]))
    fleet.add_host("h1", *devs[:6])
    fleet.add_host("h2", *devs[6:])
    # the oldest tasks of all are unrunnable (no such driver type)
    stuck = fleet.client.submit_many([{"goal": "gpu job", "driver_type": "gpu"}] * 50)
    specs = [
        {"goal": f"g{n}", "driver_type": drv, "tags": list(tg)}
        for n in range(6)
        for drv in drivers
        for tg in tags
    ]
    ids = fleet.client.submit_many(specs)
    assert len({(s["driver_type"], tuple(s["tags"])) for s in specs}) == 20
    sched = TaskScheduler(fleet.admin)
    hosts = {"h1": fleet.host("h1"), "h2": fleet.host("h2")}
    # the very first pass already uses every idle device for runnable work
    res = sched.assign()
    assert res.assigned == 12 and res.signatures == 21
    for _ in range(200):
        for h in hosts.values():
            for a in h.claim(20):
                h.report(a.task.id, a.lease_id, "done")
        res = sched.assign()
        if res.assigned == 0:
            break
    done = fleet.client.get_many(ids)
    # every runnable task is done; ("5g") tasks on j=2 devices, all drivers serve every sig here
    assert all(t.status is TaskStatus.done for t in done)
    assert all(fleet.client.get(t).status is TaskStatus.queued for t in stuck)
    e = explain(fleet.admin, stuck[0])
    assert e.reasons[0].code == "no_driver_type"


def test_pass_cost_does_not_grow_with_queue_length(real_fleet, real_r):
    fleet = real_fleet
    fleet.add_host("h1", ("d1", "android", ()))
    sched = TaskScheduler(fleet.admin)

    def calls_of_one_pass() -> int:
        before = _calls(real_r)
        sched.assign()
        return _calls(real_r) - before

    fleet.client.submit_many([{"goal": "x", "driver_type": "ios"}] * 100)
    sched.assign()  # warm: the bucket's constraints are cached after the first read
    small = calls_of_one_pass()
    fleet.client.submit_many([{"goal": "x", "driver_type": "ios"}] * 5000)
    big = calls_of_one_pass()
    assert big == small  # unrunnable bucket: no head is even read
    # a runnable bucket: heads read = matching idle devices, not queue length
    fleet.client.submit_many([{"goal": "y", "driver_type": "android"}] * 3000)
    snap = sched.snapshot()
    assert sum(len(b.heads) for b in snap.buckets) == 1


def _calls(r) -> int:
    stats = r.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def test_fifo_exact_when_one_bucket_holds_the_oldest_tasks(fleet):
    # 40 buckets: the fair share of heads read first is small, so the scheduler must read
    # deeper into the bucket that holds the 30 oldest tasks to stay exactly FIFO
    fleet.add_host("h1", *[(f"d{i:02d}", "x", ("a", "b", "c")) for i in range(30)])
    old = fleet.client.submit_many([{"goal": "old"}] * 30)
    subsets = [[t for j, t in enumerate("abc") if m >> j & 1] for m in range(8)]
    young = [{"goal": "young", "tags": tags, "priority": p} for tags in subsets for p in range(5)]
    fleet.client.submit_many(young * 3)
    sched = TaskScheduler(fleet.admin, batch=200)
    assert sched.snapshot().signatures == 40
    assert len(sched.snapshot().buckets[0].heads) < 30  # the first read is shallow
    res = sched.assign()
    assert res.assigned == 30
    assert all(t.status is TaskStatus.assigned for t in fleet.client.get_many(old))


def test_batch_limits_one_pass(fleet):
    fleet.add_host("h1", *[(f"d{i:02d}", "x", ()) for i in range(12)])
    fleet.client.submit_many([{"goal": "g"}] * 20)
    sched = TaskScheduler(fleet.admin, batch=5)
    res = sched.assign()
    assert (res.assigned, res.more) == (5, True)
    assert sched.assign().assigned == 5
    res = sched.assign()
    assert (res.assigned, res.more) == (2, False)


def test_priority_match_strategy_end_to_end(fleet):
    fleet.add_host("h1", ("d1", "x", ()), ("d2", "x", ()))
    low = fleet.client.submit("low", priority=0)
    high = fleet.client.submit("high", priority=7)
    top = fleet.client.submit("top", priority=9)
    TaskScheduler(fleet.admin, strategy="priority_match").assign()
    assert statuses(fleet, low, high, top) == ["queued", "assigned", "assigned"]


def test_lru_device_strategy_end_to_end(fleet):
    h = fleet.add_host("h1", ("a", "x", ()), ("b", "x", ()))
    t1, t2 = fleet.client.submit_many([{"goal": "1"}, {"goal": "2"}])
    sched = TaskScheduler(fleet.admin, strategy="lru_device")
    sched.assign()
    leases = {a.task.id: a.lease_id for a in h.claim(2)}
    assert fleet.client.get(t1).device_id == "a"
    # b (t2) finishes first, a (t1) later: b has now been idle the longest
    h.report(t2, leases[t2], "done")
    time.sleep(0.01)
    h.report(t1, leases[t1], "done")
    t3 = fleet.client.submit("3")
    sched.assign()
    assert fleet.client.get(t3).device_id == "b"  # fifo_match would have chosen a


def test_expiry_runs_in_the_pass_and_the_task_is_retried(fleet):
    fleet.admin.set_config("claim_ttl", 1)
    fleet.add_host("h1", ("d1", "x", ()))
    fleet.add_host("h2", ("d2", "x", ()))
    tid = fleet.client.submit("g")
    sched = TaskScheduler(fleet.admin)
    assert sched.assign().assignments[0][1] == "d1"
    time.sleep(1.05)  # never claimed: the assignment expires
    res = sched.assign()
    # retried in the same pass, on the live host: h1 (and d1) are suspect until h1 heartbeats
    assert res.expired["requeued"] == 1 and res.assignments[0][1] == "d2"
    t = fleet.client.get(tid)
    assert (t.status, t.attempt, t.host_id) == (TaskStatus.assigned, 2, "h2")
    assert [a.outcome for a in t.attempts] == ["expired", "active"]


def test_draining_and_dead_hosts_get_nothing(fleet):
    fleet.add_host("h1", ("d1", "x", ()))
    fleet.add_host("h2", ("d2", "x", ()))
    fleet.admin.drain("h1")
    fleet.admin.set_config("host_timeout", 1)
    time.sleep(1.05)
    fleet.host("h1").heartbeat([DeviceReport("d1", "x")])  # h1 alive but draining; h2 dead
    tid = fleet.client.submit("g")
    sched = TaskScheduler(fleet.admin)
    assert sched.assign().assigned == 0
    fleet.admin.drain("h1", False)
    fleet.host("h1").heartbeat([DeviceReport("d1", "x")])
    assert sched.assign().assigned == 1
    assert fleet.client.get(tid).device_id == "d1"


# -- leadership and fencing --------------------------------------------------------------------
def test_only_one_leader_and_a_deposed_leader_is_fenced(real_fleet):
    fleet = real_fleet
    fleet.add_host("h1", ("d1", "x", ()))
    tid = fleet.client.submit("g")
    a = TaskScheduler(fleet.admin, owner="sched-a")
    b = TaskScheduler(fleet.admin, owner="sched-b")
    assert a.try_lead(200) and not b.try_lead(200)
    old = a.epoch
    time.sleep(0.3)  # a fails to renew: its lease lapses
    assert b.try_lead(5000) and b.epoch == old + 1
    with pytest.raises(Fenced):
        a.assign(fence=old)
    assert fleet.client.get(tid).status is TaskStatus.queued
    assert b.assign().assigned == 1
    assert b.release() and b.leader() is None


def test_daemon_wakes_on_submit_not_on_tick_and_stops_cleanly(real_fleet):
    fleet = real_fleet
    fleet.add_host("h1", ("d1", "x", ()))
    sched = TaskScheduler(fleet.admin, owner="daemon-1")
    th = threading.Thread(target=sched.run, kwargs={"tick": 60.0}, daemon=True)
    th.start()
    try:
        deadline = time.monotonic() + 5
        while sched.leader() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)  # the daemon is now blocked on the wake list (tick is 60 s)
        t0 = time.monotonic()
        tid = fleet.client.submit("wake me")
        while fleet.client.get(tid).status is TaskStatus.queued:
            assert time.monotonic() - t0 < 1.0, "not woken by the submission"
            time.sleep(0.005)
    finally:
        sched.stop(wake=True)
        th.join(5)
    assert not th.is_alive()
    assert sched.leader() is None  # the lease was released


def test_daemon_logs_passes_at_debug_and_a_summary_at_info(real_fleet, caplog):
    """Per-pass lines are DEBUG; at INFO the daemon sums the passes that did something into
    one line every ~10 s, and once more when it stops."""
    fleet = real_fleet
    fleet.add_host("h1", ("d1", "x", ()), ("d2", "x", ()))
    caplog.set_level(logging.INFO, logger="deviceq.scheduler")
    sched = TaskScheduler(fleet.admin, owner="summary-1")
    th = threading.Thread(target=sched.run, kwargs={"tick": 0.2}, daemon=True)
    th.start()
    try:
        ids = [fleet.client.submit(f"t{i}") for i in range(2)]
        deadline = time.monotonic() + 5
        while statuses(fleet, *ids) != ["assigned"] * 2:
            assert time.monotonic() < deadline, statuses(fleet, *ids)
            time.sleep(0.01)
        time.sleep(0.5)  # idle passes on the tick: not summed
    finally:
        sched.stop(wake=True)
        th.join(5)
    msgs = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert "pass" not in msgs
    (summary,) = [r for r in caplog.records if r.getMessage() == "passes"]
    f = summary.fields  # type: ignore[attr-defined]
    assert f["assigned"] == 2 and 1 <= f["passes"] <= 2 and f["rejected"] == 0, f
    assert msgs.index("passes") < msgs.index("scheduler stopped")


# -- CLI ------------------------------------------------------------------------------------
def cli(url: str, pool: str, *args: str):
    return CliRunner().invoke(main, ["--redis-url", url, "--pool", pool, *args])


def test_cli_run_once_assigns_and_logs_one_line(real_fleet, redis_url):
    fleet = real_fleet
    fleet.add_host("h1", ("d1", "x", ()))
    tid = fleet.client.submit("g")
    res = cli(
        redis_url,
        fleet.pool,
        "--log-format",
        "json",
        "scheduler",
        "run",
        "--once",
        "--owner",
        "once-1",
    )
    assert res.exit_code == 0, res.output
    assert fleet.client.get(tid).status is TaskStatus.assigned
    assert '"msg": "pass"' in res.output and '"assigned": 1' in res.output


def test_cli_run_unknown_strategy_fails_with_one_line(real_fleet, redis_url):
    res = cli(redis_url, real_fleet.pool, "scheduler", "run", "--strategy", "bogus", "--once")
    assert res.exit_code != 0
    assert "unknown assignment strategy 'bogus'" in res.output
    assert "fifo_match" in res.output


def test_cli_dispatch(real_fleet, redis_url):
    fleet = real_fleet
    fleet.add_host("h1", ("d1", "x", ()), ("d2", "y", ()))
    tid = fleet.client.submit("g", driver_type="x")
    res = cli(redis_url, fleet.pool, "dispatch", tid, "--device", "d2")
    assert res.exit_code == 1 and "driver_type_mismatch" in res.output
    assert fleet.client.get(tid).status is TaskStatus.queued
    res = cli(redis_url, fleet.pool, "dispatch", tid, "--device", "d1", "--json")
    assert res.exit_code == 0, res.output
    assert f'"lease_id": "{tid}-a1"' in res.output
    res = cli(redis_url, fleet.pool, "dispatch", tid, "--device", "d1")
    assert res.exit_code == 1 and "task_not_queued" in res.output


def test_cli_host_drain_undrain(real_fleet, redis_url):
    fleet = real_fleet
    fleet.add_host("h1", ("d1", "x", ()))
    assert cli(redis_url, fleet.pool, "host", "drain", "h1").output.strip() == "h1 draining"
    tid = fleet.client.submit("g")
    assert TaskScheduler(fleet.admin).assign().assigned == 0
    assert explain(fleet.admin, tid).counts["host_draining"] == 1
    assert cli(redis_url, fleet.pool, "host", "undrain", "h1").output.strip() == "h1 active"
    assert TaskScheduler(fleet.admin).assign().assigned == 1
    res = cli(redis_url, fleet.pool, "host", "drain", "nohost")
    assert res.exit_code == 1 and "nohost" in res.output


# -- explain -------------------------------------------------------------------------------------
def test_explain_no_driver_type_and_missing_tags(fleet):
    fleet.add_host("h1", ("a1", "android", ("wifi",)), ("a2", "android", ()))
    t1 = fleet.client.submit("g", driver_type="ios")
    e = explain(fleet.admin, t1)
    assert e.reasons[0].code == "no_driver_type" and "android" in e.reasons[0].message
    t2 = fleet.client.submit("g", driver_type="android", tags=["wifi", "camera"])
    e = explain(fleet.admin, t2)
    assert e.reasons[0].code == "missing_tags"
    assert e.reasons[0].detail["missing"] == {"camera": 2, "wifi": 1}
    assert e.counts["of_driver_type"] == 2 and e.counts["matching"] == 0


def test_explain_counts_why_matching_devices_are_unavailable(fleet):
    fleet.add_host("h1", ("r1", "x", ()), ("q1", "x", ()), ("b1", "x", ()))
    h1 = fleet.host("h1")
    fleet.add_host("h2", ("dr1", "x", ()), ("dr2", "x", ()))
    fleet.add_host("h3", ("dead1", "x", ()))
    first = fleet.client.submit("running")
    fleet.admin.dispatch(first, "r1")
    fleet.admin.quarantine("q1")
    fleet.admin.drain("h2")
    fleet.admin.set_config("host_timeout", 1)
    time.sleep(1.2)
    h1.heartbeat(
        [DeviceReport("r1", "x"), DeviceReport("q1", "x"), DeviceReport("b1", "x", state="busy")]
    )
    fleet.host("h2").heartbeat([DeviceReport("dr1", "x"), DeviceReport("dr2", "x")])
    tid = fleet.client.submit("waiting", driver_type="x")
    e = explain(fleet.admin, tid)
    c = e.counts
    assert (
        c["matching"],
        c["reserved"],
        c["quarantined"],
        c["busy"],
        c["host_draining"],
        c["host_dead"],
        c["idle"],
    ) == (6, 1, 1, 1, 2, 1, 0)
    assert {r.code for r in e.reasons} >= {
        "reserved",
        "quarantined",
        "busy",
        "host_draining",
        "host_dead",
    }
    assert "unavailable" in e.summary


def test_explain_idle_devices_and_no_scheduler_then_running_then_finished(real_fleet):
    fleet = real_fleet
    h = fleet.add_host("h1", ("d1", "x", ()))
    tid = fleet.client.submit("g")
    e = explain(fleet.admin, tid)
    assert e.counts["idle"] == 1 and e.reasons[0].code == "no_scheduler"
    sched = TaskScheduler(fleet.admin, owner="explainer")
    assert sched.try_lead(5000)
    assert explain(fleet.admin, tid).reasons[0].code == "waiting_turn"
    sched.assign()
    e = explain(fleet.admin, tid)
    assert e.status == "assigned" and "d1" in e.summary and "claim" in e.summary
    (a,) = h.claim(1)
    e = explain(fleet.admin, tid)
    assert e.status == "dispatched" and e.summary.startswith("it is running on device d1")
    h.report(tid, a.lease_id, "failed", "runner_failed", "boom")
    e = explain(fleet.admin, tid)
    assert e.status == "failed" and "runner_failed" in e.summary
    assert any(r.code == "error" and "boom" in r.message for r in e.reasons)
    sched.release()


def test_cli_explain_text_and_json(real_fleet, redis_url):
    fleet = real_fleet
    tid = fleet.client.submit("g", driver_type="gpu")
    res = cli(redis_url, fleet.pool, "explain", tid)
    assert res.exit_code == 0 and "no_driver_type" in res.output
    res = cli(redis_url, fleet.pool, "explain", tid, "--json")
    assert res.exit_code == 0 and '"code": "no_driver_type"' in res.output
    res = cli(redis_url, fleet.pool, "explain", "nosuchtask")
    assert res.exit_code == 1 and res.output.count("\n") == 1


def test_daemon_survives_a_redis_restart(private_redis, pool):
    """State lives only in Redis: after a server restart the daemon reconnects, keeps (or
    retakes) the lease and assigns what is submitted afterwards."""
    import redis as redis_lib

    from deviceq import Client, HostClient, PoolAdmin

    r = redis_lib.Redis.from_url(private_redis.url, decode_responses=True)
    admin = PoolAdmin(r, pool)
    client = Client(r, pool)
    token = admin.add_host("h1")
    host = HostClient(r, pool, "h1", token)
    host.heartbeat([DeviceReport("d1", "x"), DeviceReport("d2", "x")])
    sched = TaskScheduler(PoolAdmin(private_redis.url, pool), owner="survivor")
    th = threading.Thread(target=sched.run, kwargs={"tick": 0.2}, daemon=True)
    th.start()
    try:
        first = client.submit("before")
        deadline = time.monotonic() + 5
        while client.get(first).status is TaskStatus.queued:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(1.2)  # let the AOF (fsync every second) hold the writes
        private_redis.restart(down_for=0.5)
        host.heartbeat([DeviceReport("d1", "x"), DeviceReport("d2", "x")])
        second = client.submit("after")
        deadline = time.monotonic() + 10
        while client.get(second).status is TaskStatus.queued:
            assert time.monotonic() < deadline, "not assigned after the restart"
            time.sleep(0.05)
        assert client.get(second).device_id == "d2"  # d1 still holds the first task
        assert sched.leader() == ("survivor", sched.epoch)
    finally:
        sched.stop(wake=True)
        th.join(10)
        r.close()
    assert not th.is_alive()


def test_cli_run_once_with_metrics_port(real_fleet, redis_url):
    from harness import free_port

    fleet = real_fleet
    fleet.add_host("h1", ("d1", "x", ()))
    tid = fleet.client.submit("g")
    port = free_port()
    res = cli(redis_url, fleet.pool, "scheduler", "run", "--once", "--metrics-port", str(port))
    assert res.exit_code == 0, res.output
    assert fleet.client.get(tid).status is TaskStatus.assigned


def test_expiry_runs_in_bounded_batches(fleet):
    fleet.admin.set_config("claim_ttl", 1)
    fleet.add_host("h1", *[(f"d{i:02d}", "x", ()) for i in range(25)])
    fleet.client.submit_many([{"goal": "g"}] * 25)
    # count-bounded only (no time budget): exactly expire_batch a call
    sched = TaskScheduler(fleet.admin, expire_batch=10, expire_rounds=2, expire_budget_ms=None)
    assert sched.assign().assigned == 25
    time.sleep(1.05)  # 25 assignments expire unclaimed
    fleet.admin.set_config("claim_ttl", 30)  # the re-assignments below do not expire
    res = sched.assign()
    assert res.expired["requeued"] == 20 and res.expired["more"] == 1 and res.more
    res = sched.assign()
    assert res.expired["requeued"] == 5 and res.expired["more"] == 0
