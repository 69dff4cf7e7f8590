"""An attempt's live log and its artifacts through the HTTP API: a real ``deviceq api``
process in front of the real private Redis, real scheduler and host daemons (one of them a
``host run --api-url`` daemon that records its uploads through the API), the real file store.
The log read through the API is the log ``deviceq task logs --json`` reads from Redis; the
artifacts downloaded through it match their recorded sha256; only recorded names are served."""

from __future__ import annotations

import hashlib
import http.client
import json
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from test_api_server import Api, start_api
from test_artifacts import artifacts_host, record

from deviceq import TaskStatus
from deviceq.api.tokens import TokenStore
from deviceq.core.errors import AuthError, NotFound
from deviceq.host.http_link import ApiHostClient
from deviceq.ops.verify import verify
from harness import Deployment, deviceq, wait_for

NOWHERE = "redis://127.0.0.1:1/0"
"""A Redis URL that leads nowhere: a command given it can only have used the API."""


@pytest.fixture
def api(deploy: Deployment) -> Api:
    token = TokenStore(deploy.r, deploy.client.keys).add("tester", "producer")
    return Api(start_api(deploy, "api", "--max-wait", "3"), token)


def token_file(d: Deployment, api: Api) -> str:
    path = d.tmp / "api.token"
    path.write_text(api.token + "\n")
    return str(path)


def via_api(d: Deployment, api: Api, *args: str) -> Any:
    """A ``deviceq`` command through the API (its Redis URL leads nowhere)."""
    return deviceq(NOWHERE, d.pool, *args, "--api-url", api.url,
                   "--api-token-file", token_file(d, api))  # fmt: skip


def get(api: Api, path: str, token: str | None = "") -> tuple[int, bytes, dict[str, str]]:
    """A raw GET of ``/api/v1`` + ``path`` (sent as written: no ``..`` folded away)."""
    parts = urllib.parse.urlsplit(api.url)
    conn = http.client.HTTPConnection(parts.netloc, timeout=60)
    headers = {} if token is None else {"Authorization": f"Bearer {token or api.token}"}
    try:
        conn.request("GET", "/api/v1" + path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


def sse(raw: bytes) -> list[tuple[str, Any]]:
    """The (event, data) pairs of a Server-Sent Events body."""
    out = []
    for block in raw.decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line
                      and not line.startswith(":"))  # fmt: skip
        if "data" in fields:
            out.append((fields.get("event", "message"), json.loads(fields["data"])))
    return out


def logs_json(d: Deployment, tid: str) -> list[Any]:
    res = deviceq(d.url, d.pool, "task", "logs", tid, "--json")
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines()]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_running_tasks_log_is_read_and_followed_to_its_end(deploy: Deployment, api: Api) -> None:
    d = deploy
    gate = d.tmp / "go-on"
    d.scheduler()
    d.command_host("h1", "d1:x")
    wait = f"while [ ! -e {gate} ]; do sleep 0.05; done"
    goal = f"echo first; echo oops >&2; {wait}; for i in 1 2 3; do echo line $i; done"
    tid = d.client.submit(goal, driver_type="x")
    client = api.client()
    # while it runs (it cannot end before the gate opens): what is there so far, no end
    # (stdout and stderr are read apart: either may be appended first)
    wait_for(lambda: sorted(e.text for e in client.logs(tid)) == ["first\n", "oops\n"], 60,
             "the first lines through the API")  # fmt: skip
    assert d.client.get(tid).status == TaskStatus.dispatched
    status, raw, headers = get(api, f"/tasks/{tid}/logs?follow=0")
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = sse(raw)
    assert [k for k, _ in events] == ["log", "log"]
    assert sorted(e["stream"] for _, e in events) == ["stderr", "stdout"]
    # followed while it runs, through the CLI and the client, to the attempt's end
    gate.touch()
    followed = [e.json() for e in client.logs(tid, follow=True)]
    assert d.client.get(tid).status == TaskStatus.done
    assert followed == logs_json(d, tid)
    stdout = "".join(e["text"] for e in followed if e["stream"] == "stdout")
    assert stdout == "first\nline 1\nline 2\nline 3\n"
    res = via_api(d, api, "task", "logs", tid, "--follow", "--json")
    assert res.returncode == 0, res.stderr
    assert [json.loads(line) for line in res.stdout.splitlines()] == followed
    res = via_api(d, api, "task", "logs", tid, "--attempt", "1")
    assert res.returncode == 0 and "[stderr] oops" in res.stdout and "line 3" in res.stdout
    # a finished attempt's stream ends with its end event
    status, raw, _ = get(api, f"/tasks/{tid}/logs?attempt=1")
    events = sse(raw)
    assert [e for k, e in events if k == "log"] == followed
    assert events[-1] == ("end", {"attempt": 1, "status": "done", "succeeded": True})
    # bad input: one line, 400; unknown task 404
    for query in ("attempt=0", "attempt=x", "follow=2", "limit=0", "since=bad"):
        status, raw, _ = get(api, f"/tasks/{tid}/logs?{query}")
        assert status == 400 and json.loads(raw)["error"]["code"] == "INVALID", query
    status, raw, _ = get(api, "/tasks/no-such-task/logs")
    assert status == 404 and json.loads(raw)["error"]["code"] == "NOT_FOUND"
    assert via_api(d, api, "task", "logs", "no-such-task").returncode == 1
    assert verify(d.admin).ok


