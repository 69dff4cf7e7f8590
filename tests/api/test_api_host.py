"""The host protocol over HTTP: a real uvicorn process serving the host routes on a loopback
port, real `deviceq host run --api-url` and `deviceq scheduler run` daemons, a real Redis.
A host's token acts for that host only; the daemon rides out the API being SIGKILLed and
restarted without losing a task or running one twice; `ApiHostClient` answers with the same
errors as `HostClient`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from bench.support.runlog import command as runner_command

from deviceq import TaskStatus
from deviceq.core.errors import (
    AuthError,
    Busy,
    InvalidInput,
    NotConfirmed,
    NotFound,
    SessionActive,
    SessionSuperseded,
)
from deviceq.host.http_link import ApiError, ApiHostClient, ApiUnreachable, api_error
from deviceq.host.link import DeviceReport
from deviceq.host.redis_link import HostClient
from deviceq.host.state import TRANSIENT
from deviceq.ops.verify import verify
from deviceq.scheduler import TaskScheduler
from harness import CLI, REPO_DIR, SRC_DIR, TESTS_PATH, Deployment, RunLog, free_port, wait_for


class ApiServer:
    """`tests/api_host_app.py` under uvicorn, as a process of its own (SIGKILL-able) on a
    fixed loopback port (a restart serves the same URL)."""

    def __init__(self, redis_url: str, pool: str, log: Path) -> None:
        self.redis_url, self.pool, self.log_path = redis_url, pool, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "DQ_API_REDIS_URL": self.redis_url, "DQ_API_POOL": self.pool,
               "PYTHONPATH": os.pathsep.join((TESTS_PATH, SRC_DIR, REPO_DIR))}  # fmt: skip
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--factory", "api_host_app:make_app",
             "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"],
            env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        log.close()
        wait_for(self.serving, 30, "the API serving")

    def serving(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"the API exited: {self.log_path.read_text()[-2000:]}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def api(deploy: Deployment) -> Iterator[ApiServer]:
    server = ApiServer(deploy.url, deploy.pool, deploy.tmp / "api.log")
    server.start()
    try:
        yield server
    finally:
        server.kill()


def http(
    url: str,
    method: str,
    path: str,
    token: str | None,
    body: Any = None,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
) -> tuple[int, Any]:
    """One request as any client in any language would send it: (status, JSON answer)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url + "/api/v1" + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def pool_state(r: redis.Redis, pool: str) -> dict[str, Any]:
    """Every key of the pool with its type and content (what a refused call must not change)."""
    out: dict[str, Any] = {}
    for key in sorted(r.scan_iter(match=f"dq:{{{pool}}}:*", count=1000)):
        kind = r.type(key)
        if kind == "hash":
            out[key] = r.hgetall(key)
        elif kind == "list":
            out[key] = r.lrange(key, 0, -1)
        elif kind == "set":
            out[key] = sorted(r.smembers(key))
        elif kind == "zset":
            out[key] = r.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            out[key] = r.xrange(key)
        else:
            out[key] = r.dump(key)
    return out


def api_host(deploy: Deployment, api: ApiServer, host_id: str, *devices: str,
             extra: tuple[str, ...] = (), env: dict[str, str] | None = None) -> Any:  # fmt: skip
    """`deviceq host run --api-url` whose Redis URL leads nowhere: it can only use the API."""
    nowhere = {"DEVICEQ_REDIS_URL": "redis://127.0.0.1:1/0", **(env or {})}
    return deploy.host(host_id, *devices, extra=("--api-url", api.url, *extra), env=nowhere)


