"""The dashboard as a real server process while its Redis goes away and comes back: every page
answers 503 with a short page naming the Redis address (no traceback), and the same pages
answer 200 again once Redis is back. Its start line says how people log in."""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import redis

from deviceq import PoolAdmin
from deviceq.core.redis_server import RedisServer
from deviceq.dashboard.users import UserStore
from harness import CLI, REPO_DIR, SRC_DIR, free_port, wait_for

PAGES = ("/fleet", "/queue", "/tasks", "/tasks/t-1", "/devices/d-1", "/events", "/login")


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=20) as resp:  # noqa: S310 - local test server
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, ConnectionError) as exc:  # not listening (yet)
        return 0, str(exc)


def _dashboard(url: str, pool: str, tmp: Path, port: int) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp / f"dash-{port}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((SRC_DIR, REPO_DIR))}
    with open(log, "wb") as out:
        args = [*CLI, "--redis-url", url, "--pool", pool, "dashboard", "--port", str(port)]
        proc = subprocess.Popen(
            args, stdout=out, stderr=out, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    return proc, log


def _stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def test_pages_answer_503_while_redis_is_down_and_recover(tmp_path: Path) -> None:
    server = RedisServer(appendonly=True).start()
    pool = "dq" + uuid.uuid4().hex[:10]
    port = free_port()
    proc, log = _dashboard(server.url, pool, tmp_path, port)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _get(base + "/healthz")[0] == 200, 20, "the dashboard")
        for page in ("/fleet", "/queue", "/tasks"):
            assert _get(base + page)[0] == 200, page
        server.kill()
        for page in PAGES:
            status, body = _get(base + page)
            assert status == 503, (page, status, body)
            assert f"Redis at 127.0.0.1:{server.port} is unreachable; retrying" in body, body
            assert "Traceback" not in body and "internal error" not in body
        assert _get(base + "/healthz")[0] == 503
        server.start()
        wait_for(lambda: _get(base + "/fleet")[0] == 200, 20, "the dashboard to recover")
        for page in ("/queue", "/tasks", "/healthz"):
            assert _get(base + page)[0] == 200, page
        assert "Traceback" not in log.read_text(), log.read_text()
    finally:
        _stop(proc)
        server.stop()


def test_start_line_names_the_login_mode(redis_url: str, tmp_path: Path) -> None:
    pool = "dq" + uuid.uuid4().hex[:10]
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    admin = PoolAdmin(r, pool)
    UserStore(r, admin.keys).add("alice", "operator", "correct horse battery")
    port = free_port()
    proc, log = _dashboard(redis_url, pool, tmp_path, port)
    try:
        wait_for(lambda: "on http://" in log.read_text(), 20, "the start line")
        line = log.read_text()
        assert "read-only" not in line, line
        assert "users log in by name and password" in line, line
    finally:
        _stop(proc)
    # without users nor token: read-only, said so
    pool2 = "dq" + uuid.uuid4().hex[:10]
    port = free_port()
    proc, log = _dashboard(redis_url, pool2, tmp_path, port)
    try:
        wait_for(lambda: "on http://" in log.read_text(), 20, "the start line")
        assert "(read-only" in log.read_text()
    finally:
        _stop(proc)
        r.close()