def test_a_failed_attempt_followed_through_the_api_exits_1(deploy: Deployment, api: Api) -> None:
    d = deploy
    d.scheduler()
    d.command_host("h1", "d1:x")
    tid = d.client.submit("echo bad; exit 3", driver_type="x", max_attempts=1)
    res = via_api(d, api, "task", "logs", tid, "--follow")
    assert (res.returncode, res.stdout) == (1, "bad\n"), res.stderr
    assert d.client.get(tid).status == TaskStatus.failed
    res = via_api(d, api, "task", "logs", tid, "--timeout", "5")
    assert res.returncode == 2 and "--timeout goes with --follow" in res.stderr


def test_artifacts_are_listed_and_downloaded_only_by_their_recorded_names(
    deploy: Deployment, api: Api, tmp_path: Path
) -> None:
    d = deploy
    state = tmp_path / "state"
    d.scheduler()
    artifacts_host(d, state)
    goal = ('echo hello; mkdir "$DEVICEQ_ARTIFACTS_DIR/logs"; '
            'printf report > "$DEVICEQ_ARTIFACTS_DIR/report.txt"; '
            'printf deep > "$DEVICEQ_ARTIFACTS_DIR/logs/device.log"')  # fmt: skip
    tid = d.client.submit(goal, driver_type="x")
    assert d.client.wait(tid, timeout=60).status == TaskStatus.done
    wait_for(lambda: record(d, tid).get("artifacts"), 30, "artifacts recorded")
    client = api.client()
    listed = client.artifacts(tid)
    assert listed == {"task_id": tid, "attempt": 1, "artifacts": record(d, tid)["artifacts"],
                      "artifacts_error": None}  # fmt: skip
    assert client.artifacts(tid, attempt=1) == listed
    with pytest.raises(NotFound):
        client.artifacts(tid, attempt=2)
    # no store set for the pool: the service cannot read one (no URL or path in the answer)
    status, raw, _ = get(api, f"/tasks/{tid}/artifacts/1/report.txt")
    assert status in (400, 503) and b"file:" not in raw and str(state).encode() not in raw
    store_url = f"file://{state / 'artifacts'}"
    d.admin.set_config("artifact_store", store_url)
    into = tmp_path / "down"
    for f in listed["artifacts"]:
        path = client.download_artifact(tid, 1, f["name"], into)
        assert sha(path.read_bytes()) == f["sha256"]
    assert (into / "logs" / "device.log").read_bytes() == b"deep"
    status, raw, headers = get(api, f"/tasks/{tid}/artifacts/1/report.txt")
    assert (status, raw, headers["x-deviceq-sha256"]) == (200, b"report", sha(b"report"))
    # the CLI through the API: the same listing, and a download checked
    res = via_api(d, api, "task", "artifacts", tid, "--json", "--download", str(tmp_path / "c"))
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["artifacts"] == listed["artifacts"] and len(out["downloaded"]) == 3
    assert (tmp_path / "c" / "report.txt").read_bytes() == b"report"
    res = via_api(d, api, "task", "artifacts", tid, "--artifact-store", store_url)
    assert res.returncode == 2 and "not available with --api-url" in res.stderr
    # only recorded names: a file in the store but not in the record, escapes, other attempts
    (state / "artifacts" / d.pool / tid / "1" / "secret.txt").write_text("not recorded")
    (state / "artifacts" / d.pool / "other.txt").write_text("outside")
    for name in ("secret.txt", "../other.txt", "../../other.txt", "%2e%2e/%2e%2e/other.txt",
                 "logs/../report.txt", "/etc/passwd", "nothing"):  # fmt: skip
        status, raw, _ = get(api, f"/tasks/{tid}/artifacts/1/{name}")
        assert status == 404, (name, raw)
        assert b"file:" not in raw and str(state).encode() not in raw
    for path in (f"/tasks/{tid}/artifacts/2/report.txt", "/tasks/nope/artifacts/1/report.txt"):
        assert get(api, path)[0] == 404
    assert get(api, f"/tasks/{tid}/artifacts/0/report.txt")[0] == 400
    # a recorded file gone from the store: 404, and the tampered one fails its check
    (state / "artifacts" / d.pool / tid / "1" / "report.txt").write_bytes(b"tampered")
    with pytest.raises(Exception, match="does not match"):
        client.download_artifact(tid, 1, "report.txt", tmp_path / "t")
    assert not (tmp_path / "t" / "report.txt").exists()
    (state / "artifacts" / d.pool / tid / "1" / "report.txt").write_bytes(b"re")  # shorter
    with pytest.raises(Exception, match="does not match"):
        client.download_artifact(tid, 1, "report.txt", tmp_path / "t")
    assert not (tmp_path / "t" / "report.txt").exists()
    (state / "artifacts" / d.pool / tid / "1" / "logs" / "device.log").unlink()
    assert get(api, f"/tasks/{tid}/artifacts/1/logs/device.log")[0] == 404
    assert verify(d.admin).ok