def test_tasks_reach_done_through_the_api_and_the_host_drains(
    deploy: Deployment, api: ApiServer
) -> None:
    deploy.scheduler()
    proc = api_host(deploy, api, "h1", "d1:android", "d2:android:wifi",
                    extra=("--command", "sh -c {goal}"))  # fmt: skip
    ids = [deploy.client.submit(f"echo run-{i}") for i in range(6)]
    ids.append(deploy.client.submit("exit 3", max_attempts=1))
    ids.append(deploy.client.submit("echo tagged", tags=["wifi"]))
    done = deploy.wait_all(ids, 60)
    assert [t.status for t in done] == [TaskStatus.done] * 6 + [TaskStatus.failed, TaskStatus.done]
    assert all(t.host_id == "h1" and t.attempt == 1 for t in done)
    assert done[-1].device_id == "d2"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    log = deploy.log("h1")
    assert "host worker started" in log and "Redis unreachable" not in log
    assert not deploy.tokens_in(log) and not deploy.tokens_in((deploy.tmp / "api.log").read_text())
    host = deploy.admin.host("h1")
    assert host.session in (None, "")  # the drain ended its session through the API
    assert verify(deploy.admin).ok


def _claimed_by_b(deploy: Deployment, api: ApiServer) -> tuple[str, str, ApiHostClient, str]:
    """Hosts A and B; B (through the API) holds a claimed attempt of one task and has a
    control message pending. Returns A's token, B's task id and client, and the lease id."""
    token_a = deploy.admin.add_host("hA")
    token_b = deploy.admin.add_host("hB")
    a = ApiHostClient(api.url, None, "hA", token_a)
    a.start_session("sA000000000000001")
    a.heartbeat([DeviceReport("a1", "android")])
    b = ApiHostClient(api.url, None, "hB", token_b)
    b.start_session("sB000000000000001")
    b.heartbeat([DeviceReport("b1", "ios")])
    tid = deploy.client.submit("x", driver_type="ios")
    TaskScheduler(deploy.admin).assign()
    (got,) = b.claim(1)
    assert got.task.id == tid and got.device_id == "b1"
    deploy.client.cancel(tid)  # pushes a control message to B
    return token_a, tid, b, got.lease_id


def test_a_hosts_token_cannot_act_for_another_host(deploy: Deployment, api: ApiServer) -> None:
    token_a, tid, b, lease = _claimed_by_b(deploy, api)
    session_b = {"X-Deviceq-Session": b.session}
    calls: list[tuple[str, str, Any]] = [
        ("POST", "/hosts/hB/heartbeat", {"devices": [{"device_id": "b1", "driver_type": "ios"}]}),
        ("POST", "/hosts/hB/claim", {"max": 5, "wait": 0.2}),
        ("POST", "/hosts/hB/wait", {"timeout": 0.2}),
        ("POST", "/hosts/hB/renew", {"leases": [{"task_id": tid, "lease_id": lease}]}),
        ("POST", "/hosts/hB/report", {"reports": [{"task_id": tid, "lease_id": lease,
                                                   "outcome": "done", "payload": "forged"}]}),
        ("POST", "/hosts/hB/release", {"task_id": tid, "lease_id": lease}),
        ("POST", "/hosts/hB/logs", {"chunks": [{"task_id": tid, "lease_id": lease,
                                                "stream": "stdout", "text": "forged\n"}]}),
        ("POST", "/hosts/hB/artifacts", {"task_id": tid, "attempt": 1, "files": []}),
        ("POST", "/hosts/hB/control", {"timeout": 0.2}),
        ("POST", "/hosts/hB/nudge", {}),
        ("POST", "/hosts/hB/draining", {"draining": True}),
        ("GET", "/hosts/hB/session", None),
        ("POST", "/hosts/hB/session", {"session": "sX000000000000001", "mode": "takeover"}),
        ("DELETE", "/hosts/hB/session", None),
        ("POST", "/hosts/hB/devices/b1/health/begin", {}),
        ("POST", "/hosts/hB/devices/health", {"device_ids": ["b1"]}),
        ("POST", "/hosts/hB/devices/attributes", {"entries": [["b1", "1", "0", "x", "n:1"]]}),
        ("GET", f"/hosts/hB/tasks/{tid}/parts", None),
        ("GET", "/hosts/hB/config", None),
    ]  # fmt: skip
    before = pool_state(deploy.r, deploy.pool)
    for method, path, body in calls:
        for token in (token_a, "w" * 32):  # another host's token, a made-up one
            status, answer = http(api.url, method, path, token, body, session_b)
            assert (status, answer["error"]["code"]) == (401, "AUTH"), (method, path, answer)
            assert token not in json.dumps(answer)
    # host A reading B's task through its own id: not its task
    status, answer = http(api.url, "GET", f"/hosts/hA/tasks/{tid}/parts", token_a)
    assert (status, answer["error"]["code"]) == (404, "NOT_FOUND")
    status, answer = http(api.url, "POST", "/hosts/hA/devices/health", token_a,
                          {"device_ids": ["b1"]})  # fmt: skip
    assert status == 200 and answer == {"health": {"b1": ""}}
    # nor set the attributes of B's device (A's session is refused first; without one,
    # DEVICE_OWNED: tests/attributes/test_device_attrs.py)
    status, answer = http(api.url, "POST", "/hosts/hA/devices/attributes", token_a,
                          {"entries": [["b1", "1", "0", "x", "n:1"]]})  # fmt: skip
    assert status >= 400 and answer["error"]["code"] in ("DEVICE_OWNED", "SUPERSEDED"), answer
    assert pool_state(deploy.r, deploy.pool) == before
    # B itself may: its control message and its renewal (cancel requested) are there
    assert b.wait_for_control(1.0) is not None
    (ren,) = b.renew([(tid, lease)])
    assert ren.status == "cancel"
    assert b.report(tid, lease, "cancelled").startswith("ok:")
    assert verify(deploy.admin).ok


