"""Live logs: a running task's output streams into its attempt's log (``log:ID:ATTEMPT``,
``lua/log_append.lua``) while it runs; ``deviceq task logs`` prints it (``--follow`` until the
attempt ends, with the exit codes of ``task wait``); the tail kept in the task starts on a line
boundary and says what was cut. End to end on real daemons (``host run`` with a command or a
Python runner, ``scheduler run``) and real Redis."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_api_host import ApiServer, api_host

from deviceq import TaskStatus
from deviceq.core.errors import AuthError
from deviceq.host.log_stream import CHUNK_BYTES, LogChunk
from deviceq.host.runners import TAIL_BYTES, Task
from deviceq.ops.verify import verify
from harness import Deployment, deviceq, wait_for
from runner_kinds import KINDS, host_flags

PROGRESS = "for i in $(seq 1 30); do echo progress $i; sleep 0.2; done"


def gated(gate: Path) -> str:
    """PROGRESS, but its last line waits for ``gate`` to exist (the test says when)."""
    return (f"for i in $(seq 1 29); do echo progress $i; sleep 0.2; done; "
            f"while [ ! -e {gate} ]; do sleep 0.05; done; echo progress 30")  # fmt: skip


def follow(d: Deployment, task_id: str, *args: str) -> subprocess.Popen[str]:
    """``deviceq task logs ID --follow`` as a process (output captured)."""
    exe = Path(sys.executable).parent / "deviceq"
    return subprocess.Popen(
        [str(exe), "--redis-url", d.url, "--pool", d.pool, "task", "logs", task_id, "--follow",
         *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def finished(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=90)
    return proc.returncode, out, err


def log_key(d: Deployment, task_id: str, attempt: int = 1) -> str:
    return d.admin.keys.log(task_id, attempt)


@pytest.mark.parametrize("kind", KINDS)
def test_progress_shows_while_it_runs_and_follow_prints_every_line(
    deploy: Deployment, kind: str
) -> None:
    d = deploy
    d.configure(retention=3600)
    d.scheduler()
    d.command_host("h1", "d1:x", extra=host_flags(kind))
    gate = d.tmp / "last-line"
    tid = d.client.submit(gated(gate), driver_type="x")
    watcher = follow(d, tid)
    # `task logs` shows progress before the run ends (its last line is not there yet: the run
    # waits for the gate)
    seen = wait_for(lambda: (lambda out: out if "progress 2\n" in out else "")(
        deviceq(d.url, d.pool, "task", "logs", tid).stdout), 60, "progress lines")  # fmt: skip
    assert "progress 30" not in seen
    assert d.status(tid) == TaskStatus.dispatched
    gate.touch()
    rc, out, err = finished(watcher)
    assert rc == 0, err
    assert out.splitlines() == [f"progress {i}" for i in range(1, 31)]
    t = d.client.get(tid)
    assert t.status == TaskStatus.done and t.result.splitlines()[-1] == "progress 30"
    # the whole log stays, and expires with the pool's retention after the end
    ttl = d.r.pttl(log_key(d, tid))
    assert 0 < ttl <= 3600 * 1000
    shown = deviceq(d.url, d.pool, "task", "show", tid).stdout
    assert f"deviceq task logs {tid}" in shown
    assert verify(d.admin).ok


@pytest.mark.parametrize("kind", KINDS)
def test_a_failure_follows_with_exit_1_and_stderr_marked(deploy: Deployment, kind: str) -> None:
    d = deploy
    d.scheduler()
    d.command_host("h1", "d1:x", extra=host_flags(kind))
    tid = d.client.submit("echo out; echo oops >&2; sleep 0.5; exit 3", driver_type="x")
    rc, out, err = finished(follow(d, tid))
    assert rc == 1, err
    assert "out\n" in out.splitlines(keepends=True) and "[stderr] oops" in out.splitlines()
    assert d.client.get(tid).status == TaskStatus.failed
    rows = [json.loads(x) for x in deviceq(d.url, d.pool, "task", "logs", tid, "--json")
            .stdout.splitlines()]  # fmt: skip
    by_stream = {r["stream"]: r["text"] for r in rows if r["text"]}
    assert by_stream["stdout"] == "out\n" and by_stream["stderr"] == "oops\n"
    assert all(isinstance(r["time_ms"], int) and r["time_ms"] > 0 for r in rows)
    assert verify(d.admin).ok


@pytest.mark.parametrize("kind", KINDS)
def test_a_fast_printer_is_bounded_and_its_tail_says_what_was_cut(
    deploy: Deployment, kind: str
) -> None:
    d = deploy
    d.scheduler()
    d.command_host("h1", "d1:x", extra=host_flags(kind))
    tid = d.client.submit("seq 1 300000", driver_type="x")
    t = d.client.wait(tid, timeout=60)
    assert t.status == TaskStatus.done
    total = sum(len(f"{i}\n") for i in range(1, 300001))
    # the tail: on a line boundary, after a line that says how many bytes came before it
    first, rest = t.result.split("\n", 1)
    lines = rest.splitlines()
    assert first == f"… {total - len(rest.encode()):,} bytes before this"
    assert lines == [str(i) for i in range(int(lines[0]), 300001)]
    assert len(t.result.encode()) <= TAIL_BYTES
    # the live log: bounded per flush, the rest dropped with a marker that says how much
    rows = d.r.xrange(log_key(d, tid))
    texts = [f["t"] for _, f in rows]
    kept = sum(len(x.encode()) for x, (_, f) in zip(texts, rows, strict=True) if f["s"] == "stdout")
    assert kept < total
    assert all(len(x.encode()) <= CHUNK_BYTES for x in texts)
    marks = [x for _, f in rows if f["s"] == "log" and "bytes of output dropped" in (x := f["t"])]
    assert marks, "no drop marker"
    assert verify(d.admin).ok


RUNNER_SPEC = "test_live_logs:talking"


def talking(task: Task) -> str:
    """A Python runner that writes to its live log (task.log and its logger)."""
    task.log("step one")
    task.logger.info("step two")
    task.log("step three")
    return "ok"


async def talking_async(task: Task) -> str:
    """`talking` as an async runner (on the host's event loop)."""
    await asyncio.sleep(0)
    return talking(task)


@pytest.mark.parametrize("kind", KINDS)
def test_a_python_runners_lines_appear(deploy: Deployment, kind: str) -> None:
    d = deploy
    d.scheduler()
    spec = RUNNER_SPEC + ("_async" if kind == "async" else "")  # (its own process; the loop)
    d.host("h1", "d1:x", extra=("--goal-runner", spec))
    tid = d.client.submit("talk", driver_type="x")
    assert d.client.wait(tid, timeout=60).status == TaskStatus.done
    out = deviceq(d.url, d.pool, "task", "logs", tid).stdout.splitlines()
    assert "[log] step one" in out and "[log] step three" in out
    assert any(x.startswith("[log] INFO step two") for x in out)
    assert out.index("[log] step one") < out.index("[log] step three")


def claimed(fleet: Any) -> tuple[Any, Any, str, str]:
    """A task running on h1's d1 (and a second host h2): (h1, h2, task id, lease id)."""
    h1 = fleet.add_host("h1", ("d1", "x", ()))
    h2 = fleet.add_host("h2", ("d2", "x", ()))
    tid = fleet.client.submit("run", driver_type="x")
    fleet.store.commit([(tid, "d1")])
    (a,) = h1.claim(1)
    return h1, h2, tid, a.lease_id


def test_only_the_lease_holder_appends_and_the_stream_is_capped(real_fleet: Any) -> None:
    f = real_fleet
    h1, h2, tid, lease = claimed(f)
    key = f.admin.keys.log(tid, 1)
    # another host, with its own valid token: refused, nothing written
    assert h2.log_append([LogChunk(tid, lease, "stdout", "forged\n")]) == ["rejected:not_owner"]
    assert not f.r.exists(key)
    # a wrong token for the owner: an AUTH error, nothing written
    from deviceq import HostClient

    forged = HostClient(f.r, f.pool, "h1", "x" * 32)
    with pytest.raises(AuthError):
        forged.log_append([LogChunk(tid, lease, "stdout", "forged\n")])
    assert not f.r.exists(key)
    # the owner appends; the stream is capped at about log_maxlen entries
    f.admin.set_config("log_maxlen", 10)
    for _ in range(5):
        batch = [LogChunk(tid, lease, "stdout", f"line {i}\n") for i in range(100)]
        assert h1.log_append(batch) == ["ok"] * 100
    assert 10 <= f.r.xlen(key) <= 10 + 100  # (approximate trimming: whole nodes of 100)
    assert f.r.pttl(key) > 0
    # after the report, nothing more is accepted
    assert h1.report(tid, lease, "done") == "ok:done"
    before = f.r.xlen(key)
    assert h1.log_append([LogChunk(tid, lease, "stdout", "late\n")]) == ["rejected:ended"]
    assert f.r.xlen(key) == before


@pytest.fixture
def api_server(deploy: Deployment) -> Iterator[ApiServer]:
    server = ApiServer(deploy.url, deploy.pool, deploy.tmp / "api.log")
    server.start()
    try:
        yield server
    finally:
        server.kill()


def test_a_host_through_the_http_api_streams_its_log(
    deploy: Deployment, api_server: ApiServer
) -> None:
    d, api = deploy, api_server
    d.scheduler()
    api_host(d, api, "h1", "d1:x", extra=("--command", "sh -c {goal}"))
    tid = d.client.submit("for i in 1 2 3; do echo via api $i; sleep 0.2; done; echo e >&2",
                          driver_type="x")  # fmt: skip
    rc, out, err = finished(follow(d, tid))
    assert rc == 0, err
    assert out.splitlines() == ["via api 1", "via api 2", "via api 3", "[stderr] e"]
    assert d.r.pttl(log_key(d, tid)) > 0
    assert verify(d.admin).ok


def test_a_silent_run_has_no_log_and_costs_no_log_call(deploy: Deployment) -> None:
    d = deploy
    d.scheduler()
    d.command_host("h1", "d1:x")
    tid = d.client.submit("true", driver_type="x")
    assert d.client.wait(tid, timeout=60).status == TaskStatus.done
    assert not d.r.exists(log_key(d, tid))
    res = deviceq(d.url, d.pool, "task", "logs", tid, "--follow")
    assert (res.returncode, res.stdout) == (0, "")
    res = deviceq(d.url, d.pool, "task", "logs", "no-such-task")
    assert res.returncode == 1 and "no task no-such-task" in res.stderr


def test_a_buffer_is_sent_as_entries_of_at_most_64_kib_cut_between_characters() -> None:
    from deviceq.host.log_stream import ENTRY_BYTES, split_utf8

    text = ("é" * 1000 + "\n") * 200  # 2,001 bytes a line
    parts = split_utf8(text)
    assert "".join(parts) == text
    assert all(len(p.encode()) <= ENTRY_BYTES for p in parts) and len(parts) == 7
    assert all(p.endswith("\n") for p in parts)  # a line's end in the piece's last quarter
    solid = "€" * 50_000  # no line end: cut between characters
    parts = split_utf8(solid)
    assert "".join(parts) == solid and all(len(p.encode()) <= ENTRY_BYTES for p in parts)
    assert split_utf8("short") == ["short"]
