"""``deviceq api``, the HTTP service, as a real ``deviceq api`` process on a loopback port in
front of the real private Redis: authentication, the producer protocol (its JSON equal to
``deviceq task show --json``), a task run by real daemons and followed by long poll and
Server-Sent Events, API tokens, the rate limit on failed logins, the body limit and TLS."""

from __future__ import annotations

import hashlib
import http.client
import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deviceq import Client, NotFound, TaskStatus
from deviceq.api.tokens import TokenStore
from deviceq.core.events import last_event_id
from deviceq.ops.verify import verify
from deviceq.producer.http_client import ApiClient, ApiError
from harness import Deployment, deviceq, free_port, wait_for

PRODUCER_PATHS = {
    "/api/v1/tasks",
    "/api/v1/tasks/batch",
    "/api/v1/tasks/{task_id}",
    "/api/v1/tasks/{task_id}/cancel",
    "/api/v1/tasks/{task_id}/retry",
    "/api/v1/tasks/{task_id}/wait",
    "/api/v1/events",
}


@dataclass
class Api:
    url: str  # http(s)://127.0.0.1:PORT
    token: str
    ca: str | None = None

    def client(self) -> ApiClient:
        return ApiClient(self.url, self.token, self.ca)


def start_api(d: Deployment, name: str, *extra: str, scheme: str = "http",
              ca: str | None = None) -> str:  # fmt: skip
    """A ``deviceq api`` process of the deployment's pool; its base URL once it answers."""
    port = free_port()
    d.spawn(name, "api", "--port", str(port), *extra)
    url = f"{scheme}://127.0.0.1:{port}"
    import ssl

    context = ssl.create_default_context(cafile=ca) if ca else None

    def answers() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/api/v1/openapi.json", timeout=2, context=context):
                return True
        except (urllib.error.URLError, OSError):
            return False

    wait_for(answers, 60, f"deviceq api {name} to answer")
    return url


@pytest.fixture
def api(deploy: Deployment) -> Api:
    token = TokenStore(deploy.r, deploy.client.keys).add("tester", "producer")
    return Api(start_api(deploy, "api", "--max-wait", "3"), token)


def call(url: str, method: str = "GET", body: Any = None, token: str | None = None,
         raw: bytes | None = None) -> tuple[int, Any, dict[str, str]]:  # fmt: skip
    """A plain urllib request (what curl does): status, decoded JSON body, headers."""
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, json.loads(exc.read()), dict(exc.headers)


