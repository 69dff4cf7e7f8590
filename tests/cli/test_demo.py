"""``deviceq demo`` end to end: it completes on the private redis-server, on the in-process
fakeredis fallback and on a given Redis, and leaves no process, port, file or key behind.

Every run gets a TMPDIR of its own. Each process the demo starts (redis-server, scheduler,
hosts) inherits it, so after the demo exits, a scan of ``/proc/*/environ`` for that TMPDIR
finds any survivor, and the TMPDIR must be empty again (no temporary directory left)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import redis

from deviceq.ops.demo import start_backend
from deviceq.ops.demo.scenario import DEMO_HOSTS, KILLED_HOST, latency_stats, percentile
from harness import free_port

pytestmark = pytest.mark.slow

DEMO_ARGS = ["--tasks", "12", "--duration", "8", "--json"]


def deviceq_cmd() -> list[str]:
    script = Path(sys.executable).parent / "deviceq"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from deviceq.cli import main; sys.exit(main())"]


def processes_with_env(needle: bytes) -> list[tuple[int, str]]:
    """(pid, command line) of every process whose environment contains ``needle``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append((int(entry.name), cmd))
        except OSError:  # gone meanwhile, or not ours
            continue
    return found


def port_open(url: str) -> bool:
    u = urlparse(url)
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((u.hostname or "127.0.0.1", u.port or 6379)) == 0


def run_demo(
    tmp_path: Path,
    *args: str,
    timeout: float = 90,
    path: str | None = None,
    before: tuple[str, ...] = (),
) -> tuple[int, dict[str, Any], str]:
    """Run ``deviceq [BEFORE...] demo ARGS...`` with a private TMPDIR; return (exit code, JSON
    summary, stderr), after checking it left no process and no temporary file behind."""
    private_tmp = tmp_path / "tmpdir"
    private_tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVICEQ_")}
    env["TMPDIR"] = str(private_tmp)
    if path is not None:
        env["PATH"] = path
    proc = subprocess.run(
        [*deviceq_cmd(), *before, "demo", *args], env=env, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    needle = f"TMPDIR={private_tmp}\0".encode()
    survivors = processes_with_env(needle)
    for _ in range(20):  # a process killed just now may still be on its way out
        if not survivors:
            break
        time.sleep(0.1)
        survivors = processes_with_env(needle)
    assert survivors == [], f"processes left behind: {survivors}\n{proc.stderr[-3000:]}"
    assert list(private_tmp.iterdir()) == [], "the demo left files in its temporary directory"
    summary = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
    return proc.returncode, summary, proc.stderr


def check_fleet_summary(summary: dict[str, Any], tasks: int) -> None:
    assert summary["ok"] is True and summary["problem"] is None
    assert summary["submitted"] == tasks
    assert summary["counts"] == {"done": tasks}
    assert summary["workflow_tasks"] == tasks // 4 and summary["goal_tasks"] == tasks - tasks // 4
    assert summary["killed_host"] == KILLED_HOST
    # the killed host held work: its leases expired and the tasks were run again elsewhere
    assert summary["tasks_on_killed_host"] >= 1
    assert summary["lease_expiries"] >= 1
    assert summary["retried"] >= 1
    # first attempts only: a task whose first assignment expired unclaimed has none
    assert tasks - summary["retried"] <= summary["latency_ms"]["n"] <= tasks
    assert 0 <= summary["latency_ms"]["p50"] <= summary["latency_ms"]["p95"]
    assert summary["retry_latency_ms"]["n"] >= summary["retried"]
    assert summary["wall_s"] < 60


def test_demo_completes_on_a_private_redis_server(tmp_path: Path) -> None:
    code, summary, stderr = run_demo(tmp_path, "--embedded", "redis-server", *DEMO_ARGS)
    assert code == 0, stderr[-3000:]
    assert summary["backend"] == "redis-server"
    check_fleet_summary(summary, 12)
    assert not port_open(summary["redis_url"]), "the embedded Redis still listens"
    # it ends with what to try next (on stderr with --json: stdout is the summary alone)
    hints = stderr.strip().splitlines()[-3:]
    assert hints[0].startswith("Next: ") and "deviceq demo --redis-url" in hints[0], hints
    assert "deviceq host run --host-id lab-1" in hints[1] and "deviceq status" in hints[2]


def test_demo_falls_back_to_fakeredis_without_redis_server(tmp_path: Path) -> None:
    """The default (auto) on a machine without the redis-server binary: an empty PATH (the
    demo runs its daemons by absolute path, beside its own Python)."""
    empty_bin = tmp_path / "empty-bin"
    empty_bin.mkdir()
    assert shutil.which("redis-server", path=str(empty_bin)) is None
    code, summary, stderr = run_demo(tmp_path, *DEMO_ARGS, path=str(empty_bin))
    assert code == 0, stderr[-3000:]
    assert summary["backend"] == "fakeredis"
    check_fleet_summary(summary, 12)
    assert not port_open(summary["redis_url"]), "the embedded Redis still listens"


def test_forced_fakeredis_backend_serves_tcp_and_stops(tmp_path: Path) -> None:
    """``--embedded fakeredis`` (or DEVICEQ_DEMO_EMBEDDED=fakeredis): a server other
    processes reach over TCP, gone after stop()."""
    backend = start_backend("fakeredis", None)
    try:
        assert backend.kind == "fakeredis"
        code = f"import redis; print(redis.Redis.from_url({backend.url!r}).ping())"
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=30
        )
        assert out.stdout.strip() == "True", out.stderr
    finally:
        backend.stop()
    assert not port_open(backend.url)


