"""A host daemon while Redis is away: it backs off (every loop), says so in one line, at most
one a minute while it lasts, and one when Redis is back; its running task goes on and its
report lands afterwards. A real `deviceq host run` on a private redis-server that is killed
and started again on the same port; `Backoff` and `Outage` on their own below."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from deviceq import TaskStatus
from deviceq.core.backoff import Backoff, Outage, endpoint, how_long, url_secrets
from deviceq.core.redis_server import RedisServer
from harness import CLI, REPO_DIR, SRC_DIR, TESTS_PATH, Deployment, wait_for

OUTAGE = 8.0  # seconds Redis is down


def spawn_host(deploy: Deployment, host_id: str, *devices: str) -> tuple[Any, Path]:
    """`deviceq host run` (command runner) with its stderr in a file of its own."""
    token_file = deploy.tmp / f"{host_id}.token"
    token_file.write_text(deploy.admin.add_host(host_id))
    args = ["host", "run", "--host-id", host_id, "--token-file", str(token_file),
            "--goal-runner", "command", "--command", "sh -c {goal}"]  # fmt: skip
    for d in devices:
        args += ["--device", d]
    env = {**os.environ, "DEVICEQ_REDIS_URL": deploy.url, "DEVICEQ_POOL": deploy.pool,
           "DQTEST_MARK": deploy.mark,
           "PYTHONPATH": os.pathsep.join((TESTS_PATH, SRC_DIR, REPO_DIR))}  # fmt: skip
    err = deploy.tmp / f"{host_id}.stderr"
    with open(deploy.tmp / f"{host_id}.stdout", "ab") as out, open(err, "ab") as errf:
        proc = subprocess.Popen([*CLI, *args], env=env, stdout=out, stderr=errf,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    deploy.procs[host_id] = proc
    return proc, err


def test_a_host_rides_out_a_redis_outage_in_two_lines(pool: str, tmp_path: Path) -> None:
    password = "pw-" + uuid.uuid4().hex
    server = RedisServer(appendonly=True, appendfsync="always", password=password).start()
    deploy = Deployment(server.url, pool, tmp_path)
    try:
        # the lease outlasts the outage: the run in flight must go on and be reported after
        deploy.configure(lease_ttl=30, claim_ttl=30, host_timeout=3)
        deploy.scheduler()
        host, err = spawn_host(deploy, "h1", "d1:android", "d2:android")
        wait_for(lambda: deploy.alive("h1"), 30, "h1 heartbeating")
        started = tmp_path / "started"
        # it writes on (its live log cannot be streamed meanwhile) and ends during the outage
        chatter = "for i in $(seq 30); do echo line $i >&2; sleep 0.1; done"
        tid = deploy.client.submit(f"touch {started}; {chatter}; echo survived")
        wait_for(started.exists, 30, "the task running")
        wait_for(lambda: deploy.status(tid) is TaskStatus.dispatched, 10, "the claim written")

        before = len(err.read_text())
        server.kill()
        time.sleep(OUTAGE)  # the task ends meanwhile: its report cannot get through
        during = err.read_text()[before:]
        server.start()  # the same port, the same data (every write fsynced)
        restarted = time.monotonic()
        deploy.r.connection_pool.disconnect()
        wait_for(lambda: "reachable again" in err.read_text(), 15, "the host seeing Redis back")
        back_in = time.monotonic() - restarted

        t = deploy.client.wait(tid, timeout=30)
        assert (t.status, t.attempt) == (TaskStatus.done, 1), t
        assert t.result.endswith("line 30\nsurvived\n"), t.result  # (its output and stderr)
        assert [a.outcome for a in t.attempts] == ["done"]
        # heartbeating again: alive, both devices idle, and new work runs
        wait_for(lambda: deploy.alive("h1"), 15, "h1 heartbeating again")
        wait_for(lambda: all(deploy.admin.device(d).state.value == "idle"
                             for d in ("d1", "d2")), 15, "devices idle again")  # fmt: skip
        after = deploy.client.wait(deploy.client.submit("echo after"), timeout=30)
        assert (after.status, after.result, after.host_id) == (TaskStatus.done, "after\n", "h1")
        assert host.poll() is None

        log = err.read_text()
        lines = log.splitlines()
        gone = [ln for ln in lines if "unreachable" in ln]
        assert len(gone) == 1, gone
        assert f"redis unreachable at 127.0.0.1:{server.port}: " in gone[0]
        assert "; retrying" in gone[0] and " warning " in gone[0]
        assert len(during.splitlines()) <= 2, during
        assert gone[0] in during
        again = [ln for ln in lines if "reachable again" in ln]
        assert len(again) == 1, again
        m = re.search(r"redis reachable again after (\d+\.\d) s", again[0])
        assert m, again[0]
        assert OUTAGE - 1 <= float(m.group(1)) <= OUTAGE + back_in + 1
        assert back_in < 12  # the backoff is bounded (10 s) and every loop retries
        assert password not in log
    finally:
        deploy.close()
        server.stop()


# -- the pieces ----------------------------------------------------------------------------
def test_backoff_doubles_to_its_cap_with_jitter_and_resets() -> None:
    b = Backoff(0.2, 10.0, jitter=0.25)
    delays = [b.next() for _ in range(12)]
    for i, d in enumerate(delays):
        nominal = min(10.0, 0.2 * 2**i)
        assert nominal * 0.75 <= d <= min(10.0, nominal * 1.25), (i, d)
    assert max(delays) <= 10.0 and delays[-1] >= 7.5
    assert len({round(d, 6) for d in delays[-5:]}) > 1  # jittered, not in lock step
    assert all(d < 10.0 for d in delays[-5:])  # at the cap too: drawn below it, not cut at it
    b.reset()
    assert 0.15 <= b.next() <= 0.25
    flat = Backoff(0.1, 5.0, jitter=0)
    assert [flat.next() for _ in range(8)] == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    with pytest.raises(ValueError):
        Backoff(0, 1)
    with pytest.raises(ValueError):
        Backoff(2, 1)


def test_an_outage_is_said_once_reminded_each_minute_and_its_end_once() -> None:
    now = [100.0]
    said: list[tuple[int, str]] = []
    o = Outage("10.0.0.5:6380", lambda lvl, msg: said.append((lvl, msg)), clock=lambda: now[0],
               secrets=["hunter2"])  # fmt: skip
    o.ok()
    assert said == [] and not o.down
    err = ConnectionError("Error 111 connecting to 10.0.0.5:6380. Connection refused.")
    for _ in range(50):  # many loops, many failures, within a minute
        o.failed(err)
        now[0] += 1.0
    assert [m for _, m in said] == [
        "redis unreachable at 10.0.0.5:6380: Error 111 connecting to 10.0.0.5:6380. "
        "Connection refused.; retrying"
    ]
    now[0] = 161.0
    o.failed(ConnectionError("no route (password hunter2)"))
    o.failed(err)
    assert said[-1][1] == (
        "redis still unreachable at 10.0.0.5:6380 after 61.0 s: no route (password ***); retrying"
    )
    assert len(said) == 2
    now[0] = 172.3
    o.ok()
    o.ok()
    assert said[-1] == (logging.INFO, "redis reachable again after 72.3 s")
    assert len(said) == 3 and not o.down and o.recoveries == 1
    o.failed(err)  # a new outage is said again
    assert len(said) == 4 and "redis unreachable at" in said[-1][1]


def test_a_pause_ends_when_another_loop_gets_through() -> None:
    o = Outage("h:1", lambda lvl, msg: None)
    o.failed(ConnectionError("down"))
    t0 = time.monotonic()
    o.pause(0.3, lambda: False)
    assert time.monotonic() - t0 >= 0.29
    threading.Timer(0.2, o.ok).start()
    t0 = time.monotonic()
    o.pause(5.0, lambda: False)
    assert time.monotonic() - t0 < 1.0


def test_endpoint_names_host_and_port_never_the_password() -> None:
    assert endpoint("redis://:s3cret@127.0.0.1:6390/0") == "127.0.0.1:6390"
    assert endpoint("redis://user:p@ss/w@rd@db.example.com/2?ssl_ca_certs=/x") == (
        "db.example.com:6379"
    )
    assert endpoint("rediss://[::1]:6380/0") == "[::1]:6380"
    assert endpoint("rediss://[::1]/0") == "[::1]:6379"
    assert endpoint("unix:///run/redis.sock?db=1") == "/run/redis.sock"
    assert endpoint("redis+sentinel://:pw@10.0.0.1:26379,10.0.0.2:26379/mymaster/0") == (
        "10.0.0.1:26379,10.0.0.2:26379/mymaster"
    )
    assert endpoint("https://deviceq.example.com:8443") == "deviceq.example.com:8443"
    assert set(url_secrets("redis://user:p%40ss@h:1/0")) == {"p%40ss", "p@ss"}
    assert url_secrets("redis://h:1/0") == []
    assert how_long(12.34) == "12.3 s" and how_long(245) == "4 min 5 s"
    assert how_long(3 * 3600 + 120) == "3 h 2 min"
