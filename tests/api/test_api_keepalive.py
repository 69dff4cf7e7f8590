"""HTTP keep-alive of the API clients, seen from a real ``deviceq api`` process's access log
(each line names the client's address and port): `ApiClient` and `ApiHostClient` send their
requests on one connection per thread, a new one after an idle pause, after ``close`` or
with ``keep_alive`` off."""

from __future__ import annotations

import re
import threading
import time

from test_api_server import start_api

from deviceq.api.tokens import TokenStore
from deviceq.core.http import IDLE_REUSE
from deviceq.host.http_link import ApiHostClient
from deviceq.producer.http_client import ApiClient
from harness import Deployment, wait_for


def ports(d: Deployment, request: str, count: int) -> list[str]:
    """The client ports of the access log's lines of ``request`` ("POST /path"), once it
    holds ``count`` of them."""
    pattern = re.compile(r"127\.0\.0\.1:(\d+) - \"" + re.escape(request) + r"[ ?]")

    def found() -> list[str]:
        return [m.group(1) for m in pattern.finditer(d.log("api"))]

    wait_for(lambda: len(found()) >= count, 20, f"{count} x {request} in the access log")
    return found()


def test_the_producer_client_reuses_one_connection_until_idle_or_told_not_to(
    deploy: Deployment,
) -> None:
    d = deploy
    token = TokenStore(d.r, d.client.keys).add("ka", "producer")
    url = start_api(d, "api")
    client = ApiClient(url, token)
    ids = [client.submit(f"task {i}") for i in range(8)]
    assert [client.get(t).goal for t in ids] == [f"task {i}" for i in range(8)]
    first = ports(d, "POST /api/v1/tasks", 8)
    assert len(set(first)) == 1, first  # eight submits, one connection
    assert set(ports(d, f"GET /api/v1/tasks/{ids[0]}", 1)) == set(first)
    time.sleep(IDLE_REUSE + 0.5)  # idle: the next request opens a new connection
    client.submit("after a pause")
    after = ports(d, "POST /api/v1/tasks", 9)[-1]
    assert after not in first
    fresh = ApiClient(url, token)
    fresh.keep_alive = False
    for i in range(3):
        fresh.submit(f"one connection each {i}")
    each = ports(d, "POST /api/v1/tasks", 12)[-3:]
    assert len(set(each)) == 3 and not set(each) & {*first, after}, each


def test_the_host_client_keeps_one_connection_per_thread_and_close_drops_them(
    deploy: Deployment,
) -> None:
    d = deploy
    url = start_api(d, "api")
    host = ApiHostClient(url, None, "h1", d.admin.add_host("h1"))
    request = "GET /api/v1/hosts/h1/session"
    for _ in range(4):
        assert host.host_record()["session"] == ""
    main = set(ports(d, request, 4))
    assert len(main) == 1, main
    other = threading.Thread(target=lambda: [host.host_record() for _ in range(3)])
    other.start()
    other.join(30)
    second = set(ports(d, request, 7)[4:])
    assert len(second) == 1 and not second & main, second  # a thread has its own
    host.close()
    host.host_record()
    assert ports(d, request, 8)[-1] not in main | second
