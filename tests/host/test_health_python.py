"""Python health checks: ``host run --health-check DRIVER=python:package.module:callable``
(resolved like a runner when the settings are built; called as ``check(task)`` in a thread of
its own). True / None / an ok Outcome is healthy; False, a failed Outcome or an exception is
unhealthy; a call past ``--health-check-timeout`` makes the device unhealthy and no other check
of it starts until that call returns. Real Redis; the end-to-end tests run real scheduler and
host daemons, which import the checks of a module written to the test's directory."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from deviceq import PoolAdmin, TaskStatus
from deviceq.core.errors import ConfigError
from deviceq.host.health_checks import STOPPED, PythonCheck, PythonCheckSpec, result_of
from deviceq.host.link import HEALTH_OUTPUT_BYTES
from deviceq.host.runners import Outcome, RunnerSpec, Task
from deviceq.host.settings import WorkerSettings
from deviceq.ops.verify import verify
from harness import REPO_DIR, TESTS_PATH, Deployment, deviceq, wait_for

# The checks the daemons import (module ``hc``); HC_DIR is the test's directory: each call
# appends a JSON line to HC_DIR/calls ("start" and "end" edges).
CHECKS = '''
import json, os, time
from pathlib import Path

from deviceq.host.runners import Outcome

DIR = Path(os.environ["HC_DIR"])


def record(task, edge, **extra):
    line = {"edge": edge, "device": task.device_id, "driver": task.driver_type,
            "tags": list(task.tags), "host": task.host_id, "t": time.time(), **extra}
    with open(DIR / "calls", "a") as f:
        f.write(json.dumps(line) + "\\n")


def flag(task):
    """False while DIR/broken-DEVICE exists."""
    record(task, "start", lease_left=task.lease.remaining(), time_left=task.time_left(),
           cancelled=task.cancelled)
    return not (DIR / f"broken-{task.device_id}").exists()


def boom(task):
    token = (DIR / "h1.token").read_text().strip()
    record(task, "start")
    raise OSError(f"adb: no device (token {token})")


class Noisy:
    """A class: instantiated once, without arguments; its call fails with a long text."""

    def __init__(self):
        with open(DIR / "noisy-created", "a") as f:
            f.write("1\\n")

    def __call__(self, task):
        record(task, "start")
        token = (DIR / "h1.token").read_text().strip()
        text = "first line\\n" + "x" * 5000 + f"\\nleaked {token}\\nusb reset failed\\n"
        return Outcome.failure(text)


def hang(task):
    """The first call hangs (ignoring task.cancel) until DIR/release exists; later calls pass."""
    first = not (DIR / "hung-once").exists()
    (DIR / "hung-once").touch()
    record(task, "start")
    while first and not (DIR / "release").exists():
        time.sleep(0.02)
    record(task, "end", cancelled=task.cancelled)
    return True
'''


@pytest.fixture
def checks_dir(tmp_path: Path) -> Path:
    (tmp_path / "hc.py").write_text(CHECKS)
    return tmp_path


def env_for(tmp: Path) -> dict[str, str]:
    return {"HC_DIR": str(tmp), "PYTHONPATH": os.pathsep.join((str(tmp), TESTS_PATH, REPO_DIR))}


def calls(tmp: Path) -> list[dict[str, Any]]:
    p = tmp / "calls"
    return [json.loads(ln) for ln in p.read_text().splitlines()] if p.exists() else []


def starts(tmp: Path, device: str) -> list[dict[str, Any]]:
    return [c for c in calls(tmp) if c["device"] == device and c["edge"] == "start"]


def health(admin: PoolAdmin, did: str) -> str | None:
    h = admin.redis.hget(admin.keys.device(did), "health")
    return str(h) if h else None


def idle(admin: PoolAdmin) -> set[str]:
    return set(admin.redis.zrange(admin.keys.idle, 0, -1))  # type: ignore[arg-type]


def show(cli: Any, did: str) -> dict[str, Any]:
    out = cli("device", "show", did, "--json")
    assert out.exit_code == 0, out.output
    return dict(json.loads(out.stdout))


# -- end to end: real daemons --------------------------------------------------------------------
def test_false_takes_the_device_out_of_service_until_the_callable_returns_true(
    deploy: Deployment, cli: Any, checks_dir: Path
) -> None:
    d, tmp = deploy, checks_dir
    (tmp / "broken-d1").touch()
    d.scheduler()
    d.command_host("h1", "d1:x:usb,lab", "d2:x", env=env_for(tmp), extra=(
        "--health-check", "x=python:hc:flag", "--health-every-seconds", "1",
        "--health-check-timeout", "7"))  # fmt: skip
    wait_for(lambda: health(d.admin, "d1") == "unhealthy", 20, "d1 unhealthy")
    wait_for(lambda: health(d.admin, "d2") == "healthy", 20, "d2 healthy")
    s = show(cli, "d1")
    assert s["health"] == "unhealthy" and s["effective_state"] == "unhealthy"
    assert s["health_reason"] == "check returned False"
    assert s["health_checked_at"] > 0
    assert "d1" not in idle(d.admin)
    # the callable got the device's Task: ids, tags, the host, a clock running out at the
    # timeout, no cancellation
    first = starts(tmp, "d1")[0]
    assert (first["driver"], first["tags"], first["host"]) == ("x", ["lab", "usb"], "h1")
    assert 0 < first["lease_left"] <= 7 and 0 < first["time_left"] <= 7
    assert first["cancelled"] is False
    # while d1 is unhealthy every task runs on d2, and d1 is checked again (every second)
    ids = d.client.submit_many([{"goal": "sleep 0.2", "driver_type": "x"}] * 4)
    done = d.wait_all(ids, 60)
    assert [t.status for t in done] == [TaskStatus.done] * 4
    assert {t.device_id for t in done} == {"d2"}
    wait_for(lambda: len(starts(tmp, "d1")) >= 2, 10, "d1 re-checked")
    # (the re-check may still be running: checking until its result is recorded)
    wait_for(lambda: health(d.admin, "d1") == "unhealthy", 10, "d1 still unhealthy")
    assert "d1" not in idle(d.admin)
    # fixed: the callable returns True, the device is back in service and gets work
    (tmp / "broken-d1").unlink()
    wait_for(lambda: health(d.admin, "d1") == "healthy", 20, "d1 healthy again")
    assert show(cli, "d1")["health_reason"] is None
    d.admin.quarantine("d2", True)
    t = d.client.wait(d.client.submit("true", driver_type="x"), timeout=30)
    assert t.status == TaskStatus.done and t.device_id == "d1"
    assert verify(d.admin).ok


def test_an_exception_or_a_failed_outcome_is_unhealthy_and_never_stores_the_token(
    deploy: Deployment, cli: Any, checks_dir: Path
) -> None:
    d, tmp = deploy, checks_dir
    d.command_host("h1", "e1:boom", "n1:noisy", env=env_for(tmp), extra=(
        "--health-check", "boom=python:hc:boom",
        "--health-check", "noisy=python:hc:Noisy"))  # fmt: skip
    token = (tmp / "h1.token").read_text().strip()
    wait_for(lambda: health(d.admin, "e1") == health(d.admin, "n1") == "unhealthy", 20, "checks")
    e = show(cli, "e1")
    assert e["health_reason"] == "raised OSError: adb: no device (token [host token])"
    out = e["health_output"]
    assert "Traceback (most recent call last)" in out and 'hc.py", line' in out and "boom" in out
    assert out.rstrip().endswith("OSError: adb: no device (token [host token])")
    n = show(cli, "n1")
    assert n["health_reason"] == "usb reset failed"  # the Outcome's last line
    out = n["health_output"]
    assert len(out.encode()) <= HEALTH_OUTPUT_BYTES  # the tail only
    assert out.endswith("usb reset failed\n") and "first line" not in out
    assert "leaked [host token]" in out
    for text in (json.dumps(e), json.dumps(n), d.admin.redis.hget(d.admin.keys.device("e1"),
                                                                  "health_output")):  # fmt: skip
        assert token not in str(text)
    assert not d.tokens_in(d.log("h1")), "the token is in the daemon's log"
    assert "raised OSError: adb: no device (token [host token])" in d.log("h1")
    assert (tmp / "noisy-created").read_text() == "1\n", "the class was instantiated twice"
    assert verify(d.admin).ok


def test_a_call_past_the_timeout_is_unhealthy_and_no_other_check_starts_until_it_returns(
    deploy: Deployment, cli: Any, checks_dir: Path
) -> None:
    d, tmp = deploy, checks_dir
    d.scheduler()
    d.command_host("h1", "d1:x", env=env_for(tmp), extra=(
        "--health-check", "x=python:hc:hang", "--health-check-timeout", "0.5",
        "--health-every-seconds", "0.2"))  # fmt: skip
    started = time.monotonic()
    wait_for(lambda: health(d.admin, "d1") == "unhealthy", 20, "the check timed out")
    s = show(cli, "d1")
    assert s["health_reason"] == "timed out after 0.5 s"
    assert "still running after 0.5 s" in s["health_output"]
    assert "in hang" in s["health_output"], s["health_output"]  # where it hung
    # out of service while the call hangs: a task waits; re-checks are due every 0.2 s, but
    # none starts while the first call has not returned
    tid = d.client.submit("true", driver_type="x")
    time.sleep(2.0)  # a window of ten re-check periods (the assertions below say what ran)
    assert d.status(tid) == TaskStatus.queued
    assert health(d.admin, "d1") == "unhealthy"
    (tmp / "release").touch()
    wait_for(lambda: len(starts(tmp, "d1")) == 2, 20, "the next check, once the call returned")
    wait_for(lambda: health(d.admin, "d1") == "healthy", 20, "d1 healthy")
    edges = [c["edge"] for c in calls(tmp)]
    assert edges[:3] == ["start", "end", "start"], edges  # never two calls at once
    assert calls(tmp)[1]["cancelled"] is True  # it was asked to stop at the timeout
    assert calls(tmp)[1]["t"] - calls(tmp)[0]["t"] >= 2.0
    t = d.client.wait(tid, timeout=30)
    assert t.status == TaskStatus.done and t.device_id == "d1"
    assert time.monotonic() - started < 40
    assert verify(d.admin).ok


def test_bad_python_checks_exit_2_and_touch_nothing(
    redis_url: str, pool: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "hc_broken.py").write_text("raise RuntimeError('no adb here')\n")
    (tmp_path / "hc_needs_args.py").write_text(
        "class Check:\n    def __init__(self, serial):\n        pass\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join((str(tmp_path), TESTS_PATH, REPO_DIR)))
    base = ["host", "run", "--host-id", "h1", "--token", "t" * 32, "--device", "d1:x",
            "--command", "true"]  # fmt: skip
    for check, msg in [
        ("x=python:hc_no_such_module:check", "cannot import runner module 'hc_no_such_module'"),
        ("x=python:os.path:no_such_check", "module 'os.path' has no 'no_such_check'"),
        ("x=python:os:sep", "runner 'os:sep' is not callable"),
        ("x=python:hc_broken:check", "failed to load: RuntimeError: no adb here"),
        ("x=python:hc_needs_args:Check", "cannot create runner 'hc_needs_args:Check'"),
        ("x=python:", "needs an import path"),
        ("x=python:sim", "built-in runner"),
        ("x=python:hc-no-such-entry-point", "unknown runner"),
    ]:
        out = deviceq(redis_url, pool, *base, "--health-check", check)
        assert out.returncode == 2, (check, out.stdout, out.stderr)
        assert msg in out.stderr and "--health-check" in out.stderr, (check, out.stderr)
    # the same in a config file's mapping: refused as any bad setting of a config file is
    # (a ConfigError: exit 1 with one pool)
    cfg = tmp_path / "host.json"
    cfg.write_text(json.dumps({"health_check": {"x": "python:os.path:no_such_check"}}))
    out = deviceq(redis_url, pool, *base, "--config", str(cfg))
    assert out.returncode != 0 and "ConfigError" in out.stderr, (out.stdout, out.stderr)
    assert "--health-check x=python:os.path:no_such_check" in out.stderr, out.stderr
    assert "has no 'no_such_check'" in out.stderr
    r = PoolAdmin(redis_url, pool).redis
    assert not list(r.scan_iter(match=f"dq:{{{pool}}}:*"))


# -- in process: settings and the check's answers -----------------------------------------------
def test_settings_resolve_python_checks_once() -> None:
    s = WorkerSettings(host_id="h1", devices=["d1:x", "d2:y"], goal_runner=RunnerSpec("sim"),
                       health_check=["x=python:os.path:exists", "y=true"])  # fmt: skip
    spec = s.health_check["x"]
    assert isinstance(spec, PythonCheckSpec) and spec.func is os.path.exists
    assert str(spec) == "python:os.path:exists" and s.health_check["y"] == "true"
    # built again from the parsed mapping (a dict after init): passed through, not reloaded
    assert WorkerSettings(host_id="h1", devices=["d1:x"], goal_runner=RunnerSpec("sim"),
                          health_check=s.health_check).health_check == s.health_check  # fmt: skip
    with pytest.raises(ConfigError, match="--health-check x=python:nope_zz:f: cannot import"):
        WorkerSettings(host_id="h1", devices=["d1:x"], goal_runner=RunnerSpec("sim"),
                       health_check={"x": "python:nope_zz:f"})  # fmt: skip


def test_what_a_check_returns() -> None:
    assert result_of(True) == (True, "", "")
    assert result_of(None) == (True, "", "")
    assert result_of(Outcome.success("fine")) == (True, "fine", "")
    assert result_of(False) == (False, "", "check returned False")
    assert result_of(Outcome.failure("a\nno usb\n")) == (False, "a\nno usb\n", "no usb")
    assert result_of(Outcome.failure("")) == (False, "", "check returned a failed Outcome")
    healthy, _, reason = result_of(42)
    assert not healthy and reason.startswith("check returned int")


def task_for(device: str) -> Task:
    return Task(goal="", task_id=f"health-{device}", device_id=device, driver_type="x")


def test_a_closing_daemon_stops_a_running_check() -> None:
    """The daemon's shutdown sets task.cancel: a check that watches it returns at once (its
    result is then ignored by the checker); one that does not is left after term_grace."""
    entered = threading.Event()

    def polite(task: Task) -> bool:
        entered.set()
        task.cancel.wait(30)
        return False

    check = PythonCheck(PythonCheckSpec("t:polite", polite), timeout=30, term_grace=0.5)
    task = task_for("d1")
    threading.Timer(0.2, task.cancel.set).start()
    t0 = time.monotonic()
    assert check(task) == (False, "", "check returned False")
    assert time.monotonic() - t0 < 5 and entered.is_set() and not check.busy("d1")
    release = threading.Event()
    rude = PythonCheck(PythonCheckSpec("t:rude", lambda task: release.wait(30)),
                       timeout=30, term_grace=0.2)  # fmt: skip
    task = task_for("d2")
    threading.Timer(0.2, task.cancel.set).start()
    assert rude(task) == (False, "", STOPPED)
    assert rude.busy("d2")  # still running: no other check of d2 may start
    release.set()
    wait_for(lambda: not rude.busy("d2"), 5, "the call returned")