def test_demo_against_given_redis_deletes_its_pool(tmp_path: Path, redis_url: str) -> None:
    code, summary, stderr = run_demo(tmp_path, "--redis-url", redis_url, *DEMO_ARGS)
    assert code == 0, stderr[-3000:]
    assert summary["backend"] == "external" and summary["pool"].startswith("demo-")
    check_fleet_summary(summary, 12)
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        assert r.ping()  # the given server is left running ...
        assert list(r.scan_iter(match=f"dq:{{{summary['pool']}}}:*")) == []  # ... and clean
    finally:
        r.close()


def test_demo_fails_with_one_line_when_redis_is_unreachable(tmp_path: Path) -> None:
    port = free_port()  # a port nobody listens on
    code, summary, stderr = run_demo(
        tmp_path, "--redis-url", f"redis://127.0.0.1:{port}/0", "--json", timeout=60
    )
    assert code == 1
    assert summary["ok"] is False and "Connection" in summary["problem"]
    assert stderr.strip().splitlines()[-1].startswith("error: demo failed:")


def test_the_global_redis_url_is_the_demos_too(tmp_path: Path) -> None:
    """``deviceq --redis-url URL demo`` runs against URL as ``demo --redis-url URL`` does (here
    a port nobody listens on: it fails in one line naming it, the password redacted)."""
    port = free_port()  # nobody listens there
    url = f"redis://:s3cret-pw@127.0.0.1:{port}/0"
    code, summary, stderr = run_demo(tmp_path, "--json", before=("--redis-url", url), timeout=60)
    assert code == 1
    assert summary["backend"] == "external", summary
    assert summary["redis_url"] == f"redis://:***@127.0.0.1:{port}/0"
    assert "Connection" in summary["problem"]
    assert stderr.strip().splitlines()[-1].startswith("error: demo failed:")
    assert "s3cret-pw" not in stderr and "Next: " not in stderr  # (no hints after a failure)


def test_percentiles_are_nearest_rank() -> None:
    values = list(range(1, 101))
    assert (percentile(values, 50), percentile(values, 95), percentile([], 50)) == (50, 95, None)
    assert latency_stats([30, 10, 20]) == {"n": 3, "p50": 20, "p95": 30, "max": 30}


def test_killed_host_work_can_always_run_on_the_other_host() -> None:
    """Every constraint the demo submits is satisfiable by a host that survives."""
    from deviceq.core.models import Constraints
    from deviceq.ops.demo.scenario import DEMO_GOALS

    survivors = [d for h, devs in DEMO_HOSTS.items() if h != KILLED_HOST for d in devs]
    wanted = [Constraints(driver_type=drv, tags=tags) for _, drv, tags in DEMO_GOALS]
    wanted.append(Constraints(driver_type="browser", tags=("headless",)))  # workflow tasks
    for c in wanted:
        assert any(c.matches(drv, set(tags)) for _, drv, tags in survivors), c


def test_redis_url_password_is_never_shown() -> None:
    from deviceq.core.redis_urls import redact_url

    assert redact_url("redis://:s3cret@db:6380/0") == "redis://:***@db:6380/0"
    assert redact_url("rediss://app:s3cret@[::1]:7000/1") == "rediss://app:***@[::1]:7000/1"
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
