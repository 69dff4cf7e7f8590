"""Inputs that agree: one duration syntax for every duration option (plain seconds or units,
``1h30m``), a delay never ends before the time asked (counted by the Redis clock, real
daemons), ``schedule add`` warns of an unknown driver type as ``submit`` does, and a
one-machine lab downloads artifacts without configuring a store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from deviceq import TaskStatus
from deviceq.core.errors import InvalidInput
from deviceq.core.validation import parse_duration_s
from harness import Deployment, deviceq, wait_for


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("1.5", 1.5), ("90s", 90.0), ("5m", 300.0), ("2h", 7200.0), ("1d", 86400.0),
     ("1h30m", 5400.0), ("1m30s", 90.0), ("500ms", 0.5), ("1W", 604800.0), (" 10m ", 600.0)],
)  # fmt: skip
def test_the_one_duration_syntax(text: str, seconds: float) -> None:
    assert parse_duration_s(text) == seconds


@pytest.mark.parametrize("bad", ["", "m", "5x", "-5", "5m-", "1h 30m", "h1", "1.2.3s", "inf"])
def test_what_is_no_duration_is_one_line(bad: str) -> None:
    with pytest.raises(InvalidInput, match="is not a duration") as err:
        parse_duration_s(bad)
    assert "\n" not in str(err.value)


def test_every_duration_option_takes_units(cli: Any, real_fleet: Any) -> None:
    real_fleet.add_host("h1", ("d1", "x", ()))
    res = cli("submit", "g", "--driver-type", "x", "--timeout", "5m", "--queue-timeout", "1h30m",
              "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    task = real_fleet.client.get(json.loads(res.stdout)["id"])
    assert task.timeout == 300.0 and task.queue_deadline is not None
    assert 5_399_000 <= task.queue_deadline - task.submitted_at <= 5_400_000
    for args in (["submit", "g", "--timeout", "5x"], ["submit", "g", "--queue-timeout", "soon"],
                 ["submit", "g", "--delay", "1y"], ["task", "wait", task.id, "--timeout", "1q"],
                 ["submit", "g", "--timeout", "8d"]):  # fmt: skip
        res = cli(*args)
        assert res.exit_code == 2, (args, res.output)
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    res = cli("task", "wait", task.id, "--timeout", "500ms")
    assert res.exit_code == 124, res.output
    res = cli("scheduler", "run", "--once", "--tick", "1m")
    assert res.exit_code == 0, res.output


def test_a_delay_never_ends_before_the_time_asked(deploy: Deployment) -> None:
    """Counted by the Redis clock from the submission: the command line's delay from the
    moment it sends the task (not from its start: it may take seconds to load), within the
    one round trip that reads the server's time first (250 ms allowed for it: a loaded CI
    machine took 54; counted from the command's start, the delay came seconds early)."""
    d = deploy
    d.command_host("h1", "d1:x")
    d.scheduler()
    out = deviceq(d.url, d.pool, "submit", "echo ok", "--driver-type", "x", "--delay", "3s")
    assert out.returncode == 0, out.stderr
    cli_task = out.stdout.strip()
    sec, usec = d.r.time()
    before_ms = int(sec) * 1000 + int(usec) // 1000
    py_task = d.client.submit("echo ok", driver_type="x", delay=2)
    done = {tid: d.client.wait(tid, timeout=60) for tid in (cli_task, py_task)}
    assert all(t.status is TaskStatus.done for t in done.values()), done
    t = done[cli_task]
    early = t.submitted_at + 3000 - t.attempts[0].assigned_at
    assert early <= 250, f"assigned {early} ms before the 3 s asked"
    assert done[py_task].attempts[0].assigned_at >= before_ms + 2000


def test_schedule_add_warns_of_an_unknown_driver_type_as_submit_does(
    cli: Any, real_fleet: Any
) -> None:
    real_fleet.add_host("h1", ("d1", "android", ("wifi",)))
    sub = cli("submit", "g", "--driver-type", "andriod")
    sched = cli("schedule", "add", "nightly", "g", "--cron", "@daily", "--driver-type", "andriod",
                "--tag", "wfii")  # fmt: skip
    assert sub.exit_code == 0 and sched.exit_code == 0, sched.output
    line = "warning: no device has driver type 'andriod' (known: android)"
    assert line in sub.stderr and line in sched.stderr, (sub.stderr, sched.stderr)
    assert "warning: no device has tag 'wfii'" in sched.stderr
    assert "warning" not in cli("schedule", "add", "ok", "g", "--cron", "@daily",
                                "--driver-type", "android").stderr  # fmt: skip


def test_artifacts_download_without_a_store_on_a_one_machine_lab(
    deploy: Deployment, tmp_path: Path
) -> None:
    d = deploy
    xdg = tmp_path / "xdg"  # the lab's user's XDG state folder (nothing configured)
    env = {"XDG_STATE_HOME": str(xdg)}
    d.command_host("h1", "d1:x", env=env)
    d.scheduler()
    tid = d.client.submit('printf report > "$DEVICEQ_ARTIFACTS_DIR/report.txt"', driver_type="x")
    assert d.client.wait(tid, timeout=60).status is TaskStatus.done

    def recorded() -> bool:
        raw = d.r.lindex(d.client.keys.attempts(tid), 0)
        return bool(raw and json.loads(raw).get("artifacts"))

    wait_for(recorded, 30, "the artifacts recorded")
    assert d.admin.config().artifact_store == ""
    into = tmp_path / "down"
    exe = Path(sys.executable).parent / "deviceq"
    res = subprocess.run(
        [str(exe), "--redis-url", d.url, "--pool", d.pool, "task", "artifacts", tid,
         "--download", str(into)],
        capture_output=True, text=True, timeout=60, env={**os.environ, **env},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert (into / "report.txt").read_text() == "report"
    # another machine (another user's state folder): still told what to configure, one line
    res = subprocess.run(
        [str(exe), "--redis-url", d.url, "--pool", d.pool, "task", "artifacts", tid,
         "--download", str(tmp_path / "x")],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "elsewhere")},
    )  # fmt: skip
    assert res.returncode != 0 and "no artifact store" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
