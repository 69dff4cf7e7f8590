"""Rough edges of the command line, each as a user meets it: piped tables are whole,
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
    want = "--pool was given 2 times: only `deviceq scheduler run` and `deviceq host run` serve"
    assert want in res.stderr
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


# -- global options anywhere, no empty files, pool typos, standby, drain, events -----
EXE = Path(sys.executable).parent / "deviceq"


def run_dq(*args: str, stdin: Any = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    """The console script with exactly these arguments (global options wherever they are)."""
    return subprocess.run(
        [str(EXE), *args], capture_output=True, text=True, timeout=60, stdin=stdin,
        env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip


def pool_dump(r: redis.Redis, pool: str) -> dict[bytes, bytes | None]:
    """Every key of a pool with its DUMP (test only: a SCAN of the private server)."""
    raw = redis.Redis(connection_pool=r.connection_pool.__class__(
        **{**r.connection_pool.connection_kwargs, "decode_responses": False}))  # fmt: skip
    try:
        return {k: raw.dump(k) for k in raw.scan_iter(match=f"dq:{{{pool}}}:*", count=1000)}
    finally:
        raw.close()


def test_global_options_after_the_subcommand_override_those_before(
    real_fleet: Any, redis_url: str
) -> None:
    """`deviceq host add lab-1 --redis-url ... --pool ...` used to fail (no such option)."""
    pool = real_fleet.pool
    res = run_dq("host", "add", "lab-1", "--redis-url", redis_url, "--pool", pool)
    assert res.returncode == 0, res.stderr
    assert [h.host_id for h in real_fleet.admin.hosts()] == ["lab-1"]
    # given before and after: after wins (a dead URL and another pool before)
    res = run_dq("--redis-url", "redis://127.0.0.1:1/0", "--pool", "elsewhere",
                 "host", "list", "--json", "--pool", pool, "--redis-url", redis_url)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert [h["host_id"] for h in json.loads(res.stdout)] == ["lab-1"]
    # on a sub-group too, and through the environment only before
    res = run_dq("task", "--redis-url", redis_url, "--pool", pool, "list", "--json")
    assert res.returncode == 0 and json.loads(res.stdout) == [], res.stderr
    res = run_dq("task", "list", "--pool", "bad pool!", "--redis-url", redis_url)
    assert res.returncode == 1 and "invalid pool name 'bad pool!'" in res.stderr
    helptext = run_dq("host", "add", "--help").stdout
    assert "Global options" in helptext and "--redis-url" in helptext and "--pool" in helptext
    assert "--output" in helptext


def test_no_output_file_on_error(real_fleet: Any, redis_url: str, tmp_path: Path) -> None:
    """A token goes to -o FILE only once the host exists: a failure leaves no (empty) file,
    and an existing file is not touched."""
    pool = real_fleet.pool
    tok = tmp_path / "lab-1.token"
    res = run_dq("host", "add", "lab-1", "-o", str(tok), "--redis-url", redis_url, "--pool", pool)
    assert res.returncode == 0 and res.stdout == "", res.stderr
    assert tok.stat().st_mode & 0o777 == 0o600
    assert real_fleet.admin.rotate_token("lab-1")  # the file's token was real (now replaced)
    again = tmp_path / "again.token"
    res = run_dq("host", "add", "lab-1", "-o", str(again), "--redis-url", redis_url,
                 "--pool", pool)  # fmt: skip
    assert res.returncode == 1 and "AlreadyExists" in res.stderr
    assert not again.exists()
    tok.write_text("keep me\n")
    res = run_dq("host", "rotate-token", "nosuch", "-o", str(tok), "--redis-url", redis_url,
                 "--pool", pool)  # fmt: skip
    assert res.returncode == 1 and tok.read_text() == "keep me\n"
    res = run_dq("host", "rotate-token", "lab-1", "-o", str(tok), "--json",
                 "--redis-url", redis_url, "--pool", pool)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert json.loads(tok.read_text())["host_id"] == "lab-1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lab-1.token"]  # no temp file left
    res = run_dq("host", "add", "lab-2", "-o", str(tmp_path / "no" / "dir.token"),
                 "--redis-url", redis_url, "--pool", pool)  # fmt: skip
    assert res.returncode == 1 and "cannot write" in res.stderr


def test_a_typo_in_pool_warns(real_fleet: Any, redis_url: str) -> None:
    pool = real_fleet.pool
    assert deviceq(redis_url, pool, "submit", "x").stderr == ""  # submit creates work: no warning
    for args in (("task", "list"), ("status",), ("device", "list"), ("host", "list"),
                 ("events",), ("scheduler", "run", "--once")):  # fmt: skip
        ok = deviceq(redis_url, pool, *args)
        assert ok.returncode == 0 and "warning: pool" not in ok.stderr, (args, ok.stderr)
        typo = deviceq(redis_url, pool + "x", *args)
        assert f"warning: pool '{pool}x' has no hosts, devices or tasks" in typo.stderr, args
    # a --once run takes the leader lease (it writes leader keys and events), not a pool
    res = deviceq(redis_url, pool + "x", "task", "show", "0123456789abcdef")
    assert "warning: pool" in res.stderr and "NotFound" in res.stderr


def test_once_while_another_leads_says_so_and_force_pass_writes_nothing(
    real_fleet: Any, redis_url: str
) -> None:
    f = real_fleet
    f.add_host("h1", ("d1", "android", ("wifi",)), ("d2", "android", ()))
    ids = [f.client.submit(f"g{i}", driver_type="android") for i in range(3)]
    other = TaskScheduler(f.admin, owner="other-sched")
    assert other.try_lead(60_000)
    res = deviceq(redis_url, f.pool, "scheduler", "run", "--once")
    assert res.returncode == 0, res.stderr
    assert "other-sched (epoch 1) leads pool" in res.stderr and "did nothing" in res.stderr
    assert [t.status for t in f.client.get_many(ids)] == [TaskStatus.queued] * 3

    before, events_before = pool_dump(f.r, f.pool), f.r.xlen(f.client.keys.events)
    res = deviceq(redis_url, f.pool, "scheduler", "run", "--force-pass")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [f"{ids[0]} -> d1 (host h1)", f"{ids[1]} -> d2 (host h1)"]
    assert "nothing written" in res.stderr
    plan = json.loads(deviceq(redis_url, f.pool, "scheduler", "run", "--force-pass",
                              "--json").stdout)  # fmt: skip
    assert plan["leader"] == {"owner": "other-sched", "epoch": 1}
    assert [(p["task_id"], p["device_id"]) for p in plan["would_assign"]] == [
        (ids[0], "d1"), (ids[1], "d2")]  # fmt: skip
    assert pool_dump(f.r, f.pool) == before  # not one key written, created or deleted
    assert f.r.xlen(f.client.keys.events) == events_before
    assert [t.status for t in f.client.get_many(ids)] == [TaskStatus.queued] * 3
    res = deviceq(redis_url, f.pool, "scheduler", "run", "--json")
    assert res.returncode == 2 and "--json goes with --force-pass" in res.stderr


def test_device_list_shows_a_draining_host(real_fleet: Any, redis_url: str) -> None:
    f = real_fleet
    f.add_host("h1", ("d1", "android", ()), ("d2", "android", ()))
    f.add_host("h2", ("d3", "android", ()))
    tid = f.client.submit("busy one", driver_type="android")
    TaskScheduler(f.admin, owner="edges").assign()  # d1 reserved
    assert deviceq(redis_url, f.pool, "host", "drain", "h1").returncode == 0
    out = deviceq(redis_url, f.pool, "device", "list").stdout
    rows = {ln.split()[1]: ln for ln in out.splitlines() if ln.split()[1:2] in (["d1"], ["d2"],
            ["d3"])}  # fmt: skip
    # (a leased device shows assigned, then running: device list names what its lease does)
    assert any(f"{w} (draining)" in rows["d1"] for w in ("assigned", "running"))
    assert tid in rows["d1"]
    assert "idle (draining)" in rows["d2"]
    assert "idle" in rows["d3"] and "draining" not in rows["d3"]
    data = {d["device_id"]: d for d in json.loads(
        deviceq(redis_url, f.pool, "device", "list", "--json").stdout)}  # fmt: skip
    assert data["d1"]["host_draining"] is True and data["d2"]["host_draining"] is True
    assert data["d3"]["host_draining"] is False
    assert data["d2"]["effective_state"] == "draining" and data["d2"]["state"] == "idle"


def test_events_are_typed_like_the_task_json(real_fleet: Any, redis_url: str) -> None:
    """Events used to say "attempt": "1", "failure_kind": "" where the task says 1 and null."""
    f = real_fleet
    h = f.add_host("h1", ("d1", "android", ()))
    tid = f.client.submit("one", max_attempts=2)
    TaskScheduler(f.admin, owner="edges").assign()
    (a,) = h.claim(1)
    assert h.report(tid, a.lease_id, "done", payload="ok") == "ok:done"
    task = json.loads(deviceq(redis_url, f.pool, "task", "show", tid, "--json").stdout)
    evs = json.loads(deviceq(redis_url, f.pool, "events", "--task", tid, "--json").stdout)
    assert [e["type"] for e in evs] == ["submitted", "assigned", "dispatched", "done"]
    done = evs[-1]
    assert done["attempt"] == task["attempt"] == 1
    assert done["failure_kind"] is None and task["failure_kind"] is None
    for name in ("task_id", "lease_id", "host_id", "device_id"):
        assert done[name] == task[name if name != "task_id" else "id"], name
    assert isinstance(evs[1]["queued_ms"], int) and isinstance(evs[2]["claim_ms"], int)
    assert all(isinstance(e["time_ms"], int) for e in evs)
    # --follow prints the same model, and so does the Python API
    api = [e.as_dict() for e in f.client.events(task=tid)]
    assert api == evs
    assert TaskScheduler(f.admin, owner="edges").try_lead(5000)
    (elected,) = [e for e in f.client.events() if e.type == "leader_elected"]
    assert elected.data == {"owner": "edges", "epoch": 1} and elected.fields["epoch"] == "1"


def test_config_set_takes_a_negative_value_as_the_value(redis_url: str, pool: str) -> None:
    """`config set aging_seconds -1` used to fail with "No such option '-1'" (a value that
    looks like an option needed `--`): it is the value, refused by the setting's validation,
    and nothing is stored; a valid value is stored."""
    bad = deviceq(redis_url, pool, "config", "set", "aging_seconds", "-1")
    assert bad.returncode == 1 and "No such option" not in bad.stderr, bad.stderr
    assert "aging_seconds" in bad.stderr and "greater than or equal to 0" in bad.stderr
    got = deviceq(redis_url, pool, "config", "get", "--json").stdout
    assert json.loads(got)["aging_seconds"] != -1
    ok = deviceq(redis_url, pool, "config", "set", "aging_seconds", "5")
    assert ok.returncode == 0 and ok.stdout.strip() == "aging_seconds 5.0"


@pytest.mark.parametrize(
    ("args", "message", "where"),
    [
        (["task", "show", "abc", "--bogus"], "No such option '--bogus'.", "deviceq task show"),
        (["task", "show"], "Missing argument 'TASK_ID'.", "deviceq task show"),
        (
            ["task", "list", "--limit", "0"],
            "Invalid value for '--limit': 0 is not in the range 1<=x<=10000.",
            "deviceq task list",
        ),
        (["--bogus", "status"], "No such option '--bogus'.", "deviceq"),
        (["tsak", "show"], "No such command 'tsak'. Did you mean 'task'?", "deviceq"),
    ],
)
def test_a_usage_error_is_one_line_naming_the_help_to_read(
    redis_url: str, args: list[str], message: str, where: str
) -> None:
    """A bad option printed Usage/Try/blank/Error (four lines); now one line on stderr, the
    message and where to read the command's options, and exit code 2 (nothing on stdout)."""
    res = deviceq(redis_url, "edges-usage", *args)
    assert res.returncode == 2, res
    assert res.stdout == ""
    assert res.stderr == f"deviceq: error: {message} (see {where} --help)\n", res.stderr


def test_a_usage_error_a_command_raises_is_one_line_too(redis_url: str) -> None:
    """Raised by the command itself (two ways to select tasks at once), not by the parser."""
    res = deviceq(redis_url, "edges-usage", "task", "cancel", "abc", "--status", "queued")
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.splitlines()  # (after the warning that the pool has nothing in it)
    assert lines[-1] == (
        "deviceq: error: give task ids or filters (--status, --tag...), not both "
        "(see deviceq task cancel --help)"
    ), res.stderr
    assert not [ln for ln in lines if ln.startswith(("Usage:", "Try ", "Error:"))], res.stderr


def test_a_group_without_its_command_still_shows_its_help() -> None:
    from click.testing import CliRunner

    from deviceq.cli import main

    res = CliRunner().invoke(main, ["task"])
    assert res.exit_code == 2 and "Usage:" in res.output and "show" in res.output, res.output
