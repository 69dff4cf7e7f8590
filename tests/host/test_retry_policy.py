"""Failure-aware retries with backoff: ``retry_on`` decides which failure kinds are
retried (by default infrastructure failures and lost leases, not the task's own
``runner_failed``), ``retry_backoff`` how long a retry waits (none, fixed or exponential with
jitter and a maximum). A waiting retry is queued but in no bucket: it sits in the ``retries``
index until the scheduler's expiry step enqueues it, and the daemon wakes for it at its due
time. Real Redis; the end-to-end case through the real daemons."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from deviceq import HostClient, TaskScheduler, TaskStatus
from deviceq.cli import main
from deviceq.core.errors import ConfigError, InvalidInput
from deviceq.core.scripts import source
from deviceq.ops.explain import explain
from harness import Deployment, wait_for
from invariants import check_pool, dump
from packed import raw_submit


def _run(fleet: Any, host: HostClient, task_id: str, kind: str, error: str = "boom") -> str:
    """Assign task_id to the host's first idle device, claim it and fail it with `kind`."""
    res = TaskScheduler(fleet.admin).assign()
    assert res.assigned == 1, res
    (a,) = host.claim(1)
    assert a.task.id == task_id
    return host.report(task_id, a.lease_id, "failed", kind, error)


def _attempts(fleet: Any, task_id: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in fleet.r.lrange(fleet.admin.keys.attempts(task_id), 0, -1)]


def test_an_infrastructure_failure_waits_its_backoff_then_prefers_another_device(
    real_fleet: Any,
) -> None:
    f = real_fleet
    f.admin.set_config("retry_backoff", "fixed:1")
    h = f.add_host("h1", ("d1", "x", ()), ("d2", "x", ()))
    tid = f.client.submit("flash", driver_type="x")
    assert _run(f, h, tid, "infrastructure", "usb reset") == "ok:queued"
    t = f.client.get(tid)
    assert t.status == TaskStatus.queued and t.eligible_at is not None
    first = t.attempts[0]
    assert (first.outcome, first.failure_kind, first.eligible_at) == (
        "failed",
        "infrastructure",
        t.eligible_at,
    )
    assert first.retry and "infrastructure is in retry_on" in first.retry
    assert first.error == "usb reset"
    check_pool(f.r, f.admin.keys)
    # waiting: not in its bucket, so a pass assigns nothing (two devices are idle)
    assert f.r.zscore(f.admin.keys.retries, tid) == t.eligible_at
    f.beat()
    assert TaskScheduler(f.admin).assign().assigned == 0
    exp = explain(f.admin, tid)
    assert exp.reasons[0].code == "retry_backoff" and "retried in" in exp.summary
    time.sleep(max(0.0, (t.eligible_at - f.admin.server_time_ms()) / 1000) + 0.05)
    res = TaskScheduler(f.admin).assign()
    assert (res.expired["retried"], res.assigned) == (1, 1)
    t = f.client.get(tid)
    assert t.status == TaskStatus.assigned and t.eligible_at is None
    assert t.device_id == "d2", "the retry prefers another device than the one it failed on"
    check_pool(f.r, f.admin.keys)


def test_a_tasks_own_failure_is_not_retried_unless_retry_on_says_so(real_fleet: Any) -> None:
    f = real_fleet
    h = f.add_host("h1", ("d1", "x", ()))
    plain = f.client.submit("assert", max_attempts=3)
    assert _run(f, h, plain, "runner_failed") == "ok:failed"
    assert f.client.get(plain).status == TaskStatus.failed
    f.beat()
    opted = f.client.submit("flaky", max_attempts=3, retry_on=["runner_failed"])
    assert f.client.get(opted).retry_on == "runner_failed"
    assert _run(f, h, opted, "runner_failed") == "ok:queued"  # no backoff by default: at once
    t = f.client.get(opted)
    assert t.status == TaskStatus.queued and t.eligible_at is None
    # ... and an infrastructure failure is then not retried for it (its own retry_on rules)
    f.beat()
    assert _run(f, h, opted, "infrastructure") == "ok:failed"
    check_pool(f.r, f.admin.keys)


