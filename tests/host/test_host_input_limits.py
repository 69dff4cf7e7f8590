"""A host daemon against hostile or oversized input, as real processes on the real private
Redis: a discovery line nested past any sane depth, a command template that hands the goal to
the device's shell through ``adb exec-out``, live logs of several runs at once against the
host's ``--live-log-budget``, and a ``log.txt`` past ``--log-file-max``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_artifacts import record
from test_device_sources import served

from deviceq import TaskStatus
from harness import Deployment, deviceq, wait_for


def test_a_deeply_nested_discovery_line_is_skipped_and_the_daemon_runs(
    deploy: Deployment, tmp_path: Path
) -> None:
    d = deploy
    script = tmp_path / "discover.sh"
    (tmp_path / "found").write_text("[" * 100_000 + "\n" + '{"a": ' * 50 + "1" + "}" * 50 + "\n"
                                    '{"id": "c1", "driver_type": "x"}\n')  # fmt: skip
    script.write_text(f"#!/bin/sh\ncat {tmp_path / 'found'}\n")
    script.chmod(0o755)
    d.scheduler()
    proc = d.command_host("h1", extra=("--discover", f"command:{script}",
                                       "--discover-every", "0.3"))  # fmt: skip
    wait_for(lambda: served(d.admin, "c1"), 30, "the good line's device served")
    tid = d.client.submit("echo ran", driver_type="x")
    assert d.client.wait(tid, timeout=30).status == TaskStatus.done
    assert proc.poll() is None  # still running
    log = d.log("h1")
    assert "Traceback" not in log and "RecursionError" not in log
    assert "line 1" in log and "line 2" in log and "nested too deeply" in log


def test_adb_exec_out_with_a_raw_goal_is_refused_at_start_as_adb_shell_is(
    deploy: Deployment,
) -> None:
    token = deploy.tmp / "h1.token"
    token.write_text(deploy.admin.add_host("h1"))

    def start(template: str) -> Any:
        return deviceq(deploy.url, deploy.pool, "host", "run", "--host-id", "h1",
                       "--token-file", str(token), "--device", "d1:android",
                       "--command", template)  # fmt: skip

    shell = start("adb -s {device_id} shell {goal}")
    assert shell.returncode != 0 and "adb shell hands its arguments to a shell" in shell.stderr
    for template in ("adb -s {device_id} exec-out {goal}",
                     "timeout 60 adb -s {device_id} exec-in run {goal}"):  # fmt: skip
        out = start(template)
        assert out.returncode == shell.returncode, out.stderr
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "hands its arguments to a shell" in lines[0], out.stderr
        assert "{goal:shell}" in lines[0]
    assert not deploy.admin.host("h1").alive


def stdout_bytes(d: Deployment, tid: str) -> tuple[int, list[str]]:
    rows = [f for _, f in d.r.xrange(d.admin.keys.log(tid, 1))]
    out = sum(len(f["t"].encode()) for f in rows if f["s"] == "stdout")
    return out, [f["t"] for f in rows if f["s"] == "log"]


def test_the_hosts_live_logs_share_a_budget_and_log_txt_is_cut_and_recorded(
    deploy: Deployment, tmp_path: Path
) -> None:
    d = deploy
    state = tmp_path / "state"
    d.scheduler()
    budget = 65536
    d.host("h1", "d1:x", "d2:x", extra=(
        "--goal-runner", "command", "--command", "sh -c {goal}", "--state-dir", str(state),
        "--artifact-store", f"file://{state / 'artifacts'}",
        "--live-log-budget", str(budget), "--log-file-max", "65536"))  # fmt: skip
    # a holds ~29 KB of the budget while it sleeps; b, started meanwhile, gets the rest
    a = d.client.submit("seq 1 6000; sleep 4", driver_type="x")
    wait_for(lambda: stdout_bytes(d, a)[0] == 28893, 30, "a's output streamed")
    b = d.client.submit("seq 1 40000", driver_type="x")
    for tid in (a, b):
        assert d.client.wait(tid, timeout=60).status == TaskStatus.done
    a_out, a_log = stdout_bytes(d, a)
    b_out, b_log = stdout_bytes(d, b)
    assert a_out == 28893 and not a_log
    assert b_out <= budget - a_out and b_out > 30000  # both together within the budget
    assert any("live_log_budget" in line for line in b_log), b_log
    # both ended: the budget is whole again for the next run
    c = d.client.submit("seq 1 12000", driver_type="x")
    assert d.client.wait(c, timeout=60).status == TaskStatus.done
    assert stdout_bytes(d, c) == (sum(len(f"{i}\n") for i in range(1, 12001)), [])
    # b's log.txt: cut at --log-file-max, the cut said in the file and in the record
    wait_for(lambda: record(d, b).get("artifacts"), 30, "b's artifacts recorded")
    kept = (state / "artifacts" / d.pool / b / "1" / "log.txt").read_bytes()
    assert kept.startswith(b"1\n2\n3\n") and len(kept) < 65536 + 200
    assert kept.rstrip().endswith(b"65,536 bytes kept (log_file_max)")
    rec: dict[str, Any] = record(d, b)
    assert "log.txt cut at 65,536 bytes" in (rec.get("artifacts_error") or "")
    entry = next(f for f in rec["artifacts"] if f["name"] == "log.txt")
    assert entry["size"] == len(kept)
    wait_for(lambda: record(d, a).get("artifacts"), 30, "a's artifacts recorded")
    assert not record(d, a).get("artifacts_error")  # a's log.txt whole: nothing cut


def test_bad_byte_limits_exit_2(deploy: Deployment) -> None:
    token = deploy.tmp / "h1.token"
    token.write_text(deploy.admin.add_host("h1"))
    for option, value in (("--live-log-budget", "10"), ("--log-file-max", "many")):
        out = deviceq(deploy.url, deploy.pool, "host", "run", "--host-id", "h1",
                      "--token-file", str(token), "--device", "d1:x", "--command", "true",
                      option, value)  # fmt: skip
        assert out.returncode == 2 and option in out.stderr and "Traceback" not in out.stderr