def test_bad_requests_are_refused_in_one_line_and_change_nothing(
    deploy: Deployment, api: ApiServer
) -> None:
    token = deploy.admin.add_host("h1")
    before = pool_state(deploy.r, deploy.pool)
    cases: list[tuple[str, str, str | None, dict[str, Any]]] = [
        ("POST", "/hosts/h1/heartbeat", None, {"raw": b'{"devices": []}'}),  # no token
        ("POST", "/hosts/h1/heartbeat", token, {"raw": b"{not json"}),
        ("POST", "/hosts/h1/heartbeat", token, {"raw": b"[1, 2]"}),
        ("POST", "/hosts/h1/heartbeat", token, {"raw": b" " * (64 * 1024 + 1)}),
        ("POST", "/hosts/h%20x/heartbeat", token, {"body": {"devices": []}}),
        ("POST", "/hosts/h1/heartbeat", token,
         {"body": {"devices": [{"device_id": "bad id", "driver_type": "android"}]}}),
        ("POST", "/hosts/h1/claim", token, {"body": {"max": "many"}}),
        ("POST", "/hosts/h1/renew", token, {"body": {"leases": [{"task_id": "../x"}]}}),
        ("POST", "/hosts/h1/session", token, {"body": {"session": "s1", "mode": "end"}}),
        ("GET", "/hosts/h1/workflows/no%20such", token, {}),
    ]  # fmt: skip
    expected = [(401, "AUTH"), (400, "INVALID"), (400, "INVALID"), (413, "TOO_LARGE"),
                (400, "INVALID"), (400, "INVALID"), (400, "INVALID"), (400, "INVALID"),
                (400, "INVALID"), (400, "INVALID")]  # fmt: skip
    got = []
    for method, path, tok, kw in cases:
        status, answer = http(api.url, method, path, tok, **kw)
        assert "\n" not in answer["error"]["message"]
        got.append((status, answer["error"]["code"]))
    assert got == expected
    assert pool_state(deploy.r, deploy.pool) == before


