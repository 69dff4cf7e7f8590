"""What a task brings in: its own ``timeout`` (submit side and the host daemons that enforce
it), input no runner could pass (NUL bytes: refused at submit; a runner that still cannot
pass an argument fails the task as ``runner_failed``, with no traceback or host path in its
error), and the typo warning of ``deviceq submit`` for a driver type or tag no device has."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from deviceq import Client, FailureKind, TaskStatus
from deviceq.cli import main
from deviceq.core.errors import InvalidInput
from deviceq.core.scripts import source
from deviceq.host.dispatcher import TaskDispatcher
from deviceq.host.runners import CommandRunner, Task
from harness import Deployment, deviceq, wait_for
from invariants import dump
from packed import raw_submit


def missing_file_runner(task: Task) -> str:
    """A Python runner (isolated in a child process by the host) that crashes reading a file
    of the host's."""
    with open(f"/nonexistent-{task.device_id}/rig/config.yaml") as f:
        return f.read()


def run_cli(url: str, pool: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--redis-url", url, "--pool", pool, *args])


def failures(d: Deployment, device_id: str) -> int:
    return d.admin.device(device_id).consecutive_failures


def run_seconds(t: Any) -> float:
    """How long the attempt ran, by Redis's clock (claim to report)."""
    assert t.dispatched_at and t.finished_at
    return (t.finished_at - t.dispatched_at) / 1000


# -- the task's own timeout, end to end --------------------------------------------------------


def test_a_task_timeout_stops_the_run_and_does_not_count_against_the_device(
    deploy: Deployment,
) -> None:
    d = deploy
    d.scheduler()
    d.command_host("h1", "d1:android", extra=("--task-timeout", "300", "--stop-grace", "5"))
    d.command_host("h2", "d2:ios", extra=("--task-timeout", "1", "--stop-grace", "5"))
    wait_for(lambda: d.alive("h1") and d.alive("h2"), 20, "hosts alive")

    # the task's own 1 s wins over the host's 300 s (submitted through the real CLI)
    res = deviceq(d.url, d.pool, "submit", "sleep 30", "--timeout", "1", "--driver-type", "android")
    assert res.returncode == 0 and res.stderr == "", res.stderr
    own = res.stdout.strip()
    shown = json.loads(deviceq(d.url, d.pool, "task", "show", own, "--json").stdout)
    assert shown["timeout"] == 1.0
    t = d.client.wait(own, timeout=60)
    assert (t.status, t.failure_kind) == (TaskStatus.failed, FailureKind.timeout), t.error
    assert run_seconds(t) < 30  # stopped at its own limit, long before the command ends
    assert "deadline passed" in (t.error or "")
    assert failures(d, "d1") == 0  # the task's own limit: not the device's fault

    # the host's 1 s wins over the task's 60 s; still the task's own timeout: not counted
    capped = d.client.submit("sleep 30", driver_type="ios", timeout=60)
    t = d.client.wait(capped, timeout=60)
    assert (t.status, t.failure_kind) == (TaskStatus.failed, FailureKind.timeout), t.error
    assert run_seconds(t) < 30
    assert failures(d, "d2") == 0
    # a task without a timeout of its own stopped by the host's limit counts, as before
    plain = d.client.submit("sleep 30", driver_type="ios")
    t = d.client.wait(plain, timeout=60)
    assert (t.status, t.failure_kind) == (TaskStatus.failed, FailureKind.timeout), t.error
    assert failures(d, "d2") == 1

    # a task that ends within its timeout is done
    quick = d.client.submit("echo quick", driver_type="android", timeout=30)
    assert d.client.wait(quick, timeout=60).status is TaskStatus.done
    res = deviceq(d.url, d.pool, "verify")
    assert res.returncode == 0, res.stdout + res.stderr


# -- the task's own timeout, validated everywhere ----------------------------------------------


BAD_TIMEOUTS: list[Any] = [0, -1, 0.0001, 604800.5, 1e12, float("nan"), float("inf"), "30", True]


def test_bad_timeouts_are_refused_by_producer_cli_and_script(
    real_fleet: Any, redis_server: Any
) -> None:
    c, keys = real_fleet.client, real_fleet.admin.keys
    for bad in BAD_TIMEOUTS:
        with pytest.raises(InvalidInput, match="timeout: must be a number of seconds"):
            c.submit("x", timeout=bad)
        with pytest.raises(InvalidInput, match="timeout"):
            c.submit_many([{"goal": "x"}, {"goal": "y", "timeout": bad}])
    with pytest.raises(InvalidInput, match="roles cannot have a timeout"):
        c.submit("x", roles={"a": "android"}, timeout=5)
    # (nan is no duration: a usage error like the others, as the one duration syntax says)
    for bad in ("0", "-1", "abc", "604801", "inf", "nan"):
        res = run_cli(redis_server.url, real_fleet.pool, "submit", "x", "--timeout", bad)
        assert res.exit_code == 2 and "--timeout" in res.stderr, res.stderr
    assert real_fleet.r.zcard(keys.status("queued")) == 0  # nothing was stored

    # the script checks its 16th field itself (a client that skips the Python checks)
    raw = redis.Redis.from_url(redis_server.url)
    script = raw.register_script(source("submit"))

    def args(timeout: str, roles: str = "", task_id: str = "") -> list[Any]:
        return raw_submit(id=task_id or uuid.uuid4().hex[:16], roles=roles or False,
                          timeout=timeout or False)  # fmt: skip

    before = dump(real_fleet.r, keys)
    for bad in ("0", "0.0001", "-1", "abc", "1e3", "604800.5", " 5", "inf"):
        with pytest.raises(redis.ResponseError, match="^INVALID timeout must be"):
            script(keys=[keys.prefix], args=args(bad))
    with pytest.raises(redis.ResponseError, match="^INVALID a task with roles cannot"):
        script(keys=[keys.prefix], args=args("5", "a=android:"))
    assert dump(real_fleet.r, keys) == before
    script(keys=[keys.prefix], args=args("2.5", task_id="t-timed"))
    assert c.get("t-timed").timeout == 2.5
    script(keys=[keys.prefix], args=args("", task_id="t-untimed"))
    assert c.get("t-untimed").timeout is None
    # the Python API's many-submit path and retry keep it
    tid = c.submit_many([{"goal": "a"}, {"goal": "b", "timeout": 600}])[1]
    assert c.get(tid).timeout == 600.0
    assert c.get(c.submit("x", timeout=0.001)).timeout == 0.001
    raw.close()


# -- NUL bytes -----------------------------------------------------------------------------------


def test_nul_bytes_are_refused_by_cli_producer_and_script(
    real_fleet: Any, redis_server: Any
) -> None:
    c, keys = real_fleet.client, real_fleet.admin.keys
    blank = run_cli(redis_server.url, real_fleet.pool, "submit", "   ")
    assert blank.exit_code != 0  # other bad input: the exit code to match
    res = run_cli(redis_server.url, real_fleet.pool, "submit", "echo a\x00b")
    assert res.exit_code == blank.exit_code, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "NUL" in lines[0] and "Traceback" not in res.stderr, res.stderr
    for call in (
        lambda: c.submit("echo a\x00b"),
        lambda: c.submit_many([{"goal": "fine"}, {"goal": "\x00"}]),
        lambda: c.submit("x", tags=["wifi\x00"]),
        lambda: c.submit("x", driver_type="android\x00"),
        lambda: c.put_workflow({"name": "wf", "steps": [{"goal": "ok"}, {"goal": "a\x00"}]}),
    ):
        with pytest.raises(InvalidInput):
            call()
    with pytest.raises(InvalidInput, match="NUL"):
        c.submit("echo a\x00b")
    assert real_fleet.r.zcard(keys.status("queued")) == 0
    assert c.list_workflows() == []

    raw = redis.Redis.from_url(redis_server.url)
    script = raw.register_script(source("submit"))
    before = dump(real_fleet.r, keys)
    for goal, tags in ((b"echo a\x00b", b""), (b"\x00", b""), (b"x", b"wifi\x00")):
        call = raw_submit(id=uuid.uuid4().hex[:16], goal=goal, tags=tags)
        with pytest.raises(redis.ResponseError, match="^INVALID"):
            script(keys=[keys.prefix], args=call)
    with pytest.raises(redis.ResponseError, match="^INVALID goal must not contain a NUL"):
        script(keys=[keys.prefix], args=raw_submit(goal=b"a\x00"))
    assert dump(real_fleet.r, keys) == before
    raw.close()


# -- what a runner cannot pass, and runner crashes ---------------------------------------------


def test_an_argument_the_command_runner_cannot_pass_is_the_tasks_failure(real_fleet: Any) -> None:
    """A goal stored before the submit check existed, holding a NUL byte: Popen refuses it
    (ValueError: embedded null byte). The task failed on its own input: runner_failed."""
    h = real_fleet.add_host("h1", ("d1", "android", ()))
    tid = real_fleet.client.submit("placeholder", driver_type="android")
    assert real_fleet.store.commit([(tid, "d1")])[0].startswith("ok:")
    (a,) = h.claim(1)
    a.task.goal = "echo a\x00b"
    out = TaskDispatcher(CommandRunner("sh -c {goal}")).dispatch(a, threading.Event())
    assert (out.status, out.failure_kind) == ("failed", FailureKind.runner_failed), out.payload
    assert "null byte" in out.payload and "Traceback" not in out.payload
    assert h.report(tid, a.lease_id, "failed", out.failure_kind, out.payload) == "ok:failed"
    assert real_fleet.admin.device("d1").consecutive_failures == 0


def test_runner_crashes_and_unpassable_arguments_end_to_end(deploy: Deployment) -> None:
    d = deploy
    d.scheduler()
    # a template that hands the 16 KB goal over 200 times: past the system's argument limit
    big = " ".join(["{goal}"] * 200)
    d.host("h1", "d1:big", extra=("--goal-runner", "command", "--command", f"echo {big}"))
    d.host("h2", "d2:py", extra=("--goal-runner", "test_task_input:missing_file_runner"))
    wait_for(lambda: d.alive("h1") and d.alive("h2"), 20, "hosts alive")

    too_long = d.client.submit("x" * 16000, driver_type="big")
    crash = d.client.submit("read the config", driver_type="py")
    t_long, t_crash = d.wait_all([too_long, crash], timeout=60)

    assert (t_long.status, t_long.failure_kind) == (TaskStatus.failed, FailureKind.runner_failed)
    assert "Argument list too long" in (t_long.error or ""), t_long.error
    assert failures(d, "d1") == 0
    assert (t_crash.status, t_crash.failure_kind) == (TaskStatus.failed, FailureKind.runner_error)
    error = t_crash.error or ""
    assert "FileNotFoundError" in error and ".../config.yaml" in error, error
    for leak in ("Traceback", 'File "', "/nonexistent-d2", "/rig/", ".py"):
        assert leak not in error, error
    for attempt in t_crash.attempts:
        assert "Traceback" not in (attempt.error or "")
    # the traceback is in the host's log, for its operator
    assert "Traceback" in d.log("h2") and "missing_file_runner" in d.log("h2")
    res = deviceq(d.url, d.pool, "verify")
    assert res.returncode == 0, res.stdout + res.stderr


# -- typo warnings -------------------------------------------------------------------------------


def test_submit_warns_of_a_driver_type_or_tag_no_device_has(
    real_fleet: Any, redis_server: Any
) -> None:
    url, pool = redis_server.url, real_fleet.pool
    real_fleet.add_host("h1", ("d1", "android", ("wifi", "camera")), ("d2", "browser", ()))
    real_fleet.add_host("h2", ("d3", "ios", ("nfc",)))

    res = run_cli(url, pool, "submit", "x", "--driver-type", "andriod")
    assert res.exit_code == 0, res.output
    assert res.stderr == (
        "warning: no device has driver type 'andriod' (known: android, browser, ios)\n"
    )
    assert real_fleet.client.get(res.stdout.strip()).driver_type == "andriod"  # submitted

    res = run_cli(url, pool, "submit", "x", "--driver-type", "android", "--tag", "wfii,wifi")
    assert res.exit_code == 0, res.output
    assert res.stderr == (
        "warning: no device has tag 'wfii' (known tags of android devices: camera, wifi)\n"
    )
    res = run_cli(url, pool, "submit", "x", "--tag", "nfc", "--tag", "camra")
    assert res.stderr == "warning: no device has tag 'camra' (known tags: camera, nfc, wifi)\n"
    # --json output is unchanged: the task, the warning on stderr only
    res = run_cli(url, pool, "submit", "x", "--driver-type", "andriod", "--json")
    assert res.exit_code == 0 and json.loads(res.stdout)["driver_type"] == "andriod"
    assert "warning: no device has driver type 'andriod'" in res.stderr
    # what some device has: no warning at all
    res = run_cli(url, pool, "submit", "x", "--driver-type", "android", "--tag", "camera")
    assert res.exit_code == 0 and res.stderr == ""

    # a script capturing the id (the real console script, stdout a pipe)
    res = deviceq(url, pool, "submit", "x", "--driver-type", "andriod")
    assert res.returncode == 0 and "warning: no device has driver type" in res.stderr
    assert real_fleet.client.get(res.stdout.strip()).status is TaskStatus.queued

    queued = real_fleet.client.counts()["queued"]
    res = run_cli(url, pool, "submit", "x", "--driver-type", "andriod", "--reject-unmatched")
    assert res.exit_code != 0 and "Unmatchable" in res.stderr and res.stdout == ""
    assert real_fleet.client.counts()["queued"] == queued  # refused: nothing stored


def test_client_submit_takes_a_timeout_and_retry_keeps_it(real_fleet: Any) -> None:
    c: Client = real_fleet.client
    h = real_fleet.add_host("h1", ("d1", "android", ()))
    tid = c.submit("g", driver_type="android", timeout=12.5)
    assert real_fleet.store.commit([(tid, "d1")])[0].startswith("ok:")
    (a,) = h.claim(1)
    assert a.task.timeout == 12.5  # what the host sees
    assert h.report(tid, a.lease_id, "failed", "timeout", "deadline passed") == "ok:failed"
    assert real_fleet.admin.device("d1").consecutive_failures == 0
    assert c.get(c.retry(tid)).timeout == 12.5