def show_json(d: Deployment, task_id: str) -> Any:
    out = deviceq(d.url, d.pool, "task", "show", task_id, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def task_count(d: Deployment) -> int:
    return sum(d.client.counts().values())


# -- authentication ---------------------------------------------------------------------------
def test_openapi_is_open_and_every_other_route_needs_a_token(api: Api) -> None:
    with urllib.request.urlopen(f"{api.url}/api/v1/openapi.json", timeout=10) as resp:
        schema = json.loads(resp.read())
    assert set(schema["paths"]) >= PRODUCER_PATHS
    assert schema["paths"]["/api/v1/tasks"]["post"]["summary"] == "Submit one task."
    assert schema["paths"]["/api/v1/tasks/{task_id}/wait"]["get"]["security"] == [{"apiToken": []}]
    assert schema["paths"]["/api/v1/openapi.json"]["get"]["security"] == []
    for token in (None, "wrong-token", api.token + "x"):
        status, body, headers = call(f"{api.url}/api/v1/tasks", token=token)
        assert status == 401
        assert body["error"]["code"] == "AUTH"
        assert "\n" not in body["error"]["message"]
        assert headers["www-authenticate"] == "Bearer"
    status, _, _ = call(f"{api.url}/api/v1/tasks", "POST", {"goal": "x"}, token="nope")
    assert status == 401
    assert call(f"{api.url}/api/v1/tasks", token=api.token)[0] == 200


def test_a_producer_token_is_no_host_token(deploy: Deployment, api: Api) -> None:
    deploy.admin.add_host("h1")
    before = {k: deploy.r.dump(k) for k in deploy.r.scan_iter(f"dq:{{{deploy.pool}}}:*")}
    host = f"{api.url}/api/v1/hosts/h1"
    for path, body in (
        ("/heartbeat", {"devices": []}),
        ("/session", {"session": "s1", "mode": "start", "owner": "m:b:1:2", "expected": ""}),
        ("/claim", {"max": 1, "wait": 0}),
        ("/control", {"timeout": 0.01}),
        ("/renew", {"leases": []}),
        (
            "/report",
            {
                "reports": [
                    {
                        "task_id": "t1",
                        "lease_id": "l1",
                        "outcome": "done",
                        "failure_kind": "",
                        "payload": "",
                    }
                ]
            },
        ),  # fmt: skip
    ):
        status, got, _ = call(host + path, "POST", body, token=api.token)
        assert status == 401 and got["error"]["code"] == "AUTH", (path, status, got)
    after = {k: deploy.r.dump(k) for k in deploy.r.scan_iter(f"dq:{{{deploy.pool}}}:*")}
    assert after == before


# -- the producer protocol ---------------------------------------------------------------------
def test_submit_get_list_cancel_retry_wait_round_trip(deploy: Deployment, api: Api) -> None:
    base = f"{api.url}/api/v1"
    status, body, _ = call(f"{base}/tasks", "POST", {"goal": "open settings",
                           "driver_type": "android", "tags": ["wifi"], "priority": 3,
                           "max_attempts": 2, "tenant": "team-a",
                           "retry_backoff": "fixed:5"}, token=api.token)  # fmt: skip
    assert status == 201
    tid = body["id"]
    status, got, _ = call(f"{base}/tasks/{tid}", token=api.token)
    assert status == 200
    assert got == show_json(deploy, tid)
    assert (got["goal"], got["tags"], got["priority"], got["tenant"]) == (
        "open settings", ["wifi"], 3, "team-a"
    )  # fmt: skip
    assert got["submitted_by"] == "tester"  # the token's name: who submitted it

    # the batch: idempotency keys honoured (a repeat answers the same ids, creates nothing)
    batch = {"tasks": [{"goal": "a", "idempotency_key": "k-a"}, {"workflow": "wf", "tags": []}]}
    deploy.client.put_workflow({"name": "wf", "steps": [{"name": "s1", "goal": "tap"}]})
    status, first, _ = call(f"{base}/tasks/batch", "POST", batch, token=api.token)
    assert status == 201 and len(first["ids"]) == 2
    n = task_count(deploy)
    status, again, _ = call(f"{base}/tasks/batch", "POST", {"tasks": batch["tasks"][:1]},
                            token=api.token)  # fmt: skip
    assert (status, again["ids"]) == (201, first["ids"][:1])
    assert task_count(deploy) == n

    status, listed, _ = call(f"{base}/tasks?status=queued&tag=wifi&limit=10", token=api.token)
    assert status == 200 and [t["id"] for t in listed["tasks"]] == [tid]
    assert listed["tasks"][0] == show_json(deploy, tid)
    status, listed, _ = call(f"{base}/tasks?tenant=team-a", token=api.token)
    assert [t["id"] for t in listed["tasks"]] == [tid]
    status, listed, _ = call(f"{base}/tasks?limit=2", token=api.token)
    assert len(listed["tasks"]) == 2

    # a long poll of a queued task ends after its timeout with terminal false
    status, waited, _ = call(f"{base}/tasks/{tid}/wait?timeout=0.2", token=api.token)
    assert (status, waited["terminal"], waited["task"]["status"]) == (200, False, "queued")

    status, cancelled, _ = call(f"{base}/tasks/{tid}/cancel", "POST", {"reason": "no need"},
                                token=api.token)  # fmt: skip
    assert (status, cancelled) == (200, {"id": tid, "answer": "cancelled"})
    status, waited, _ = call(f"{base}/tasks/{tid}/wait", token=api.token)
    assert waited["terminal"] is True and waited["task"] == show_json(deploy, tid)
    assert waited["task"]["status"] == "cancelled"
    status, again, _ = call(f"{base}/tasks/{tid}/cancel", "POST", token=api.token)
    assert again["answer"] == "already:cancelled"
    ends = [e for e in deploy.client.events(task=tid) if e.type == "cancelled"]
    assert [e.fields.get("by") for e in ends] == ["tester"]

    status, retried, _ = call(f"{base}/tasks/{tid}/retry", "POST", token=api.token)
    assert status == 201 and retried["retry_of"] == tid
    new = show_json(deploy, retried["id"])
    assert (new["status"], new["goal"], new["priority"]) == ("queued", "open settings", 3)
    assert (new["submitted_by"], new["retry_of"]) == ("tester", tid)
    status, body, _ = call(f"{base}/tasks/{retried['id']}/retry", "POST", token=api.token)
    assert (status, body["error"]["code"]) == (400, "INVALID")


@pytest.mark.parametrize(
    ("path", "method", "payload", "status"),
    [
        ("/tasks", "POST", b"{not json", 400),
        ("/tasks", "POST", b'["a list"]', 400),
        ("/tasks", "POST", b'{"goal": "x", "colour": "red"}', 400),
        ("/tasks", "POST", b'{"goal": "x", "tags": "wifi"}', 400),
        ("/tasks", "POST", b'{"goal": "x", "tags": ["bad tag\\n"]}', 400),
        ("/tasks", "POST", b'{"goal": "x", "priority": 99}', 400),
        ("/tasks", "POST", b'{"driver_type": "android"}', 400),
        ("/tasks", "POST", b'{"goal": "x", "by": "someone-else"}', 400),
        ("/tasks/batch", "POST", b'{"tasks": [{"goal": "x", "retry_of": "abc"}]}', 400),
        ("/tasks/batch", "POST", b'{"tasks": [{"goal": "ok"}, {"goal": 3}]}', 400),
        ("/tasks/batch", "POST", b'{"tasks": []}', 400),
        ("/tasks/batch", "POST", b'{"goal": "x"}', 400),
        ("/tasks/bad%0Aid", "GET", None, 400),
        ("/tasks/nope", "GET", None, 404),
        ("/tasks/bad%20id/cancel", "POST", None, 400),
        ("/tasks/nope/cancel", "POST", b'{"why": 1}', 400),
        ("/tasks/nope/wait?timeout=-1", "GET", None, 400),
        ("/tasks?status=sleeping", "GET", None, 400),
        ("/tasks?limit=0", "GET", None, 400),
        ("/tasks?host=a%2Fb", "GET", None, 400),
        ("/events?since=x", "GET", None, 400),
        ("/events?task=a%20b", "GET", None, 400),
    ],
)
def test_bad_input_is_one_line_400_and_changes_nothing(
    deploy: Deployment, api: Api, path: str, method: str, payload: bytes | None, status: int
) -> None:
    before = task_count(deploy)
    got, body, _ = call(f"{api.url}/api/v1{path}", method, raw=payload, token=api.token)
    assert got == status
    assert set(body) == {"error"} and "\n" not in body["error"]["message"]
    assert task_count(deploy) == before


def test_a_task_run_by_real_daemons_seen_by_wait_and_events(deploy: Deployment, api: Api) -> None:
    deploy.scheduler()
    deploy.command_host("h1", "d1:x")
    wait_for(lambda: deploy.alive("h1"), 30, "host h1 alive")
    client = api.client()
    seen: list[Any] = []
    cursor = last_event_id(deploy.r, deploy.client.keys)
    tid = client.submit("echo hello-from-api", driver_type="x")

    def follow() -> None:
        for e in client.events(since=cursor, task=tid, follow=True):
            seen.append(e)
            if e.type == "done":
                return

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    done = client.wait(tid, timeout=60)
    assert done.status == TaskStatus.done
    assert done.model_dump(mode="json") == show_json(deploy, tid)
    reader.join(60)
    types = [e.type for e in seen]
    assert types[0] == "submitted" and types[-1] == "done"
    assert {"assigned", "dispatched"} <= set(types)
    assert all(e.task == tid for e in seen)

    # the raw stream: Server-Sent Events, the same objects as `deviceq events --json`
    req = urllib.request.Request(
        f"{api.url}/api/v1/events?since=0-0&task={tid}&follow=0",
        headers={"Authorization": f"Bearer {api.token}"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        text = resp.read().decode()
    datas = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
    cli = deviceq(deploy.url, deploy.pool, "events", "--task", tid, "--json")
    assert datas == json.loads(cli.stdout)

    # the CLI through the API: task wait exits 0 for a done task
    env_cmd = deviceq(deploy.url, deploy.pool, "task", "wait", tid, "--api-url", api.url,
                      "--api-token-file", str(token_file(deploy, api)), "--json")  # fmt: skip
    assert env_cmd.returncode == 0, env_cmd.stderr
    assert json.loads(env_cmd.stdout) == show_json(deploy, tid)
    assert verify(deploy.admin).ok


def token_file(d: Deployment, api: Api) -> Path:
    path = d.tmp / "api.token"
    path.write_text(api.token + "\n")
    return path


def test_cli_producer_commands_through_the_api(deploy: Deployment, api: Api) -> None:
    opts = ("--api-url", api.url, "--api-token-file", str(token_file(deploy, api)))
    out = deviceq(
        "redis://127.0.0.1:1/0",
        deploy.pool,
        "submit",
        "via api",
        "--tag",
        "x,y",
        "--priority",
        "2",
        *opts,
    )  # fmt: skip  (no Redis reachable: the API is used)
    assert out.returncode == 0, out.stderr
    tid = out.stdout.strip()
    shown = deviceq("redis://127.0.0.1:1/0", deploy.pool, "task", "show", tid, "--json", *opts)
    assert json.loads(shown.stdout) == show_json(deploy, tid)
    assert json.loads(shown.stdout)["tags"] == ["x", "y"]
    waited = deviceq(deploy.url, deploy.pool, "task", "wait", tid, "--timeout", "0.3", *opts)
    assert waited.returncode == 124 and "still queued" in waited.stderr
    cancelled = deviceq(deploy.url, deploy.pool, "task", "cancel", tid, *opts)
    assert cancelled.stdout.strip() == f"{tid} cancelled"
    assert deploy.status(tid) == TaskStatus.cancelled
    retried = deviceq(deploy.url, deploy.pool, "task", "retry", tid, "--json", *opts)
    assert json.loads(retried.stdout)["retry_of"] == tid
    listed = deviceq(deploy.url, deploy.pool, "task", "list", "--status", "cancelled", "--json",
                     *opts)  # fmt: skip
    assert [t["id"] for t in json.loads(listed.stdout)] == [tid]
    filtered = deviceq(deploy.url, deploy.pool, "task", "cancel", "--status", "queued", *opts)
    assert filtered.returncode == 2
    assert filtered.stderr.strip() == "error: --status is not available with --api-url"
    bad = deviceq(deploy.url, deploy.pool, "task", "show", tid, "--api-url", api.url,
                  "--api-token-file", str(deploy.tmp / "h1.token.missing"))  # fmt: skip
    assert bad.returncode == 2


def test_client_dispatches_an_http_url_to_the_api(
    deploy: Deployment, api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = Client(api.url, token=api.token)
    assert isinstance(client, ApiClient)
    tid = client.submit("dispatched", tags=["t1"])
    assert client.get(tid).model_dump() == deploy.client.get(tid).model_dump()
    assert [t.id for t in client.list("queued", tags=["t1"])] == [tid]
    with pytest.raises(NotFound):
        client.get("0000000000000000")
    monkeypatch.setenv("DEVICEQ_API_URL", api.url)
    monkeypatch.setenv("DEVICEQ_API_TOKEN", api.token)
    from_env = Client()
    assert isinstance(from_env, ApiClient)
    assert from_env.submit_many([{"goal": "one"}, {"goal": "two"}]) != []
    assert api.token not in repr(from_env)
    with pytest.raises(TimeoutError):
        from_env.wait(tid, timeout=0.2)


# -- tokens -----------------------------------------------------------------------------------
def pool_dump(d: Deployment) -> str:
    """Every key and value of the pool, as text."""
    out = []
    for key in d.r.scan_iter(match=f"dq:{{{d.pool}}}:*"):
        kind = d.r.type(key)
        value: Any = {
            "string": d.r.get, "hash": d.r.hgetall, "list": lambda k: d.r.lrange(k, 0, -1),
            "set": d.r.smembers, "zset": lambda k: d.r.zrange(k, 0, -1),
            "stream": lambda k: d.r.xrange(k),
        }[kind](key)  # fmt: skip
        out.append(f"{key} {value}")
    return "\n".join(out)


def test_tokens_add_list_remove_stored_only_as_digests(deploy: Deployment, api: Api) -> None:
    added = deviceq(deploy.url, deploy.pool, "api", "token", "add", "ci", "--role", "operator",
                    "--json")  # fmt: skip
    assert added.returncode == 0, added.stderr
    info = json.loads(added.stdout)
    token = info["token"]
    assert (info["name"], info["role"]) == ("ci", "operator")
    dump = pool_dump(deploy)
    assert token not in dump and api.token not in dump
    assert hashlib.sha256(token.encode()).hexdigest() in dump
    again = deviceq(deploy.url, deploy.pool, "api", "token", "add", "ci", "--role", "producer")
    assert again.returncode == 1 and again.stdout == ""
    assert again.stderr.count("\n") == 1 and "exists" in again.stderr
    bad = deviceq(deploy.url, deploy.pool, "api", "token", "add", "c i", "--role", "producer")
    assert bad.returncode == 1 and "invalid token name" in bad.stderr
    listed = deviceq(deploy.url, deploy.pool, "api", "token", "list", "--json")
    rows = json.loads(listed.stdout)
    assert [(r["name"], r["role"]) for r in rows] == [("ci", "operator"), ("tester", "producer")]
    assert all(set(r) == {"name", "role", "created_at"} for r in rows)
    plain = deviceq(deploy.url, deploy.pool, "api", "token", "list")
    assert token not in plain.stdout and "ci  operator" in plain.stdout

    assert call(f"{api.url}/api/v1/tasks", token=token)[0] == 200  # an operator may too
    removed = deviceq(deploy.url, deploy.pool, "api", "token", "remove", "ci")
    assert removed.returncode == 0
    assert call(f"{api.url}/api/v1/tasks", token=token)[0] == 401
    gone = deviceq(deploy.url, deploy.pool, "api", "token", "remove", "ci")
    assert gone.returncode == 1 and "no API token named ci" in gone.stderr
    assert token not in deploy.log("api") and api.token not in deploy.log("api")


# -- hardening --------------------------------------------------------------------------------
def test_failed_logins_are_rate_limited_across_concurrent_requests(deploy: Deployment) -> None:
    good = TokenStore(deploy.r, deploy.client.keys).add("good", "producer")
    url = start_api(deploy, "api-limited", "--max-auth-failures", "5", "--auth-window", "600")
    results: list[tuple[int, dict[str, str]]] = []
    lock = threading.Lock()
    go = threading.Barrier(30)

    def guess(i: int) -> None:
        go.wait()
        status, _, headers = call(f"{url}/api/v1/tasks", token=f"guess-{i}")
        with lock:
            results.append((status, headers))

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(30)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    statuses = sorted(s for s, _ in results)
    assert statuses == [401] * 5 + [429] * 25
    assert all(1 <= int(h["retry-after"]) <= 600 for s, h in results if s == 429)
    # once blocked, even the right token is refused (no oracle for guesses)
    status, body, headers = call(f"{url}/api/v1/tasks", token=good)
    assert (status, body["error"]["code"]) == (429, "RATE_LIMITED")
    assert good not in deploy.log("api-limited")


def test_wrong_host_tokens_count_toward_the_same_limit(deploy: Deployment) -> None:
    """Guesses at a host's token on the host protocol are limited like API tokens, across
    concurrent requests; the host's real token is then refused too."""
    real = deploy.admin.add_host("h1")
    url = start_api(deploy, "api-hosts", "--max-auth-failures", "5", "--auth-window", "600")
    statuses: list[int] = []
    lock = threading.Lock()
    go = threading.Barrier(20)

    def guess(i: int) -> None:
        go.wait()
        status, _, _ = call(f"{url}/api/v1/hosts/h1/heartbeat", "POST", {"devices": []},
                            token=f"guess-{i:030d}")  # fmt: skip
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(statuses) == [401] * 5 + [429] * 15
    status, body, _ = call(f"{url}/api/v1/hosts/h1/heartbeat", "POST", {"devices": []},
                           token=real)  # fmt: skip
    assert (status, body["error"]["code"]) == (429, "RATE_LIMITED")
    assert deploy.r.hget(deploy.admin.keys.host("h1"), "last_heartbeat") == "0"  # never beat


def test_a_too_large_body_is_413_by_length_and_while_streaming(deploy: Deployment) -> None:
    token = TokenStore(deploy.r, deploy.client.keys).add("big", "producer")
    url = start_api(deploy, "api-small", "--max-body", "2048")
    big = json.dumps({"goal": "x" * 3000}).encode()
    status, body, _ = call(f"{url}/api/v1/tasks", "POST", raw=big, token=token)
    assert (status, body["error"]["code"]) == (413, "TOO_LARGE")
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(big), 512):
            yield big[i : i + 512]

    conn.request("POST", "/api/v1/tasks", body=chunks(), encode_chunked=True,
                 headers={"Authorization": f"Bearer {token}",
                          "Content-Type": "application/json"})  # fmt: skip
    resp = conn.getresponse()
    assert resp.status == 413
    assert json.loads(resp.read())["error"]["code"] == "TOO_LARGE"
    conn.close()
    assert task_count(deploy) == 0
    small = call(f"{url}/api/v1/tasks", "POST", {"goal": "fits"}, token=token)
    assert small[0] == 201


def make_cert(tmp: Path) -> tuple[Path, Path]:
    cert, key = tmp / "api.pem", tmp / "api.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def test_tls_with_a_self_signed_certificate(deploy: Deployment) -> None:
    cert, key = make_cert(deploy.tmp)
    token = TokenStore(deploy.r, deploy.client.keys).add("tls", "producer")
    url = start_api(deploy, "api-tls", "--tls-cert", str(cert), "--tls-key", str(key),
                    scheme="https", ca=str(cert))  # fmt: skip
    client = ApiClient(url, token, ca=str(cert))
    tid = client.submit("over tls")
    assert client.get(tid).goal == "over tls"
    with pytest.raises(ApiError) as err:  # the system's CAs do not know this certificate
        ApiClient(url, token).get(tid)
    assert err.value.code == "UNAVAILABLE" and "certificate" in str(err.value).lower()
    tf = deploy.tmp / "tls.token"
    tf.write_text(token)
    shown = deviceq(deploy.url, deploy.pool, "task", "show", tid, "--json", "--api-url", url,
                    "--api-token-file", str(tf), "--api-ca", str(cert))  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == show_json(deploy, tid)
    unverified = deviceq(deploy.url, deploy.pool, "task", "show", tid, "--api-url", url,
                         "--api-token-file", str(tf))  # fmt: skip
    assert unverified.returncode == 1 and unverified.stderr.count("\n") == 1


@pytest.mark.parametrize(
    "args",
    [
        ("--tls-cert", "CERT"),
        ("--tls-key", "KEY"),
        ("--port", "70000"),
        ("--max-body", "10"),
    ],
)
def test_bad_serve_options_exit_2_in_one_line(deploy: Deployment, args: tuple[str, ...]) -> None:
    cert, key = make_cert(deploy.tmp)
    real = [str(cert) if a == "CERT" else str(key) if a == "KEY" else a for a in args]
    out = deviceq(deploy.url, deploy.pool, "api", *real)
    assert out.returncode == 2
    assert out.stdout == ""
    assert "Traceback" not in out.stderr


def test_the_http_producer_client_does_not_import_the_web_stack() -> None:
    code = (
        "import sys; from deviceq import ApiClient, Client; "
        "print(sorted(m for m in ('starlette', 'uvicorn', 'anyio') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)  # fmt: skip
    assert out.stdout.strip() == "[]"


def test_a_priority_class_submitted_through_the_api_is_stored_with_its_priority(
    deploy: Deployment, api: Api
) -> None:
    deploy.admin.add_priority_class("release-blocker", 9, preempts=True)
    keys = deploy.client.keys

    def stored(tid: str) -> tuple[str, str]:
        cls, prio = deploy.r.hmget(keys.task(tid), "class", "priority")
        return str(cls), str(prio)

    opts = ("--api-url", api.url, "--api-token-file", str(token_file(deploy, api)))
    out = deviceq(
        "redis://127.0.0.1:1/0",
        deploy.pool,
        "submit",
        "via the cli",
        "--class",
        "release-blocker",
        *opts,
    )  # fmt: skip  (no Redis: the API is used)
    assert out.returncode == 0, out.stderr
    by_cli = out.stdout.strip()
    status, body, _ = call(f"{api.url}/api/v1/tasks", "POST",
                           {"goal": "over http", "priority_class": "release-blocker"},
                           token=api.token)  # fmt: skip
    assert status == 201, body
    assert [stored(by_cli), stored(body["id"])] == [("release-blocker", "9")] * 2
    for tid in (by_cli, body["id"]):
        shown = show_json(deploy, tid)
        assert (shown["priority_class"], shown["priority"]) == ("release-blocker", 9)
    n = task_count(deploy)
    status, body, _ = call(f"{api.url}/api/v1/tasks", "POST",
                           {"goal": "x", "priority_class": "no-such-class"},
                           token=api.token)  # fmt: skip
    assert status >= 400 and task_count(deploy) == n, body
