"""The core CLI commands against the real private server: in-process through click's CliRunner,
and as the installed ``deviceq`` console script in a subprocess (exit codes, environment)."""

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
from click.testing import CliRunner, Result

from deviceq import HostClient, TaskStatus
from deviceq.cli import main
from harness import free_port

DESIGN_FIELDS = {
    "id",
    "status",
    "kind",
    "goal",
    "workflow",
    "driver_type",
    "tags",
    "attempt",
    "max_attempts",
    "host_id",
    "device_id",
    "lease_id",
    "lease_expires_at",
    "failure_kind",
    "error",
    "result",
    "submitted_at",
    "updated_at",
    "attempts",
}
ATTEMPT_FIELDS = {
    "attempt",
    "lease_id",
    "host_id",
    "device_id",
    "assigned_at",
    "ended_at",
    "outcome",
    "failure_kind",
}


@pytest.fixture
def cli(real_fleet: Any, redis_server: Any) -> Any:
    """Run ``deviceq --redis-url URL --pool POOL ARGS...`` in process."""
    runner = CliRunner()

    def run(*args: str, env: dict[str, str] | None = None) -> Result:
        return runner.invoke(
            main,
            ["--redis-url", redis_server.url, "--pool", real_fleet.pool, *args],
            env=env,
            catch_exceptions=False,
        )

    run.fleet = real_fleet  # type: ignore[attr-defined]
    return run


def console_script() -> str:
    path = Path(sys.executable).parent / "deviceq"
    assert path.exists(), path
    return str(path)


def one_error_line(res: Result) -> str:
    assert res.exit_code != 0, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error:"), lines[0]
    return lines[0]


# -- submit ----------------------------------------------------------------------------------


def test_submit_prints_the_id(cli: Any) -> None:
    res = cli("submit", "open the settings app")
    assert res.exit_code == 0, res.stderr
    tid = res.stdout.strip()
    assert len(res.stdout.splitlines()) == 1
    t = cli.fleet.client.get(tid)
    assert (t.status, t.goal) == (TaskStatus.queued, "open the settings app")


def test_submit_json_with_constraints_and_idempotency(cli: Any) -> None:
    args = (
        "submit",
        "take a photo",
        "--driver-type",
        "android",
        "--tag",
        "wifi",
        "--tag",
        "camera",
        "--max-attempts",
        "5",
        "--idempotency-key",
        "photo-1",
        "--json",
    )
    res = cli(*args)
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert set(data) >= DESIGN_FIELDS
    assert (
        data["status"],
        data["goal"],
        data["driver_type"],
        data["tags"],
        data["max_attempts"],
        data["attempt"],
    ) == ("queued", "take a photo", "android", ["camera", "wifi"], 5, 0)
    again = json.loads(cli(*args).stdout)
    assert again["id"] == data["id"]
    assert cli("submit", "x", "--idempotency-key", "photo-1").stdout.strip() == data["id"]


def test_submit_workflow(cli: Any) -> None:
    cli.fleet.client.put_workflow({"name": "smoke", "steps": [{"goal": "one"}]})
    data = json.loads(cli("submit", "--workflow", "smoke", "--json").stdout)
    assert (data["kind"], data["workflow"], data["goal"]) == ("workflow", "smoke", None)
    line = one_error_line(cli("submit", "--workflow", "nope"))
    assert "nope" in line


@pytest.mark.parametrize(
    "args",
    [
        ("submit", "g", "--tag", "a:b"),
        ("submit", "g", "--tag", "{x}"),
        ("submit", ""),
        ("submit",),
        ("submit", "g", "--driver-type", "a b"),
        ("submit", "x" * 20000),
        ("submit", "g", "--idempotency-key", "k*"),
    ],
)
def test_submit_bad_input_one_line_nothing_written(cli: Any, args: tuple[str, ...]) -> None:
    r = cli.fleet.r
    before = sorted(r.scan_iter(match=f"dq:{{{cli.fleet.pool}}}:*"))
    one_error_line(cli(*args))
    assert sorted(r.scan_iter(match=f"dq:{{{cli.fleet.pool}}}:*")) == before


def test_submit_queue_full(cli: Any) -> None:
    assert cli("config", "set", "max_queue_depth", "1").exit_code == 0
    assert cli("submit", "a").exit_code == 0
    line = one_error_line(cli("submit", "b"))
    assert "QueueFull" in line and "max_queue_depth" in line


# -- task show / list / cancel -------------------------------------------------------------------


