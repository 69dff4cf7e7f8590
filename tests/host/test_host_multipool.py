"""One host daemon serving several pools (``deviceq --pool a --pool b host run``), end to end:
the installed ``deviceq`` console script for the host and for ``scheduler run --pool a --pool
b``, on the tests' private Redis. Each pool is a separate fleet: a device serves one pool."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from bench.support.runlog import RunLog
from bench.support.runlog import command as runner_command

from deviceq import TaskStatus
from deviceq.cli.host_run_settings import build_pool_settings
from deviceq.core.errors import ConfigError
from deviceq.host.runners import Task
from harness import REPO_DIR, TESTS_PATH, Deployment, wait_for

EXE = str(Path(sys.executable).parent / "deviceq")


def logging_runner(task: Task) -> str:
    """A Python runner (loaded by import path, run in a process of its own) that logs a line."""
    task.logger.warning(f"hello from the runner of {task.goal}")
    return task.goal


class Pools:
    """Two pools on one Redis, a host ``h1`` added in each (its own token in each)."""

    def __init__(self, url: str, tmp: Path) -> None:
        tag = uuid.uuid4().hex[:8]
        self.url, self.tmp = url, tmp
        self.a = Deployment(url, f"mpa{tag}", tmp)
        self.b = Deployment(url, f"mpb{tag}", tmp)
        for d in (self.a, self.b):
            d.configure(lease_ttl=2.0, claim_ttl=2.0, host_timeout=2.0, quarantine_after=10)
        self.token_a, self.token_b = tmp / "h1-a.token", tmp / "h1-b.token"
        self.token_a.write_text(self.a.admin.add_host("h1"))
        self.token_b.write_text(self.b.admin.add_host("h1"))

    @property
    def names(self) -> tuple[str, str]:
        return self.a.pool, self.b.pool

    def spawn(self, name: str, *args: str, env: dict[str, str] | None = None) -> Any:
        """``deviceq ARGS`` (the console script) as a process of its own, logging to
        ``tmp/NAME.log``; killed (with what it started) at the end of the test."""
        full_env = {
            **os.environ,
            "DEVICEQ_REDIS_URL": self.url,
            "DQTEST_MARK": self.a.mark,
            "PYTHONPATH": os.pathsep.join((TESTS_PATH, REPO_DIR)),
            **(env or {}),
        }
        full_env.pop("DEVICEQ_POOL", None)
        full_env.pop("DEVICEQ_HOST_TOKEN", None)
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen([EXE, *args], env=full_env, stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        log.close()
        self.a.procs[name] = proc
        return proc

    def scheduler(self) -> Any:
        a, b = self.names
        return self.spawn("scheduler", "--pool", a, "--pool", b, "scheduler", "run", "--tick",
                          "0.2")  # fmt: skip

    def host_args(self, *extra: str) -> list[str]:
        a, b = self.names
        return ["host", "run", "--pool", a, "--pool", b, "--host-id", "h1",
                "--token-file", f"{a}={self.token_a}", "--token-file", f"{b}={self.token_b}",
                *extra]  # fmt: skip

    def run_cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if k not in ("DEVICEQ_POOL",
               "DEVICEQ_HOST_TOKEN")}  # fmt: skip
        return subprocess.run([EXE, "--redis-url", self.url, *args], capture_output=True,
                              text=True, timeout=60, env=env)  # fmt: skip

    def dump(self) -> dict[str, Any]:
        """Every key of both pools with its DUMP (what "nothing changed" compares)."""
        r = redis.Redis.from_url(self.url)
        try:
            out = {}
            for pool in self.names:
                for k in sorted(r.scan_iter(match=f"dq:{{{pool}}}:*", count=1000)):
                    out[k] = r.dump(k)
            return out
        finally:
            r.close()

    def close(self) -> None:
        self.a.close()
        self.b.close()


@pytest.fixture
def pools(redis_server: Any, tmp_path: Path) -> Iterator[Pools]:
    p = Pools(redis_server.url, tmp_path)
    try:
        yield p
    finally:
        p.close()


def test_one_host_process_serves_two_pools_and_sigterm_drains_both(pools: Pools) -> None:
    a, b = pools.names
    runlog = RunLog(pools.tmp / "runs")
    pools.scheduler()
    devices = ("--device", f"{a}/a1:android", "--device", f"{a}/a2:android",
               "--device", f"{b}/b1:android")  # fmt: skip
    args = pools.host_args(*devices, "--command", runner_command(), "--log-level", "debug")
    host = pools.spawn("host", *args, env=runlog.env)
    ids_a = pools.a.client.submit_many([{"goal": "0.3"}] * 4)
    ids_b = pools.b.client.submit_many([{"goal": "0.3"}] * 4)
    for t in pools.a.wait_all(ids_a, timeout=40):
        assert (t.status, t.host_id) == (TaskStatus.done, "h1"), t
        assert t.device_id in ("a1", "a2")
    for t in pools.b.wait_all(ids_b, timeout=40):
        assert (t.status, t.host_id, t.device_id) == (TaskStatus.done, "h1", "b1"), t
    assert runlog.overlaps() == [] and runlog.intervals_overlap() == []
    assert len(runlog.ends()) == 8

    # SIGTERM while a task runs in each pool: both finish (within the grace), exit 0
    running = [pools.a.client.submit("1.5"), pools.b.client.submit("1.5")]
    deps = (pools.a, pools.b)
    # (running: its runner has started, not only its claim made it dispatched in Redis; a
    # SIGTERM between the two hands the claimed task back, as a stopping host must)
    wait_for(lambda: all(runlog.starts(t) for t in running), 20, "a task running in each pool")
    host.send_signal(signal.SIGTERM)
    assert host.wait(30) == 0
    for d, tid in zip(deps, running, strict=True):
        t = d.client.get(tid)
        assert (t.status, t.attempt) == (TaskStatus.done, 1), t
        h = d.admin.host("h1")
        assert h.stopping and h.session is None, h

    # one session per pool; every line carries its pool (the process's own last line: both),
    # and a task's lines the task's pool
    log = pools.a.log("host")
    lines = log.splitlines()
    tags = (f"pool={a} ", f"pool={b} ", f"pools={a},{b}")
    assert lines and all(any(t in x + " " for t in tags) for x in lines), [
        x for x in lines if not any(t in x + " " for t in tags)
    ]
    assert 'msg="host daemon stopped"' in lines[-1] and f"pools={a},{b}" in lines[-1]
    for d, ids in ((pools.a, ids_a), (pools.b, ids_b)):
        other = b if d.pool == a else a
        about = [x for x in lines if any(f"task={t}" in x for t in ids)]
        assert any("msg=claimed" in x for x in about) and any("runner started" in x for x in about)
        assert all(f"pool={d.pool}" in x and f"pool={other}" not in x for x in about), about
    started = [x for x in lines if 'msg="host worker started"' in x]
    assert {f"pool={a}", f"pool={b}"} <= {f for x in started for f in x.split()}, started
    assert sum(f"pool={p}" in x for x in lines for p in (a, b) if "draining" in x) >= 2
    assert not pools.a.tokens_in(log)


def test_a_pool_without_a_token_or_a_shared_device_refuses_to_start(pools: Pools) -> None:
    a, b = pools.names
    devices = ("--device", f"{a}/a1:android", "--device", f"{b}/b1:android", "--command", "true")
    before = pools.dump()
    # only pool a has a token
    res = pools.run_cli("host", "run", "--pool", a, "--pool", b, "--host-id", "h1",
                        "--token-file", f"{a}={pools.token_a}", *devices)  # fmt: skip
    assert res.returncode == 2, res
    assert f"no host token for pool(s) {b}" in res.stderr and "--token-file POOL=FILE" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert pools.token_a.read_text().strip() not in res.stderr
    bad = {
        "a device in two pools": (["--device", f"{a}/d1:android", "--device", f"{b}/d1:android",
                                   "--command", "true"], "device d1 is given twice"),
        "a device without its pool": (["--device", "d1:android", "--device", f"{b}/b1:android",
                                       "--command", "true"], "say which pool it serves"),
        "a pool without a device": (["--device", f"{a}/a1:android", "--command", "true"],
                                    f"pool(s) {b} have no device"),
        "a device of another pool": ([*devices, "--device", "zz/z1:x"],
                                     "does not serve pool 'zz'"),
        "a token of another pool": ([*devices, "--token-file", f"zz={pools.token_a}"],
                                    "does not serve pool 'zz'"),
    }  # fmt: skip
    for what, (extra, msg) in bad.items():
        res = pools.run_cli(*pools.host_args(*extra))
        assert res.returncode == 2 and msg in res.stderr, (what, res.stderr)
    # nothing started and nothing written in either pool
    assert pools.dump() == before
    for d in (pools.a, pools.b):
        h = d.admin.host("h1")
        assert h.session is None and not h.alive, h


def test_one_pool_losing_its_host_drains_the_others_and_exits_non_zero(pools: Pools) -> None:
    a, b = pools.names
    pools.scheduler()
    host = pools.spawn("host", *pools.host_args(
        "--device", f"{a}/a1:android", "--device", f"{b}/b1:android",
        "--command", "sh -c {goal}"))  # fmt: skip
    wait_for(lambda: pools.a.alive("h1") and pools.b.alive("h1"), 20, "h1 alive in both pools")
    tid = pools.a.client.submit("sleep 1.5; echo finished")
    wait_for(lambda: pools.a.status(tid) is TaskStatus.dispatched, 20, "a task running in a")
    assert pools.b.admin.remove_host("h1") == 1
    assert host.wait(30) == 4  # EXIT_REVOKED, after pool a drained
    t = pools.a.client.get(tid)
    assert (t.status, t.result) == (TaskStatus.done, "finished\n")  # its run finished
    h = pools.a.admin.host("h1")
    assert h.stopping and h.session is None, h
    log = pools.a.log("host")
    err = [x for x in log.splitlines() if " error " in x]
    assert any(f"pool={b}" in x and "can no longer act" in x for x in err), err
    assert any("draining the other pools" in x and f"draining={a}" in x for x in err), err


def test_one_pool_refused_at_start_stops_the_others_exit_2(pools: Pools) -> None:
    a, b = pools.names
    pools.token_b.write_text(pools.token_a.read_text())  # pool a's token: wrong in pool b
    devices = ("--device", f"{a}/a1:android", "--device", f"{b}/b1:android")
    host = pools.spawn("host", *pools.host_args(*devices, "--command", "true"))
    assert host.wait(30) == 2
    log = pools.a.log("host")
    assert any(f"pool={b}" in x and "cannot start" in x for x in log.splitlines()), log
    assert pools.b.admin.host("h1").session is None
    assert pools.a.admin.host("h1").session is None  # pool a started, then drained
    assert not pools.a.tokens_in(log)


def test_isolated_python_runners_log_their_pool(pools: Pools) -> None:
    a, b = pools.names
    pools.scheduler()
    devices = ("--device", f"{a}/a1:android", "--device", f"{b}/b1:android")
    host = pools.spawn("host", *pools.host_args(
        *devices, "--goal-runner", "test_host_multipool:logging_runner",
        "--isolation", "process"))  # fmt: skip
    ta, tb = pools.a.client.submit("goal-a"), pools.b.client.submit("goal-b")
    assert pools.a.client.wait(ta, timeout=30).result == "goal-a"
    assert pools.b.client.wait(tb, timeout=30).result == "goal-b"
    host.send_signal(signal.SIGTERM)
    assert host.wait(30) == 0
    lines = pools.a.log("host").splitlines()
    for pool, tid, goal in ((a, ta, "goal-a"), (b, tb, "goal-b")):
        (line,) = [x for x in lines if f"runner of {goal}" in x]
        assert f"pool={pool} " in line and f"task={tid}" in line and "host=h1" in line, line


def test_per_pool_settings_from_options_and_config_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DEVICEQ_HOST_TOKEN", raising=False)
    (tmp_path / "a").write_text("tok-a\n")
    (tmp_path / "all").write_text("tok-all\n")
    cli: dict[str, Any] = {"host_id": "h", "command": "true", "grace": 7.0,
                           "token_file": (f"a={tmp_path / 'a'}", str(tmp_path / "all")),
                           "devices": ("a/d1:android:wifi", "b/d2:emu", "c/d3:emu")}  # fmt: skip
    out = build_pool_settings(cli, {}, ("a", "b", "c"))
    assert {p: tok for p, (_, tok) in out.items()} == {"a": "tok-a", "b": "tok-all", "c": "tok-all"}
    assert {p: [(d.device_id, d.tags) for d in s.devices] for p, (s, _) in out.items()} == {
        "a": [("d1", ("wifi",))], "b": [("d2", ())], "c": [("d3", ())]}  # fmt: skip
    assert all(s.grace == 7.0 and s.host_id == "h" for s, _ in out.values())
    assert out["a"][0] is not out["b"][0] and out["a"][0].goal_runner is not out["b"][0].goal_runner
    # a config file: token files by pool, devices with their pool
    file_cfg = {"host_id": "h", "command": "true", "token_file": {"a": str(tmp_path / "a"),
                "b": str(tmp_path / "all")}, "devices": [{"pool": "a", "id": "d1",
                "driver_type": "x"}, "b/d2:x"]}  # fmt: skip
    out = build_pool_settings({}, file_cfg, ("a", "b"))
    assert [out[p][1] for p in ("a", "b")] == ["tok-a", "tok-all"]
    # one pool: POOL/ID and POOL=FILE work too; a missing token keeps the one-pool message
    one = build_pool_settings({**cli, "devices": ("a/d1:x",), "token_file": (
        f"a={tmp_path / 'a'}",)}, {}, ("a",))  # fmt: skip
    assert one["a"][1] == "tok-a"
    with pytest.raises(ConfigError, match="a host token is required"):
        build_pool_settings({"host_id": "h", "command": "true", "devices": ("d:x",)}, {}, ("a",))
    with pytest.raises(ConfigError, match="more than once"):
        build_pool_settings({**cli, "token_file": ("x", "y")}, {}, ("a", "b", "c"))