def test_the_api_killed_and_restarted_mid_run_loses_no_task_and_runs_none_twice(
    deploy: Deployment, api: ApiServer
) -> None:
    # leases outlast the outage: the attempts in flight must finish and be reported
    deploy.configure(lease_ttl=15, claim_ttl=15, host_timeout=15)
    runlog = RunLog(deploy.tmp / "runs")
    deploy.scheduler()
    api_host(deploy, api, "h1", "d1:android", "d2:android", "d3:android",
             env=runlog.env, extra=("--command", runner_command()))  # fmt: skip
    ids = [deploy.client.submit("1.5") for _ in range(9)]
    wait_for(lambda: len(runlog.starts()) >= 2, 30, "runs started")
    api.kill()
    # the outage is noticed (a renewal, a report or a poll fails) before the API returns
    wait_for(lambda: "unreachable" in deploy.log("h1"), 30, "the host seeing the API gone")
    wait_for(lambda: runlog.ends(), 30, "a run ending while the API is down")
    api.start()
    done = deploy.wait_all(ids, 90)
    assert [t.status for t in done] == [TaskStatus.done] * len(ids)
    assert [t.attempt for t in done] == [1] * len(ids)
    for tid in ids:
        assert len(runlog.starts(tid)) == 1, tid
        assert [a.outcome for a in deploy.client.get(tid).attempts] == ["done"]
    assert runlog.overlaps() == [] and runlog.intervals_overlap() == []
    assert verify(deploy.admin).ok


# -- ApiHostClient: the same errors as HostClient ------------------------------------------
def test_api_host_client_raises_what_host_client_raises(deploy: Deployment, api: ApiServer) -> None:
    token = deploy.admin.add_host("h1")
    with pytest.raises(AuthError):
        ApiHostClient(api.url, None, "h1", "x" * 32).heartbeat([])
    with pytest.raises(AuthError, match="not registered"):
        ApiHostClient(api.url, None, "nobody", token).host_record()
    first = ApiHostClient(api.url, None, "h1", token)
    first.start_session("s0000000000000001", owner="elsewhere:boot:1:1")
    first.heartbeat([DeviceReport("d1", "android")])
    with pytest.raises(SessionActive):
        ApiHostClient(api.url, None, "h1", token).start_session("s0000000000000002")
    second = ApiHostClient(api.url, None, "h1", token)
    second.start_session("s0000000000000002", "takeover", expected="s0000000000000001")
    with pytest.raises(SessionSuperseded):
        first.heartbeat([DeviceReport("d1", "android")])
    with pytest.raises(SessionSuperseded):
        first.claim(1)
    # a refused long poll answers at once: the next claim / renewal says why
    assert first.wait_for_work(5.0) is True
    assert first.wait_for_control(5.0) == "refused"
    with pytest.raises(NotFound):
        second.get_workflow("missing")
    with pytest.raises(InvalidInput):
        second.heartbeat([DeviceReport("d1", "android", state="sleeping")])  # type: ignore[arg-type]
    # the same answers as HostClient for the same calls
    direct = HostClient(deploy.r, deploy.pool, "h1", token, session="s0000000000000002")
    assert second.host_record() == direct.host_record()
    assert second.config() == direct.config()
    assert second.device_health(["d1", "zz"]) == direct.device_health(["d1", "zz"])
    assert second.send_attributes({"d1": ({"sdk": 34, "release": "14.1"}, ())}) == 1
    assert direct.send_attributes({"d1": ({"sdk": 34}, ("release",))}) == 1
    assert deploy.admin.attributes(["d1"])["d1"][0] == {"sdk": 34}
    with pytest.raises(NotFound):
        second.send_attributes({"zz": ({"sdk": 1}, ())})
    hb = second.heartbeat([DeviceReport("d1", "android", ("wifi",))])
    assert (hb.devices, hb.idle, hb.draining, hb.stopping) == (1, 1, False, False)
    # attributes ride on the heartbeat's rows through the API too (only the changed ones)
    second.heartbeat([DeviceReport("d1", "android", ("wifi",))], attributes={"d1": {"sdk": 35}})
    assert deploy.admin.attributes(["d1"])["d1"][0] == {"sdk": 35}
    second.heartbeat([DeviceReport("d1", "android", ("wifi",))], attributes={"d1": {}})
    assert deploy.admin.attributes(["d1"])["d1"][0] == {}
    with pytest.raises(InvalidInput):
        second.heartbeat_call("delta", "x", "y", 1, [("d1", "android", "", "idle", "", "B=n:1")])
    tid = deploy.client.submit("x")
    TaskScheduler(deploy.admin).assign()
    (a,) = second.claim(3)
    assert a.task.id == tid and a.task.status is TaskStatus.dispatched and a.lease_ms > 0
    assert second.health_begin("d1") is False  # Busy (it holds a lease) -> False, as direct
    with pytest.raises(Busy):
        direct._run("device_health", [*direct._auth(), "begin", "d1"])
    (ren,) = second.renew([(tid, a.lease_id)])
    assert ren.status == "ok" and ren.lease_ms > 0
    assert second.report(tid, a.lease_id, "done", None, "out") == "ok:done"
    assert second.report(tid, a.lease_id, "done", None, "out") == "dup:done"
    assert second.end_session() is True
    assert verify(deploy.admin).ok


