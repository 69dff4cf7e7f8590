"""Forwarding headers are believed only from the proxies named with ``--trusted-proxy``: real
``deviceq api`` and ``deviceq dashboard`` processes on loopback, real HTTP. Without the option
a rotating ``X-Forwarded-For`` does not escape the per-address limits; with it the header is
the client's address. And the API's table of addresses keeps a locked-out address however
many others fail once."""

from __future__ import annotations

import http.client
import json
import re
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from test_api_server import start_api

from deviceq.api.auth import FailureLimiter
from deviceq.dashboard.users import UserStore
from harness import Deployment, deviceq, free_port, wait_for


def api_get(url: str, token: str, forwarded: str | None) -> tuple[int, dict[str, Any]]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.netloc, timeout=30)
    headers = {"Authorization": f"Bearer {token}"}
    if forwarded is not None:
        headers["X-Forwarded-For"] = forwarded
    try:
        conn.request("GET", "/api/v1/tasks", headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def test_api_ignores_forwarded_for_unless_the_proxy_is_trusted(deploy: Deployment) -> None:
    url = start_api(deploy, "api-direct", "--max-auth-failures", "10", "--auth-window", "600")
    statuses = [api_get(url, f"wrong-{i}", f"198.51.100.{i % 250 + 1}")[0] for i in range(200)]
    assert statuses[:10] == [401] * 10 and set(statuses[10:]) == {429}
    # behind a trusted proxy: each forwarded address has its own count
    proxied = start_api(deploy, "api-proxied", "--max-auth-failures", "10",
                        "--auth-window", "600", "--trusted-proxy", "127.0.0.1")  # fmt: skip
    statuses = [api_get(proxied, f"wrong-{i}", f"198.51.100.{i + 1}")[0] for i in range(200)]
    assert set(statuses) == {401}
    spoofed = [api_get(proxied, "wrong", "203.0.113.7")[0] for _ in range(11)]
    assert spoofed == [401] * 10 + [429]
    assert api_get(proxied, "wrong", "203.0.113.8")[0] == 401  # another client: not locked out
    # the right-most address the trusted proxy did not add is the client's
    assert api_get(proxied, "wrong", "203.0.113.9, 203.0.113.7")[0] == 429
    # a CIDR network names the proxies too
    net = start_api(deploy, "api-net", "--max-auth-failures", "3", "--auth-window", "600",
                    "--trusted-proxy", "127.0.0.0/8")  # fmt: skip
    assert [api_get(net, "x", f"192.0.2.{i}")[0] for i in range(1, 9)] == [401] * 8


def test_a_bad_trusted_proxy_is_a_usage_error(deploy: Deployment) -> None:
    for cmd in ("api", "dashboard"):
        out = deviceq(deploy.url, deploy.pool, cmd, "--trusted-proxy", "proxy.example")
        assert out.returncode == 2 and "not an IP address or CIDR network" in out.stderr
        assert "Traceback" not in out.stderr


def login(base: str, user: str, forwarded: str) -> int:
    """One wrong-password login of ``user`` with ``X-Forwarded-For: forwarded``."""
    parts = urllib.parse.urlsplit(base)
    conn = http.client.HTTPConnection(parts.netloc, timeout=30)
    try:
        conn.request("GET", "/login", headers={"X-Forwarded-For": forwarded})
        resp = conn.getresponse()
        html = resp.read().decode()
        cookies = "; ".join(c.split(";", 1)[0] for c in resp.headers.get_all("set-cookie") or [])
        nonce = re.search(r'name="nonce" value="([^"]+)"', html)
        assert nonce, html
        form = urllib.parse.urlencode({"nonce": nonce.group(1), "next": "/fleet", "user": user,
                                       "password": "not the password"})  # fmt: skip
        conn.request("POST", "/login", body=form, headers={
            "content-type": "application/x-www-form-urlencoded", "cookie": cookies,
            "X-Forwarded-For": forwarded})  # fmt: skip
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def start_dashboard(d: Deployment, name: str, *extra: str) -> str:
    port = free_port()
    d.spawn(name, "dashboard", "--port", str(port), *extra)
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            return conn.getresponse().status == 200
        except OSError:
            return False

    wait_for(answers, 60, f"deviceq dashboard {name} to answer")
    return base


def test_dashboard_logins_count_by_the_connection_unless_the_proxy_is_trusted(
    deploy: Deployment,
) -> None:
    UserStore(deploy.r, deploy.client.keys).add("alice", "viewer", "correct horse battery")
    base = start_dashboard(deploy, "dash-direct")
    # each guess a new name (the per-name limit stays out of it) and a new forwarded address
    with ThreadPoolExecutor(14) as pool:
        statuses = list(pool.map(lambda i: login(base, f"user{i}", f"198.51.100.{i + 1}"),
                                 range(14)))  # fmt: skip
    assert sorted(statuses) == [403] * 10 + [429] * 4, statuses
    proxied = start_dashboard(deploy, "dash-proxied", "--trusted-proxy", "127.0.0.1")
    with ThreadPoolExecutor(12) as pool:
        statuses = list(pool.map(lambda i: login(proxied, f"user{i}", f"192.0.2.{i + 1}"),
                                 range(12)))  # fmt: skip
    assert statuses == [403] * 12, statuses


def test_a_locked_out_address_is_not_pushed_out_by_many_single_failures() -> None:
    now = [0.0]
    limiter = FailureLimiter(limit=5, window=600, max_addresses=100, clock=lambda: now[0])
    for _ in range(5):
        limiter.judge("victim-of-a-lockout", ok=False)
    assert limiter.blocked_for("victim-of-a-lockout") > 0
    for i in range(1000):  # ten times the table, one failure each
        now[0] += 0.01
        assert limiter.judge(f"10.0.{i // 250}.{i % 250}", ok=False) == 0.0
    assert limiter.tracked() == 100
    assert limiter.blocked_for("victim-of-a-lockout") > 0  # still locked out
    # and once its window ends, it may try again
    now[0] = 601.0
    assert limiter.blocked_for("victim-of-a-lockout") == 0.0
