"""Bulk task operations: ``task cancel|retry|wait`` on several ids or a filter
(counted, confirmed, ``--yes``; refused without a terminal), ``task list --host/--since``,
and ``Client.cancel_many`` / ``Client.wait_many`` / ``Client.find``. Every filter reads the
status indexes page by page, never the keyspace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from conftest import Fleet
from deviceq import InvalidInput, NotFound, TaskFilter, TaskStatus
from deviceq.scheduler import TaskScheduler

EXE = Path(sys.executable).parent / "deviceq"


def dq(url: str, pool: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The console script, stdin not a terminal (as from cron or CI)."""
    return subprocess.run(
        [str(EXE), *args, "--redis-url", url, "--pool", pool],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip


def statuses(fleet: Any, ids: list[str]) -> list[str]:
    return [t.status.value for t in fleet.client.get_many(ids)]


def test_cancel_several_ids_and_a_confirmed_filter(real_fleet: Any, redis_url: str) -> None:
    f = real_fleet
    a = [f.client.submit(f"a{i}", driver_type="android", tags=["wifi"]) for i in range(3)]
    b = [f.client.submit(f"b{i}", driver_type="ios") for i in range(2)]
    res = dq(redis_url, f.pool, "task", "cancel", b[0], b[1])
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [f"{b[0]} cancelled", f"{b[1]} cancelled"]
    assert "2 cancelled, 0 cancel requested, 0 already finished" in res.stderr

    # a filter without --yes and without a terminal: refused, nothing changed
    res = dq(redis_url, f.pool, "task", "cancel", "--driver-type", "android", "--tag", "wifi")
    assert res.returncode == 2
    assert "3 task(s) match (status=queued,assigned,dispatched driver_type=android tag=wifi)" in (
        res.stderr
    )
    assert "refusing to cancel 3 task(s) without confirmation" in res.stderr
    assert statuses(f, a) == ["queued"] * 3
    # bad input: clear errors, nothing changed
    for args, msg in (
        (("--status", "done", "--yes"), "only queued, assigned, dispatched tasks can be cancelled"),
        ((a[0], "--status", "queued"), "give task ids or filters"),
        ((), "give one or more task ids, or a filter"),
        (("--older-than", "soon", "--yes"), "--older-than: 'soon' is not a duration"),
        ((a[0], "0123456789abcdef"), "NotFound: no task 0123456789abcdef"),
    ):
        res = dq(redis_url, f.pool, "task", "cancel", *args)
        assert res.returncode != 0 and msg in res.stderr, (args, res.stderr)
        assert statuses(f, a) == ["queued"] * 3
    res = dq(redis_url, f.pool, "task", "cancel", "--older-than", "1h", "--yes")
    assert res.returncode == 0 and "no task matches" in res.stderr  # all are newer

    res = dq(redis_url, f.pool, "task", "cancel", "--tag", "wifi", "--older-than", "0s",
             "--yes", "--json")  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == dict.fromkeys(a, "cancelled")
    assert statuses(f, a + b) == ["cancelled"] * 5


def test_retry_by_filter_and_wait_for_several(private_redis: Any, pool: str) -> None:
    # a server of its own: the waiting command is found by its XREAD in the client list,
    # which on the shared server could be any other test's
    f = Fleet(redis.Redis.from_url(private_redis.url, decode_responses=True), pool)
    redis_url = private_redis.url
    h = f.add_host("h1", ("d1", "android", ()), ("d2", "android", ()))
    ids = [f.client.submit(f"g{i}", driver_type="android", max_attempts=1) for i in range(2)]
    TaskScheduler(f.admin, owner="bulk").assign()
    for a in h.claim(2):
        outcome = "done" if a.task.id == ids[0] else "failed"
        h.report(a.task.id, a.lease_id, outcome, "runner_failed" if outcome == "failed" else None)
    assert statuses(f, ids) == ["done", "failed"]

    res = dq(redis_url, f.pool, "task", "wait", *ids, "--timeout", "5")
    assert res.returncode == 1, res.stderr  # one failed
    assert res.stdout.splitlines()[0] == f"{ids[0]} done"
    assert res.stdout.splitlines()[1].startswith(f"{ids[1]} failed (runner_failed")

    res = dq(redis_url, f.pool, "task", "retry", "--status", "done", "--yes")
    assert res.returncode == 1 and "only failed, cancelled tasks can be retried" in res.stderr
    res = dq(redis_url, f.pool, "task", "retry", "--host", "h1", "--yes", "--json")
    assert res.returncode == 0, res.stderr
    (out,) = json.loads(res.stdout)
    assert out["retry_of"] == ids[1] and out["task"]["status"] == "queued"
    new = out["id"]
    assert statuses(f, ids) == ["done", "failed"]  # the old tasks are not changed

    # wait for a filter's tasks: finished by a host while it waits
    def finish() -> None:
        # once the command waits (blocked reading events): a loaded machine may take more
        # than a second to start it, and then it would find no queued task at all
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(
            c.get("cmd") == "xread" for c in f.r.client_list()
        ):
            time.sleep(0.05)
        TaskScheduler(f.admin, owner="bulk").assign()
        (a,) = h.claim(1)
        h.report(a.task.id, a.lease_id, "done")

    t = threading.Thread(target=finish)
    t.start()
    res = dq(redis_url, f.pool, "task", "wait", "--status", "queued", "--yes", "--timeout", "30")
    t.join()
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [f"{new} done"]
    res = dq(redis_url, f.pool, "task", "wait", ids[0], ids[1], "--json")
    assert [x["id"] for x in json.loads(res.stdout)] == ids


def test_list_by_host_since_and_limit(real_fleet: Any, redis_url: str) -> None:
    f = real_fleet
    h1 = f.add_host("h1", ("d1", "android", ()))
    f.add_host("h2", ("d2", "ios", ()))
    on_h1 = f.client.submit("for h1", driver_type="android")
    on_h2 = f.client.submit("for h2", driver_type="ios")
    queued = [f.client.submit(f"q{i}", driver_type="android") for i in range(3)]
    TaskScheduler(f.admin, owner="bulk").assign()
    (a,) = h1.claim(1)
    h1.report(on_h1, a.lease_id, "done")

    def listed(*args: str) -> list[str]:
        res = dq(redis_url, f.pool, "task", "list", *args, "--json")
        assert res.returncode == 0, res.stderr
        return [t["id"] for t in json.loads(res.stdout)]

    assert listed("--host", "h1") == [on_h1]
    assert listed("--host", "h2") == [on_h2]
    assert sorted(listed("--since", "1h")) == sorted([on_h1, on_h2, *queued])
    assert listed("--since", "2000-01-01T00:00:00Z", "--status", "queued") == queued
    assert listed("--since", "2999-01-01T00:00:00Z") == []
    assert listed("--status", "queued", "--limit", "2") == queued[:2]
    assert listed("--status", "queued", "--status", "assigned") == [*queued, on_h2]
    res = dq(redis_url, f.pool, "task", "list", "--since", "yesterday")
    assert res.returncode == 1 and "neither a duration" in res.stderr


def test_python_api_cancel_many_wait_many_find(real_fleet: Any) -> None:
    f = real_fleet
    ids = [f.client.submit(f"g{i}", tags=["nightly"] if i % 2 else []) for i in range(6)]
    with pytest.raises(NotFound):
        f.client.cancel_many([ids[0], "0123456789abcdef"])
    with pytest.raises(InvalidInput):
        f.client.cancel_many(ids[0])
    assert statuses(f, ids) == ["queued"] * 6  # checked before any was cancelled

    found = f.client.find(TaskFilter(statuses=(TaskStatus.queued,), tags=frozenset({"nightly"})))
    assert [t.id for t in found.tasks] == ids[1::2] and not found.truncated
    capped = f.client.find(TaskFilter(), max_scan=4)
    assert capped.truncated and capped.examined == 4 and len(capped.tasks) == 4

    assert f.client.cancel_many(ids[1::2]) == dict.fromkeys(ids[1::2], "cancelled")
    done = f.client.wait_many(ids[1::2], timeout=1)
    assert [t.id for t in done] == ids[1::2]
    assert all(t.status is TaskStatus.cancelled for t in done)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="3 of 3 task"):
        f.client.wait_many(ids[0::2], timeout=0.5)
    assert time.monotonic() - started < 5