def test_retries_stop_at_max_attempts_and_pool_retry_on_applies(real_fleet: Any) -> None:
    f = real_fleet
    h = f.add_host("h1", ("d1", "x", ()))
    tid = f.client.submit("x", max_attempts=2)
    assert _run(f, h, tid, "infrastructure") == "ok:queued"
    f.beat()
    assert _run(f, h, tid, "infrastructure") == "ok:failed"
    t = f.client.get(tid)
    assert (t.status, t.failure_kind, t.attempt) == (TaskStatus.failed, "infrastructure", 2)
    # the pool may turn retries off
    f.admin.set_config("retry_on", "none")
    f.beat()
    other = f.client.submit("y", max_attempts=5)
    assert _run(f, h, other, "infrastructure") == "ok:failed"


def test_a_lost_lease_is_retried_after_its_backoff_or_not_at_all(real_fleet: Any) -> None:
    f = real_fleet
    f.admin.set_config("claim_ttl", 1)
    f.add_host("h1", ("d1", "x", ()), ("d2", "x", ()))
    waits = f.client.submit("a", retry_backoff="fixed:30")
    f.store.commit([(waits, "d1")])
    fails = f.client.submit("b", retry_on="infrastructure")  # lease_expired is not in it
    f.store.commit([(fails, "d2")])
    time.sleep(1.2)
    out = f.store.expire(limit=10)
    assert (out["requeued"], out["failed"]) == (1, 1)
    t = f.client.get(waits)
    assert t.status == TaskStatus.queued
    now = f.admin.server_time_ms()
    assert t.eligible_at is not None and 29_000 <= t.eligible_at - now <= 30_000
    assert t.attempts[0].outcome == "expired" and t.attempts[0].eligible_at == t.eligible_at
    g = f.client.get(fails)
    assert (g.status, g.failure_kind) == (TaskStatus.failed, "lease_expired")
    assert "not in retry_on" in (g.error or "")
    check_pool(f.r, f.admin.keys)


def test_exponential_backoff_doubles_with_jitter_up_to_its_maximum(real_fleet: Any) -> None:
    f = real_fleet
    h = f.add_host("h1", *[(f"d{i}", "x", ()) for i in range(6)])
    tid = f.client.submit("x", max_attempts=6, retry_backoff="exponential:10:50")
    delays = []
    for _ in range(5):
        f.r.zrem(f.admin.keys.retries, tid)  # skip the wait: enqueue it by hand
        t = f.client.get(tid, attempts=False)
        if t.eligible_at:
            f.r.hdel(f.admin.keys.task(tid), "eligible_at")
            f.r.zadd(f.admin.keys.queue(f.r.hget(f.admin.keys.task(tid), "sig")), {tid: t.seq})
            f.r.zadd(f.admin.keys.queues, {f.r.hget(f.admin.keys.task(tid), "sig"): t.seq})
        f.beat()
        before = f.admin.server_time_ms()
        assert _run(f, h, tid, "infrastructure") == "ok:queued"
        delays.append((f.client.get(tid, attempts=False).eligible_at or 0) - before)
    # attempt n waits between half and all of min(50, 10 * 2^(n-1)) seconds (+ clock slack)
    for n, d in enumerate(delays, start=1):
        full = min(50, 10 * 2 ** (n - 1)) * 1000
        assert full / 2 - 5 <= d <= full + 50, (n, d, delays)


def test_cancel_and_queue_timeout_end_a_waiting_retry_cleanly(real_fleet: Any) -> None:
    f = real_fleet
    h = f.add_host("h1", ("d1", "x", ()))
    tid = f.client.submit("x", retry_backoff="fixed:60")
    assert _run(f, h, tid, "infrastructure") == "ok:queued"
    assert f.client.cancel(tid) is not None
    t = f.client.get(tid)
    assert t.status == TaskStatus.cancelled and t.eligible_at is None
    assert f.r.zcard(f.admin.keys.retries) == 0
    check_pool(f.r, f.admin.keys)
    f.beat()
    late = f.client.submit("y", retry_backoff="fixed:60", queue_timeout=0.5)
    assert _run(f, h, late, "infrastructure") == "ok:queued"
    time.sleep(0.6)
    assert f.store.expire(limit=10)["unschedulable"] == 1
    assert f.client.get(late).failure_kind == "unschedulable"
    assert f.r.zcard(f.admin.keys.retries) == 0
    check_pool(f.r, f.admin.keys)