def test_an_unreachable_api_is_what_the_daemon_treats_as_redis_unreachable(
    deploy: Deployment, tmp_path: Path
) -> None:
    token = deploy.admin.add_host("h1")
    nowhere = ApiHostClient(f"http://127.0.0.1:{free_port()}", None, "h1", token, timeout=2)
    with pytest.raises(TRANSIENT) as info:
        nowhere.heartbeat([])
    assert isinstance(info.value, ApiUnreachable) and token not in str(info.value)
    # an API whose Redis is down answers 503 UNAVAILABLE: transient too
    down = ApiServer(f"redis://127.0.0.1:{free_port()}/0", deploy.pool, tmp_path / "down.log")
    down.start()
    try:
        with pytest.raises(ApiUnreachable, match="UNAVAILABLE"):
            ApiHostClient(down.url, None, "h1", token).heartbeat([])
    finally:
        down.kill()


def test_api_error_answers_map_to_deviceq_errors() -> None:
    assert isinstance(api_error(401, "AUTH", "wrong token for host h1"), AuthError)
    assert isinstance(api_error(409, "SUPERSEDED", "session s1 ..."), SessionSuperseded)
    assert isinstance(api_error(409, "BUSY", "device d1 holds a lease"), Busy)
    assert isinstance(api_error(404, "NOT_FOUND", "no workflow w"), NotFound)
    exc = api_error(409, "NOT_CONFIRMED", "report: applied, but ...", ["ok:done", "dup:done"])
    assert isinstance(exc, NotConfirmed) and exc.result == ["ok:done", "dup:done"]
    for status, code in ((503, "UNAVAILABLE"), (429, "RATE_LIMITED"), (502, ""), (500, "X")):
        assert isinstance(api_error(status, code, "later"), ApiUnreachable)
        assert isinstance(api_error(status, code, "later"), TRANSIENT)
    other = api_error(418, "TEAPOT", "line one\nline two")
    assert isinstance(other, ApiError) and other.code == "TEAPOT" and str(other) == "line one"


def test_host_run_checks_the_api_options_before_starting(deploy: Deployment) -> None:
    token = deploy.tmp / "t.token"
    token.write_text("t" * 32)
    base = [*CLI, "host", "run", "--host-id", "h1", "--token-file", str(token), "--device",
            "d1:android", "--command", "true"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((TESTS_PATH, SRC_DIR, REPO_DIR))}
    for extra, code, why in (
        (["--api-url", "ftp://x"], 2, "invalid API URL"),  # a usage error
        (["--api-url", "https://u:p@x"], 2, "no credentials"),
        # options that do not go together: could not start, exit 2 as `host run --help` says
        (["--api-url", "http://x", "--api-ca", str(token)], 2, "https:// API URL"),
        (["--api-ca", str(token)], 2, "applies with --api-url"),
    ):
        res = subprocess.run([*base, *extra], capture_output=True, text=True, env=env, timeout=60)
        assert res.returncode == code and why in res.stderr, (extra, res.stderr)
        assert "Traceback" not in res.stderr


