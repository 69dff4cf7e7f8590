"""Rough edges of the command line (issue 15), each as a user meets it: piped tables are whole,
shell completion is printed by ``deviceq completion``, ``config get`` marks defaults, JSON log
lines carry their timezone."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from deviceq import TaskStatus
from deviceq.scheduler import TaskScheduler
from harness import deviceq

LONG_GOAL = "flash the build then run the whole smoke suite on the device and keep its logcat"


def test_piped_tables_are_never_cut(real_fleet: Any, redis_url: str) -> None:
    """At 80 columns `task list` cut the failure column and the goal; `task show` squeezed
    timestamps to `2026-…`. Piped, every column and every value is whole."""
    fleet = real_fleet
    h = fleet.add_host("h1", ("d1", "android", ("wifi",)))
    tid = fleet.client.submit(LONG_GOAL, driver_type="android", tags=["wifi"], max_attempts=1)
    TaskScheduler(fleet.admin, owner="edges").assign()
    (a,) = h.claim(1)
    assert h.report(tid, a.lease_id, "failed", "runner_failed", "exit 3") == "ok:failed"

    out = deviceq(redis_url, fleet.pool, "task", "list").stdout
    header = next(ln for ln in out.splitlines() if " id " in ln)
    assert "failure" in header and "device" in header, out
    row = next(ln for ln in out.splitlines() if tid in ln)
    assert LONG_GOAL in row and "runner_failed" in row and "…" not in row, out

    show = deviceq(redis_url, fleet.pool, "task", "show", tid).stdout
    assert "…" not in show, show
    assert LONG_GOAL in show and "exit 3" in show
    stamps = re.findall(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d", show)
    assert len(stamps) >= 3, show  # submitted, assigned, ended... whole, not squeezed
    assert fleet.client.get(tid).status is TaskStatus.failed


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_prints_the_shell_script(redis_url: str, shell: str) -> None:
    res = deviceq(redis_url, "p", "completion", shell)
    assert res.returncode == 0, res.stderr
    assert "_DEVICEQ_COMPLETE" in res.stdout and f"{shell}_complete" in res.stdout


def test_bash_completion_completes_commands_and_choices(redis_url: str) -> None:
    """The printed script, sourced by a real bash, completes a subcommand and an option's
    choices (through the installed console script)."""
    exe_dir = Path(sys.executable).parent
    script = (
        'eval "$(deviceq completion bash)"\n'
        "COMP_WORDS=(deviceq ta); COMP_CWORD=1; COMPREPLY=(); _deviceq_completion deviceq\n"
        'echo "1:${COMPREPLY[*]}"\n'
        "COMP_WORDS=(deviceq task list --status d); COMP_CWORD=4; COMPREPLY=()\n"
        '_deviceq_completion deviceq; echo "2:${COMPREPLY[*]}"\n'
    )
    env = {**os.environ, "PATH": f"{exe_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    res = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert res.returncode == 0, res.stderr
    lines = dict(ln.split(":", 1) for ln in res.stdout.splitlines() if ln[:2] in ("1:", "2:"))
    assert lines["1"].split() == ["task"], res.stdout
    assert sorted(lines["2"].split()) == ["dispatched", "done"], res.stdout


def test_completion_of_an_unknown_shell_is_a_usage_error(redis_url: str) -> None:
    res = deviceq(redis_url, "p", "completion", "tcsh")
    assert res.returncode == 2 and res.stdout == ""
    assert "'tcsh' is not one of 'bash', 'zsh', 'fish'" in res.stderr


def test_config_get_shows_every_setting_and_marks_defaults(real_fleet: Any, redis_url: str) -> None:
    pool = real_fleet.pool
    assert deviceq(redis_url, pool, "config", "set", "lease_ttl", "45").returncode == 0
    out = deviceq(redis_url, pool, "config", "get").stdout.splitlines()
    rows = {ln.split()[0]: ln.split()[1:] for ln in out}
    every = json.loads(deviceq(redis_url, pool, "config", "get", "--json").stdout)
    assert set(rows) == set(every)  # every setting, defaults included
    assert rows["lease_ttl"] == ["45.0"]  # set: not marked
    assert rows["claim_ttl"][1:] == ["(default)"] and rows["max_attempts"][1:] == ["(default)"]
    assert deviceq(redis_url, pool, "config", "get", "lease_ttl").stdout.strip() == "45.0"


def test_json_log_lines_carry_their_timezone(real_fleet: Any, redis_url: str) -> None:
    res = deviceq(redis_url, real_fleet.pool, "--log-format", "json", "scheduler", "run", "--once")
    assert res.returncode == 0, res.stderr
    lines = [json.loads(ln) for ln in res.stderr.splitlines() if ln.startswith("{")]
    assert lines, res.stderr
    for d in lines:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d", d["ts"]), d


def test_several_pools_are_refused_by_one_pool_commands(redis_url: str) -> None:
    exe = Path(sys.executable).parent / "deviceq"
    res = subprocess.run(
        [str(exe), "--redis-url", redis_url, "--pool", "a", "--pool", "b", "status"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and res.stdout == ""
    assert "--pool was given 2 times: only `deviceq scheduler run` serves several" in res.stderr
    res = subprocess.run(
        [str(exe), "--redis-url", redis_url, "--pool", "a", "--pool", "b", "scheduler", "run",
         "--metrics-port", "9999"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 1 and "--metrics-port serves one pool" in res.stderr


def test_status_all_pools_on_a_standalone_server(redis_url: str) -> None:
    """Every pool of the server in a line (found by its event stream, scanned in steps)."""
    for pool, n in (("edges-a", 2), ("edges-b", 1)):
        assert deviceq(redis_url, pool, "host", "add", "h1").returncode == 0
        for _ in range(n):
            assert deviceq(redis_url, pool, "submit", "x").returncode == 0
    r = redis.Redis.from_url(redis_url)
    r.xadd("dq:{bad pool}:events", {"type": "x"})  # a name deviceq refuses
    r.xadd("dq:{edges-c}:events", {"type": "x"})
    r.set("dq:{edges-c}:hosts", "not a set")  # a key of the wrong type
    res = deviceq(redis_url, "default", "status", "--all-pools", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    rows = {p["pool"]: p for p in data["pools"]}
    assert rows["bad pool"]["error"].startswith("InvalidInput")
    assert rows["edges-c"]["error"].startswith("ResponseError: WRONGTYPE")
    assert data["cluster"] is False
    assert rows["edges-a"]["counts"]["queued"] == 2 and rows["edges-b"]["counts"]["queued"] == 1
    assert rows["edges-a"]["hosts"] == 1 and rows["edges-a"]["leader"] is None