@pytest.mark.parametrize(
    "field,value",
    [("retry_on", "bogus"), ("retry_on", "infrastructure,"), ("retry_on", ""),
     ("retry_backoff", "fixed:-1"), ("retry_backoff", "exponential:1"),
     ("retry_backoff", "fixed:1e3"), ("retry_backoff", "sometimes")],
)  # fmt: skip
def test_bad_retry_policies_are_refused_and_nothing_is_written(
    real_fleet: Any, field: str, value: str
) -> None:
    f = real_fleet
    before = dump(f.r, f.admin.keys)
    if value:  # the API (an empty retry_on is the pool's default there)
        with pytest.raises(InvalidInput, match=field):
            f.client.submit("x", **{field: value})
    args = raw_submit(goal="x", **{field: value or False})
    script = f.r.register_script(source("submit"))
    if value:
        with pytest.raises(redis.ResponseError, match="^INVALID"):
            script(keys=[f.admin.keys.prefix], args=args)
    with pytest.raises(ConfigError, match=field):
        f.admin.set_config(field, value)
    assert dump(f.r, f.admin.keys) == before


def test_a_garbage_pool_policy_falls_back_to_the_default(real_fleet: Any) -> None:
    """A raw HSET of garbage into the config hash never breaks the scripts: the default
    policy applies (infrastructure retried at once)."""
    f = real_fleet
    f.r.hset(f.admin.keys.config, mapping={"retry_on": "x,,y", "retry_backoff": "soon"})
    h = f.add_host("h1", ("d1", "x", ()))
    tid = f.client.submit("x")
    assert _run(f, h, tid, "infrastructure") == "ok:queued"
    assert f.client.get(tid).eligible_at is None


def test_cli_submit_takes_a_retry_policy(real_fleet: Any, redis_server: Any) -> None:
    def cli(*args: str) -> Any:
        return CliRunner().invoke(
            main, ["--redis-url", redis_server.url, "--pool", real_fleet.pool, *args]
        )

    out = cli("submit", "x", "--retry-on", "infrastructure,timeout", "--retry-backoff", "fixed:5",
              "--json")  # fmt: skip
    assert out.exit_code == 0, out.output
    t = json.loads(out.output)
    assert (t["retry_on"], t["retry_backoff"]) == ("infrastructure,timeout", "fixed:5")
    for bad in (["--retry-on", "sometimes"], ["--retry-backoff", "exponential:1"]):
        res = cli("submit", "y", *bad)
        assert res.exit_code != 0 and "must be" in res.output, res.output
    assert real_fleet.r.zcard(real_fleet.admin.keys.status("queued")) == 1
    shown = cli("config", "set", "retry_backoff", "exponential:2:120")
    assert shown.exit_code == 0, shown.output
    assert real_fleet.admin.config().retry_backoff == "exponential:2:120"


def test_real_daemons_retry_an_infrastructure_failure_on_another_device(
    deploy: Deployment,
) -> None:
    """The command runner exits 75 (an infrastructure exit code) on d1 and succeeds on d2:
    the task fails once, waits its backoff (the scheduler wakes for it: the tick is 30 s),
    and is done on d2."""
    deploy.configure(retry_backoff="fixed:1")
    deploy.command_host("h1", "d1:x", "d2:x", extra=("--infra-exit-code", "75"))
    deploy.spawn("scheduler", "scheduler", "run", "--tick", "30")
    wait_for(lambda: deploy.alive("h1"), 20, "host h1 alive")
    # the first run (on whichever device) leaves a mark and fails as the device's
    mark = deploy.tmp / "failed-once"
    tid = deploy.client.submit(f"test -e {mark} || {{ touch {mark}; exit 75; }}", driver_type="x")
    t = deploy.client.wait(tid, timeout=30)
    assert t.status == TaskStatus.done, (t.status, t.error, deploy.log("h1")[-2000:])
    devices = [a.device_id for a in t.attempts]
    assert len(devices) == 2 and devices[0] != devices[1], t.attempts
    first, second = t.attempts
    assert (first.outcome, first.failure_kind) == ("failed", "infrastructure")
    assert first.eligible_at is not None and first.ended_at is not None
    assert 900 <= first.eligible_at - first.ended_at <= 1100
    assert second.assigned_at >= first.eligible_at, "assigned before its backoff had passed"
    assert second.assigned_at - first.eligible_at < 5_000, "the scheduler polled on its tick"
