"""Wrong dashboard logins sent concurrently: how many reach the credential check per second.

A dashboard with an operator token (`deviceq.dashboard.create_app`) on a real uvicorn server
(a thread of this process) and a private ``redis-server``; ``--clients`` threads each load the
login form and post a wrong token, over and over, for ``--seconds``. Counted by answer: 403
(the token was checked and refused), 429 (refused before any check: the login limit). Run on
this tree and on a baseline with ``python -m bench.ab --baseline REV
bench/dashboard/login.py``.

Usage: python bench/dashboard/login.py [--clients 40] [--seconds 10] [--out FILE]"""

from __future__ import annotations

import argparse
import http.client
import re
import socket
import threading
import time
import urllib.parse
from collections import Counter
from pathlib import Path

import uvicorn

from deviceq import Client
from deviceq.core.redis_server import RedisServer
from deviceq.dashboard import create_app

TOKEN = "bench-token-" + "0123456789abcdef0123456789abcdef"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _guess(port: int) -> int:
    """One wrong login: GET the form (nonce and cookie), POST a wrong token; the status."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", "/login")
        resp = conn.getresponse()
        html = resp.read().decode()
        cookie = (resp.headers.get("set-cookie") or "").split(";")[0]
        m = re.search(r'name="nonce" value="([^"]+)"', html)
        form = {"nonce": m.group(1) if m else "", "token": "wrong-" + "x" * 30, "next": "/"}
        conn.request("POST", "/login", body=urllib.parse.urlencode(form), headers={
            "cookie": cookie, "content-type": "application/x-www-form-urlencoded"})  # fmt: skip
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=40)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with RedisServer() as server:
        pool = "bench" + str(time.time_ns() % 10**9)
        port = _free_port()
        app = create_app(Client(server.url, pool), TOKEN)
        srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                            log_level="critical", access_log=False))  # fmt: skip
        th = threading.Thread(target=srv.run, daemon=True)
        th.start()
        while not srv.started:
            time.sleep(0.05)
        counts: Counter[int] = Counter()
        lock = threading.Lock()
        stop = time.monotonic() + args.seconds

        def client() -> None:
            while time.monotonic() < stop:
                status = _guess(port)
                with lock:
                    counts[status] += 1

        t0 = time.monotonic()
        workers = [threading.Thread(target=client) for _ in range(args.clients)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        took = time.monotonic() - t0
        srv.should_exit = True
        th.join(10)
    c = args.clients
    lines = [
        f"{c} concurrent clients from one address for {took:.1f} s",
        "",
        "| clients | addresses | measure | value |",
        "|---|---|---|---|",
        f"| {c} | 1 | wrong logins checked (403) per s | {counts[403] / took:.2f} |",
        f"| {c} | 1 | wrong logins checked (403) | {counts[403]} |",
        f"| {c} | 1 | refused before any check (429) per s | {counts[429] / took:.2f} |",
        f"| {c} | 1 | answers per s | {sum(counts.values()) / took:.2f} |",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