def test_every_new_route_needs_a_token(deploy: Deployment, api: Api) -> None:
    tid = deploy.client.submit("x", driver_type="x")
    for path in (f"/tasks/{tid}/logs?follow=0", f"/tasks/{tid}/artifacts",
                 f"/tasks/{tid}/artifacts/1/log.txt"):  # fmt: skip
        for token in (None, "wrong-token", api.token + "x"):
            status, raw, headers = get(api, path, token)
            assert status == 401 and json.loads(raw)["error"]["code"] == "AUTH", (path, token)
            assert headers["www-authenticate"] == "Bearer"
    status, raw, _ = get(api, "/openapi.json", None)
    paths = json.loads(raw)["paths"]
    assert paths["/api/v1/tasks/{task_id}/logs"]["get"]["summary"].startswith("Follow")
    download = paths["/api/v1/tasks/{task_id}/artifacts/{attempt}/{name}"]["get"]
    assert [p["name"] for p in download["parameters"]] == ["task_id", "attempt", "name"]
    assert "/api/v1/hosts/{host_id}/artifacts" in paths


def test_a_host_through_the_api_records_its_artifacts(
    deploy: Deployment, api: Api, tmp_path: Path
) -> None:
    d = deploy
    store = tmp_path / "store"
    d.scheduler()
    d.host("h1", "d1:x", env={"DEVICEQ_REDIS_URL": NOWHERE}, extra=(
        "--api-url", api.url, "--goal-runner", "command", "--command", "sh -c {goal}",
        "--state-dir", str(tmp_path / "state"), "--artifact-store", f"file://{store}"))  # fmt: skip
    tid = d.client.submit('echo via-api; printf kept > "$DEVICEQ_ARTIFACTS_DIR/out.bin"',
                          driver_type="x")  # fmt: skip
    assert d.client.wait(tid, timeout=60).status == TaskStatus.done
    wait_for(lambda: record(d, tid).get("artifacts"), 30, "artifacts recorded through the API")
    rec = record(d, tid)
    by_name = {f["name"]: f for f in rec["artifacts"]}
    assert set(by_name) == {"log.txt", "out.bin"} and "artifacts_error" not in rec
    assert by_name["out.bin"] == {"name": "out.bin", "size": 4, "sha256": sha(b"kept")}
    assert (store / d.pool / tid / "1" / "out.bin").read_bytes() == b"kept"
    log = (d.tmp / "h1.log").read_text()
    assert "not recorded" not in log
    # downloaded through the API from the same store
    d.admin.set_config("artifact_store", f"file://{store}")
    got = api.client().download_artifact(tid, 1, "out.bin", tmp_path / "down")
    assert got.read_bytes() == b"kept"
    # another host may not record this attempt's artifacts: refused, the record unchanged
    other = ApiHostClient(api.url, None, "h2", d.admin.add_host("h2"))
    with pytest.raises(AuthError):
        other.record_artifacts(tid, 1, [("forged.txt", 1, "0" * 64)])
    with pytest.raises(AuthError):  # nor through its own id with h1's path
        ApiHostClient(api.url, None, "h1", "w" * 32).record_artifacts(tid, 1, [])
    assert record(d, tid)["artifacts"] == rec["artifacts"]
    other.close()
    assert verify(d.admin).ok
