"""A test run that is stopped leaves no process behind: a real pytest session (this suite's
conftest and its ``deploy`` fixture: a private redis-server, a scheduler and a host daemon
running a task's command) is ended mid-test by SIGTERM, by SIGKILL, by pytest-timeout's
thread method (``os._exit``) and, under pytest-xdist, by a SIGKILL of its worker; then no
process it started is alive."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from harness import REPO_DIR, wait_for

pytestmark = pytest.mark.slow

INNER = """
import os
import time
from pathlib import Path

from harness import wait_for


def test_runs_daemons(deploy):
    deploy.scheduler()
    deploy.command_host("h1", "d1:android")
    tid = deploy.client.submit("sleep 300", driver_type="android")
    wait_for(lambda: deploy.status(tid).value == "dispatched", 60, "the task to run")
    Path(os.environ["DQTEST_READY"]).write_text("ready")
    time.sleep(600)
"""


def tagged(tag: str) -> list[int]:
    """Live processes whose environment holds ``DQTEST_OUTER=tag`` (the inner run and all it
    started)."""
    needle = f"DQTEST_OUTER={tag}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z" and needle in (entry / "environ").read_bytes().split(b"\0"):
                    out.append(int(entry.name))
    return out


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "?"


def stat_of(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command (state first), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def children_of(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := stat_of(int(entry.name))) and int(fields[1]) == pid:
            out.append(int(entry.name))
    return out


def family(root: int) -> list[int]:
    """``root`` and every live descendant (redis-server writes over its environment: it is
    found as a child of its run)."""
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children_of(pid)
    return out


def alive(pid: int, started: str) -> bool:
    """Is the process ``pid`` that started at ``started`` still running (not a zombie)?"""
    fields = stat_of(pid)
    return fields is not None and fields[0] not in ("Z", "X") and fields[19] == started


@pytest.mark.parametrize("how", ["sigterm", "sigkill", "timeout", "xdist-worker-sigkill"])
def test_a_stopped_run_leaves_no_process_behind(tmp_path: Path, how: str) -> None:
    inner = tmp_path / "test_inner_run.py"
    inner.write_text(INNER)
    ready = tmp_path / "ready"
    tag = uuid.uuid4().hex
    ini = str(Path(REPO_DIR) / "pyproject.toml")
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
            "--rootdir", REPO_DIR, "-c", ini, str(inner)]  # fmt: skip
    if how == "timeout":
        args += ["--timeout", "20", "-o", "timeout_method=thread"]
    if how == "xdist-worker-sigkill":
        args += ["-n", "1"]
    env = {**os.environ, "DQTEST_OUTER": tag, "DQTEST_READY": str(ready)}
    log = (tmp_path / "inner.log").open("wb")
    run = subprocess.Popen(args, cwd=REPO_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
                           stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    started: dict[int, str] = {}
    try:
        wait_for(lambda: ready.exists() or run.poll() is not None, 90, "the inner test to run")
        assert ready.exists(), (tmp_path / "inner.log").read_text()
        started = {p: fields[19] for p in {*tagged(tag), *family(run.pid)}
                   if (fields := stat_of(p))}  # fmt: skip
        started.pop(run.pid)  # (ours to wait for: a zombie until then)
        commands = " | ".join(command_of(p) for p in started)
        # pytest (and its worker), redis-server, the scheduler, the host, the task's command
        assert len(started) >= 5, commands
        assert "redis-server" in commands and "sleep 300" in commands, commands
        if how == "sigterm":
            run.send_signal(signal.SIGTERM)
        elif how == "sigkill":
            run.kill()
        elif how == "xdist-worker-sigkill":
            # (execnet starts a worker as ``python -c "...exec(eval(sys.stdin.readline()))"``)
            workers = [p for p in children_of(run.pid) if "sys.stdin" in command_of(p)]
            assert workers, [command_of(p) for p in children_of(run.pid)]
            for pid in workers:
                os.kill(pid, signal.SIGKILL)
            run.wait(60)  # (the run notices its lost worker and ends)
        # timeout: pytest-timeout ends the process with os._exit after 20 s
        run.wait(60)
        wait_for(lambda: not tagged(tag) and not any(alive(p, t) for p, t in started.items()),
                 20, "every process the run started to end")  # fmt: skip
    finally:  # (whatever happened above: nothing of the inner run is left running)
        log.close()
        with contextlib.suppress(ProcessLookupError):
            run.kill()
        run.wait(10)
        for pid in [*tagged(tag), *(p for p, t in started.items() if alive(p, t))]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
