"""Hostile inputs to a real ``deviceq api`` process over real HTTP (and the same values given
to the Python Client and the CLI): bodies nested past any sane depth, a lone surrogate in a
cancel reason, ``true`` where a number is expected, tags that are no list; and event and log
streams whose token is removed while they are open."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import time
import urllib.parse
from typing import Any

import pytest
from test_api_server import call, start_api

from deviceq import Client, InvalidInput
from deviceq.api.tokens import TokenStore
from harness import CLI, SRC_DIR, Deployment, deviceq

NESTED = b"[" * 100_000


def post_raw(url: str, path: str, body: bytes, token: str) -> tuple[int, dict[str, Any]]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.netloc, timeout=30)
    try:
        conn.request("POST", path, body=body, headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json"})  # fmt: skip
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


@pytest.fixture
def served(deploy: Deployment) -> tuple[Deployment, str, str, str]:
    token = TokenStore(deploy.r, deploy.client.keys).add("tester", "producer")
    host_token = deploy.admin.add_host("h1")
    return deploy, start_api(deploy, "api", "--max-wait", "3"), token, host_token


def test_deeply_nested_bodies_are_one_line_400_on_every_post_route(served: Any) -> None:
    d, url, token, host_token = served
    tid = d.client.submit("g")
    producer_paths = ["/api/v1/tasks", "/api/v1/tasks/batch", f"/api/v1/tasks/{tid}/cancel",
                      f"/api/v1/tasks/{tid}/retry"]  # fmt: skip
    host_paths = [f"/api/v1/hosts/h1/{p}" for p in ("session", "heartbeat", "claim", "wait",
                  "control", "renew", "report", "release", "logs", "artifacts", "draining",
                  "devices/health", "devices/attributes", "nudge")]  # fmt: skip
    for path in producer_paths + host_paths:
        for body in (NESTED, b'{"tasks": ' + b"[" * 40 + b"]" * 40 + b"}"):
            status, answer = post_raw(url, path, body, host_token if "/hosts/" in path else token)
            if path.endswith("/retry") or path.endswith("/nudge"):
                continue  # (these read no body)
            assert status == 400, (path, answer)
            message = answer["error"]["message"]
            assert answer["error"]["code"] == "INVALID" and "\n" not in message
            assert "nested too deeply" in message, (path, message)
    assert d.client.get(tid).status.value == "queued"
    log = d.log("api")
    assert "Traceback" not in log and "RecursionError" not in log and "internal error" not in log


def test_a_lone_surrogate_in_a_cancel_reason_is_refused(served: Any) -> None:
    d, url, token, _ = served
    tid = d.client.submit("g")
    status, body, _ = call(f"{url}/api/v1/tasks/{tid}/cancel", "POST", {"reason": "\ud800"},
                           token=token)  # fmt: skip
    assert (status, body["error"]["code"]) == (400, "INVALID"), body
    assert "surrogate" in body["error"]["message"]
    with pytest.raises(InvalidInput, match="surrogate"):
        d.client.cancel(tid, "bad \udcff reason")
    with pytest.raises(InvalidInput, match="surrogate"):
        d.client.cancel_many([tid], "\ud800")
    # the command line: bytes that are not UTF-8 in --reason
    env = {**os.environ, "DEVICEQ_REDIS_URL": d.url, "DEVICEQ_POOL": d.pool, "PYTHONPATH": SRC_DIR}
    res = subprocess.run([*CLI, "task", "cancel", tid, "--reason", b"stop \xed\xa0\x80 now"],
                         env=env, capture_output=True, timeout=60)  # fmt: skip
    err = res.stderr.decode(errors="replace")
    assert res.returncode == 2 and "surrogate" in err and "Traceback" not in err, err
    assert d.client.get(tid).status.value == "queued"  # nothing changed
    assert "Traceback" not in d.log("api")


NUMBERS = ("priority", "max_attempts", "not_before", "queue_timeout")


def test_true_is_no_number_and_tags_must_be_a_list(served: Any) -> None:
    d, url, token, _ = served
    before = d.client.counts()
    for field in NUMBERS:
        for value in (True, False):
            status, body, _ = call(f"{url}/api/v1/tasks", "POST", {"goal": "g", field: value},
                                   token=token)  # fmt: skip
            assert (status, body["error"]["code"]) == (400, "INVALID"), (field, body)
            assert field in body["error"]["message"]
            with pytest.raises(InvalidInput, match=field):
                d.client.submit("g", **{field: value})
            with pytest.raises(InvalidInput, match=field):
                d.client.submit_many([{"goal": "g", field: value}])
    for tags in ({}, {"wifi": True}):
        status, body, _ = call(f"{url}/api/v1/tasks", "POST", {"goal": "g", "tags": tags},
                               token=token)  # fmt: skip
        assert (status, body["error"]["code"]) == (400, "INVALID"), body
        assert "list" in body["error"]["message"]
        with pytest.raises(InvalidInput, match="list"):
            d.client.submit("g", tags=tags)
    status, body, _ = call(f"{url}/api/v1/tasks/batch", "POST",
                           {"tasks": [{"goal": "ok"}, {"goal": "g", "priority": True}]},
                           token=token)  # fmt: skip
    assert status == 400
    assert d.client.counts() == before  # nothing was written
    # numbers still work
    status, body, _ = call(f"{url}/api/v1/tasks", "POST", {"goal": "g", "priority": 1,
                           "max_attempts": 2, "queue_timeout": 60}, token=token)  # fmt: skip
    assert status == 201
    assert d.client.get(body["id"]).priority == 1


def open_stream(url: str, path: str, token: str) -> tuple[http.client.HTTPConnection, Any]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.netloc, timeout=30)
    conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
    return conn, conn.getresponse()


def test_streams_end_once_their_token_is_removed(deploy: Deployment) -> None:
    store = TokenStore(deploy.r, deploy.client.keys)
    doomed, kept = store.add("doomed", "producer"), store.add("kept", "producer")
    url = start_api(deploy, "api-streams", "--max-wait", "60")
    tid = deploy.client.submit("g")  # queued: its log stream waits for attempt 1
    paths = ["/api/v1/events?timeout=60", f"/api/v1/tasks/{tid}/logs?timeout=60"]
    streams = [open_stream(url, p, doomed) for p in paths]
    survivors = [open_stream(url, p, kept) for p in paths]
    for _, resp in streams + survivors:
        assert resp.status == 200 and resp.readline() == b": connected\n"
    store.remove("doomed")
    removed = time.monotonic()
    for conn, resp in streams:
        rest = resp.read()  # the stream ends by itself
        assert b"event: error" in rest and b"token was removed" in rest, rest[-300:]
        conn.close()
    assert time.monotonic() - removed < 15
    # the other token's streams go on (a keepalive after the others ended)
    for conn, resp in survivors:
        assert resp.readline() in (b": keepalive\n", b"\n")
        conn.close()
    # and the removed token is refused for a new stream
    assert call(f"{url}/api/v1/events?timeout=1", token=doomed)[0] == 401


def test_a_python_client_refuses_true_for_numbers_too(redis_url: str, pool: str) -> None:
    client = Client(redis_url, pool)
    for field in NUMBERS:
        with pytest.raises(InvalidInput, match=field):
            client.submit("g", **{field: True})
    assert sum(client.counts().values()) == 0
    res = deviceq(redis_url, pool, "status")
    assert res.returncode == 0
