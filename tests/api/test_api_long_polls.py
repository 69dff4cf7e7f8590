"""Long polls and streams of one host or one token cannot take the service from the others:
a real ``deviceq api`` process in front of the real private Redis, flooded with concurrent
long polls by real threads over real HTTP, while a producer and another host keep working."""

from __future__ import annotations

import http.client
import threading
import time
import urllib.parse
from typing import Any

from test_api_server import call, start_api

from deviceq.api.tokens import TokenStore
from harness import Deployment, wait_for


def blocked_clients(d: Deployment) -> int:
    return sum(1 for c in d.r.client_list() if c.get("cmd") in ("blpop", "xread"))


def test_one_hosts_long_polls_leave_the_service_to_the_others(deploy: Deployment) -> None:
    token_a = deploy.admin.add_host("hA")
    token_b = deploy.admin.add_host("hB")
    producer = TokenStore(deploy.r, deploy.client.keys).add("ci", "producer")
    url = start_api(deploy, "api-polls", "--max-wait", "20", "--max-waits-per-host", "4")
    waits: list[tuple[int, Any, dict[str, str]]] = []
    lock = threading.Lock()
    go = threading.Barrier(110)

    def long_poll() -> None:
        go.wait()
        got = call(f"{url}/api/v1/hosts/hA/wait", "POST", {"timeout": 30}, token=token_a)
        with lock:
            waits.append(got)

    threads = [threading.Thread(target=long_poll) for _ in range(110)]
    for t in threads:
        t.start()
    before = time.monotonic()
    # while hA's polls block: a producer submits and reads, host hB beats, claims, waits
    wait_for(lambda: blocked_clients(deploy) + len(waits) >= 110, 30, "the polls to block")
    others: list[int] = []
    while time.monotonic() - before < 4:
        status, body, _ = call(f"{url}/api/v1/tasks", "POST", {"goal": "g"}, token=producer)
        others.append(status)
        assert status == 201, body
        status, body, _ = call(f"{url}/api/v1/tasks/{body['id']}", token=producer)
        others.append(status)
        assert status == 200, body
        status, body, _ = call(f"{url}/api/v1/hosts/hB/heartbeat", "POST", {"devices": []},
                               token=token_b)  # fmt: skip
        others.append(status)
        assert status == 200, body
        status, body, _ = call(f"{url}/api/v1/hosts/hB/claim", "POST", {"max": 1},
                               token=token_b)  # fmt: skip
        others.append(status)
        assert status == 200, body
        status, body, _ = call(f"{url}/api/v1/hosts/hB/wait", "POST", {"timeout": 0.2},
                               token=token_b)  # fmt: skip
        others.append(status)
        assert status == 200, body
    # then hA's own nudges wake its held polls (each wakes one)
    while any(t.is_alive() for t in threads) and time.monotonic() - before < 40:
        assert call(f"{url}/api/v1/hosts/hA/nudge", "POST", {}, token=token_a)[0] == 200
        time.sleep(0.2)
    for t in threads:
        t.join(60)
    assert len(others) >= 10 and set(others) <= {200, 201}
    statuses = sorted(s for s, _, _ in waits)
    assert 503 not in statuses
    assert statuses.count(200) == 4, statuses  # the host's bound: the rest refused at once
    refused = [(b, h) for s, b, h in waits if s == 429]
    assert len(refused) == 106
    for body, headers in refused:
        assert body["error"]["code"] == "RATE_LIMITED"
        assert "hA" in body["error"]["message"] and "\n" not in body["error"]["message"]
        assert 1 <= int(headers["retry-after"]) <= 30
    assert "Traceback" not in deploy.log("api-polls")


def open_stream(url: str, path: str, token: str) -> tuple[http.client.HTTPConnection, Any]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.netloc, timeout=30)
    conn.request("GET", path, headers={"Authorization": f"Bearer {token}"})
    return conn, conn.getresponse()


def test_one_tokens_streams_and_waits_are_bounded_and_given_back(deploy: Deployment) -> None:
    store = TokenStore(deploy.r, deploy.client.keys)
    greedy, other = store.add("greedy", "producer"), store.add("other", "producer")
    url = start_api(deploy, "api-streams", "--max-wait", "20", "--max-waits-per-token", "2")
    task_id = deploy.client.submit("g")
    held = [open_stream(url, "/api/v1/events?timeout=20", greedy) for _ in range(2)]
    for _, resp in held:
        assert resp.status == 200 and resp.readline() == b": connected\n"
    # a third stream, a task wait, a log stream of the same token: refused at once
    for path in ("/api/v1/events?timeout=20", f"/api/v1/tasks/{task_id}/wait?timeout=20"):
        started = time.monotonic()
        status, body, headers = call(url + path, token=greedy)
        assert (status, body["error"]["code"]) == (429, "RATE_LIMITED"), body
        assert "greedy" in body["error"]["message"] and headers["retry-after"] == "1"
        assert time.monotonic() - started < 5
    # another token is not held back
    status, body, _ = call(f"{url}/api/v1/tasks/{task_id}/wait?timeout=0.5", token=other)
    assert status == 200 and body["terminal"] is False
    # a stream that ends (its client gone) gives its slot back
    conn, _ = held.pop()
    conn.close()

    def a_slot_is_free() -> bool:
        status, _, _ = call(f"{url}/api/v1/tasks/{task_id}/wait?timeout=0.2", token=greedy)
        return status == 200

    wait_for(a_slot_is_free, 15, "the closed stream's slot")
    for conn, _ in held:
        conn.close()