def test_heartbeats_through_the_api_are_deltas(deploy: Deployment, api: ApiServer) -> None:
    """`ApiHostClient` sends what changed (the route forwards each call to the script); a body
    without ``mode`` (an older client) is still a full snapshot."""
    token = deploy.admin.add_host("h1")
    host = ApiHostClient(api.url, None, "h1", token)
    calls: list[tuple[str, int, str]] = []
    real = host.heartbeat_call

    def record(mode: str, ver: str, arg: str, total: int, rows: Any) -> Any:
        reply = real(mode, ver, arg, total, rows)
        calls.append((mode, len(rows), reply.status))
        return reply

    host.heartbeat_call = record  # type: ignore[method-assign]
    snap = [DeviceReport(f"d{i}", "android", ("wifi",)) for i in range(3)]
    assert host.heartbeat(snap).devices == 3
    assert calls == [("full", 3, "part"), ("commit", 0, "ok")]
    calls.clear()
    hb = host.heartbeat(snap)
    assert calls == [("delta", 0, "ok")] and (hb.devices, hb.idle) == (3, 3)
    calls.clear()
    hb = host.heartbeat([snap[0], DeviceReport("d1", "android", ("wifi",), "busy", "flashing")])
    assert calls == [("delta", 2, "ok")]  # d1 changed, d2 gone
    assert (hb.devices, hb.idle) == (2, 1)
    assert deploy.admin.device("d2").state.value == "offline"
    assert deploy.admin.device("d1").reason == "flashing"
    old = {"devices": [{"device_id": "d0", "driver_type": "android", "tags": ["wifi"]}]}
    status, doc = http(api.url, "POST", "/hosts/h1/heartbeat", token, old)
    assert status == 200 and (doc["status"], doc["devices"], doc["idle"]) == ("ok", 1, 1)
    assert deploy.admin.device("d1").state.value == "offline", "left out of the full snapshot"
    calls.clear()
    host.heartbeat([snap[0]])  # the full snapshot moved Redis' version on: it asks for it all
    assert [(m, s) for m, _, s in calls] == [("delta", "full"), ("full", "part"), ("commit", "ok")]


def test_a_drain_with_the_api_down_and_nothing_running_ends_at_once(
    deploy: Deployment, api: ApiServer
) -> None:
    """Drained (SIGTERM) while the API is down and nothing runs: the daemon ends at once
    instead of waiting out its grace period, and never says the API is reachable again."""
    proc = api_host(deploy, api, "h1", "d1:android", extra=("--grace", "60", "--command", "true"))
    wait_for(lambda: "host worker started" in deploy.log("h1"), 30, "the host to start")
    wait_for(lambda: deploy.admin.host("h1").alive, 30, "the host's first heartbeat")
    api.kill()
    wait_for(lambda: "api unreachable" in deploy.log("h1"), 30, "the host to see the API down")
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    took = time.monotonic() - began
    assert took < 10, f"the drain took {took:.1f}s with nothing running (grace 60s)"
    log = deploy.log("h1")
    assert "reachable again" not in log, log[-3000:]
    assert "draining" in log


def test_a_claim_through_the_api_carries_the_tasks_list_of_tests(
    deploy: Deployment, api: ApiServer
) -> None:
    token = deploy.admin.add_host("hT")
    h = ApiHostClient(api.url, None, "hT", token)
    h.start_session("sT000000000000001")
    h.heartbeat([DeviceReport("t1", "ios")])
    (tid,) = deploy.client.submit_many([{"goal": "x", "driver_type": "ios",
                                         "tests": ["k#a", "k#b"]}])  # fmt: skip
    plain = deploy.client.submit("y", driver_type="ios")
    TaskScheduler(deploy.admin).assign()
    (got,) = h.claim(1)
    assert (got.task.id, got.tests) == (tid, ["k#a", "k#b"])
    h.report(tid, got.lease_id, "done", payload="ok")
    TaskScheduler(deploy.admin).assign()
    (other,) = h.claim(1)
    assert (other.task.id, other.tests) == (plain, None)