def test_task_show_json_all_fields_and_attempts(cli: Any) -> None:
    f = cli.fleet
    h = f.add_host("h1", ("d1", "android", ()))
    f.admin.set_config("claim_ttl", 1)
    tid = cli("submit", "g", "--max-attempts", "3").stdout.strip()
    f.store.commit([(tid, "d1")])
    time.sleep(1.2)
    f.store.expire()
    f.beat()
    f.admin.set_config("claim_ttl", 30)
    lease = f.store.commit([(tid, "d1")])[0][3:]
    h.claim(1)
    h.report(tid, lease, "done", None, "the result")
    res = cli("task", "show", tid, "--json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert set(data) >= DESIGN_FIELDS
    assert (
        data["id"],
        data["status"],
        data["result"],
        data["attempt"],
        data["host_id"],
        data["device_id"],
        data["lease_id"],
    ) == (tid, "done", "the result", 2, "h1", "d1", lease)
    assert data["submitted_at"] <= data["updated_at"]
    assert [a["outcome"] for a in data["attempts"]] == ["expired", "done"]
    assert all(set(a) >= ATTEMPT_FIELDS for a in data["attempts"])
    assert data["attempts"][0]["failure_kind"] == "lease_expired"
    text = cli("task", "show", tid)
    assert text.exit_code == 0 and tid in text.stdout and "attempts" in text.stdout
    assert "NotFound" in one_error_line(cli("task", "show", "nosuchtask"))
    one_error_line(cli("task", "show", "bad:id"))


def test_task_list_by_status(cli: Any) -> None:
    ids = [cli("submit", f"g{i}").stdout.strip() for i in range(3)]
    cli("task", "cancel", ids[1])
    queued = json.loads(cli("task", "list", "--status", "queued", "--json").stdout)
    assert [t["id"] for t in queued] == [ids[0], ids[2]]
    cancelled = json.loads(cli("task", "list", "--status", "cancelled", "--json").stdout)
    assert [t["id"] for t in cancelled] == [ids[1]]
    every = json.loads(cli("task", "list", "--json").stdout)
    assert {t["id"] for t in every} == set(ids)
    table = cli("task", "list", "--status", "queued")  # not a terminal: 80 columns
    assert table.exit_code == 0
    assert ids[0] in table.stdout and ids[2] in table.stdout, "ids are shown whole (copyable)"
    assert cli("task", "list", "--status", "sleeping").exit_code == 2


def test_task_cancel(cli: Any) -> None:
    f = cli.fleet
    f.add_host("h1", ("d1", "android", ()))
    queued = cli("submit", "q").stdout.strip()
    running = cli("submit", "r").stdout.strip()
    f.store.commit([(running, "d1")])
    f.host("h1").claim(1)
    res = cli("task", "cancel", queued)
    assert res.exit_code == 0 and "cancelled" in res.stdout
    assert f.client.get(queued).status is TaskStatus.cancelled
    res = cli("task", "cancel", running)
    assert res.exit_code == 0 and "requested" in res.stdout
    assert f.client.get(running).cancel_requested
    res = cli("task", "cancel", queued)
    assert res.exit_code == 0 and "already" in res.stdout
    assert "NotFound" in one_error_line(cli("task", "cancel", "nosuchtask"))


# -- task wait ------------------------------------------------------------------------------------


def _finish(cli: Any, outcome: str) -> str:
    f = cli.fleet
    if "h1" not in f.tokens:
        f.add_host("h1", ("d1", "android", ()))
    tid = cli("submit", "g").stdout.strip()
    if outcome == "cancelled":
        cli("task", "cancel", tid)
        return tid
    lease = f.store.commit([(tid, "d1")])[0][3:]
    f.host("h1").claim(1)
    kind = "runner_failed" if outcome == "failed" else None
    assert f.host("h1").report(tid, lease, outcome, kind, "out").startswith("ok:")
    return tid


def test_task_wait_exit_codes(cli: Any) -> None:
    done = _finish(cli, "done")
    res = cli("task", "wait", done, "--timeout", "5")
    assert res.exit_code == 0 and f"{done} done" in res.stdout
    assert json.loads(cli("task", "wait", done, "--json").stdout)["status"] == "done"
    failed = _finish(cli, "failed")
    res = cli("task", "wait", failed, "--timeout", "5")
    assert res.exit_code == 1 and "failed" in res.stdout and "runner_failed" in res.stdout
    cancelled = _finish(cli, "cancelled")
    assert cli("task", "wait", cancelled, "--timeout", "5").exit_code == 1
    waiting = cli("submit", "never runs").stdout.strip()
    started = time.monotonic()
    res = cli("task", "wait", waiting, "--timeout", "0.5")
    assert res.exit_code == 124
    assert 0.4 <= time.monotonic() - started < 5
    one_error_line(res)


def test_task_wait_subprocess_returns_when_done(cli: Any, redis_server: Any) -> None:
    f = cli.fleet
    h = f.add_host("h1", ("d1", "android", ()))
    tid = cli("submit", "g").stdout.strip()
    lease = f.store.commit([(tid, "d1")])[0][3:]
    h.claim(1)
    proc = subprocess.Popen(
        [
            console_script(),
            "--redis-url",
            redis_server.url,
            "--pool",
            f.pool,
            "task",
            "wait",
            tid,
            "--timeout",
            "30",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.5)
        assert proc.poll() is None, "wait blocks while the task runs"
        timer = threading.Timer(0.1, lambda: h.report(tid, lease, "done", None, "ok"))
        timer.start()
        out, err = proc.communicate(timeout=20)
        timer.join()
        assert proc.returncode == 0, err
        assert f"{tid} done" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


# -- host add -------------------------------------------------------------------------------------


def test_host_add(cli: Any) -> None:
    f = cli.fleet
    res = cli("host", "add", "lab-1", "--json")
    assert res.exit_code == 0, res.stderr
    data = json.loads(res.stdout)
    assert set(data) == {"host_id", "token"} and data["host_id"] == "lab-1"
    h = HostClient(f.r, f.pool, "lab-1", data["token"])
    assert h.heartbeat([]).devices == 0
    plain = cli("host", "add", "lab-2")
    assert plain.exit_code == 0 and len(plain.stdout.split()) == 1
    HostClient(f.r, f.pool, "lab-2", plain.stdout.strip()).heartbeat([])
    line = one_error_line(cli("host", "add", "lab-1"))
    assert "AlreadyExists" in line and data["token"] not in line
    one_error_line(cli("host", "add", "bad host"))


# -- config ---------------------------------------------------------------------------------------


def test_config_get_set(cli: Any) -> None:
    for key, value in (
        ("max_queue_depth", "50000"),
        ("max_attempts", "4"),
        ("claim_ttl", "12.5"),
        ("lease_ttl", "90"),
    ):
        res = cli("config", "set", key, value)
        assert res.exit_code == 0, res.stderr
        assert res.stdout.split()[0] == key and float(res.stdout.split()[1]) == float(value)
        got = cli("config", "get", key)
        assert got.exit_code == 0 and float(got.stdout.strip()) == float(value)
    every = json.loads(cli("config", "get", "--json").stdout)
    assert {"max_queue_depth", "max_attempts", "claim_ttl", "lease_ttl"} <= set(every)
    assert every["lease_ttl"] == 90
    before = cli.fleet.admin.get_config()
    for key, value in (
        ("lease_ttl", "0"),
        ("max_queue_depth", "lots"),
        ("max_attempts", "0"),
        ("no_such_key", "1"),
    ):
        line = one_error_line(cli("config", "set", key, value))
        assert key in line
    assert cli.fleet.admin.get_config() == before
    one_error_line(cli("config", "get", "no_such_key"))
    # the pool default applies to submissions
    tid = cli("submit", "g").stdout.strip()
    assert cli.fleet.client.get(tid).max_attempts == 4


# -- global options and environment ---------------------------------------------------------------


def test_pool_and_url_from_options_and_environment(real_fleet: Any, redis_server: Any) -> None:
    exe = console_script()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("DEVICEQ_")}
    env = {**base_env, "DEVICEQ_REDIS_URL": redis_server.url, "DEVICEQ_POOL": real_fleet.pool}
    res = subprocess.run(
        [exe, "submit", "from env"], capture_output=True, text=True, env=env, timeout=60
    )
    assert res.returncode == 0, res.stderr
    assert real_fleet.client.get(res.stdout.strip()).goal == "from env"
    # options win over the environment
    other = real_fleet.pool + "b"
    res = subprocess.run(
        [exe, "--pool", other, "submit", "from option"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    tid = res.stdout.strip()
    assert real_fleet.r.hget(f"dq:{{{other}}}:task:{tid}", "goal") == "from option"
    assert not real_fleet.r.exists(f"dq:{{{real_fleet.pool}}}:task:{tid}")
    res = subprocess.run(
        [exe, "--redis-url", redis_server.url, "--pool", real_fleet.pool, "task", "show", tid],
        capture_output=True,
        text=True,
        env=base_env,
        timeout=60,
    )
    assert res.returncode != 0 and "NotFound" in res.stderr
    res = subprocess.run(
        [exe, "--pool", "bad pool", "submit", "x"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert res.returncode != 0 and len(res.stderr.strip().splitlines()) == 1
    dead = f"redis://127.0.0.1:{free_port()}/0"
    res = subprocess.run(
        [exe, "--redis-url", dead, "submit", "x"],
        capture_output=True,
        text=True,
        env=base_env,
        timeout=60,
    )
    assert res.returncode != 0
    assert len(res.stderr.strip().splitlines()) == 1 and "Redis" in res.stderr


def test_every_core_command_has_help_with_an_example(cli: Any) -> None:
    for args in (
        ("submit",),
        ("task", "show"),
        ("task", "list"),
        ("task", "cancel"),
        ("task", "wait"),
        ("host", "add"),
        ("config", "get"),
        ("config", "set"),
    ):
        res = cli(*args, "--help")
        assert res.exit_code == 0 and "Example" in res.stdout, args
