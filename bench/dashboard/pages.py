"""The dashboard's pages, rendered in process through its ASGI app (no HTTP server, no
browser: the time is the page's reads and its template), on a private redis-server holding a
pool of ``--tasks`` tasks (a tenth of them cancelled, one in a hundred with "needle" in its
goal) and ``--hosts`` x ``--devices`` devices (ten of them reserved for a person). Each page is
requested ``--runs`` times after one warm-up; the table has the median and the fastest.

Usage::

    python bench/dashboard/pages.py [--tasks 20000] [--hosts 50] [--devices 20] [--out F]
    python -m bench.ab --baseline REV bench/dashboard/pages.py --tasks 20000

``--new-pages`` adds the pages a baseline may lack (``/devices/ID``, ``/tasks?status=
failed``): leave it out for ``bench.ab``, whose two tables must have the same rows."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (run by path: the repository root)

from bench.support.common import add_hosts, machine, median, private_redis, raw_client, table  # noqa: E402


async def _get(app: Any, target: str) -> tuple[int, int]:
    """GET ``target`` from the ASGI ``app``: (status, body bytes)."""
    path, _, qs = target.partition("?")
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": qs.encode(), "headers": [(b"host", b"bench")],
        "client": ("127.0.0.1", 1), "server": ("bench", 80),
    }  # fmt: skip
    status, size = 0, 0

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status, size
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            size += len(message.get("body", b""))

    await app(scope, receive, send)
    return status, size


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=20_000)
    p.add_argument("--hosts", type=int, default=50)
    p.add_argument("--devices", type=int, default=20, help="devices per host")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--new-pages", action="store_true")
    p.add_argument("--out")
    a = p.parse_args()

    from deviceq import Client
    from deviceq.dashboard import create_app
    from deviceq.ops.admin import PoolAdmin

    with private_redis() as server:
        r = raw_client(server.url)
        pool = "bench"
        client, admin = Client(r, pool), PoolAdmin(r, pool)
        hosts = add_hosts(admin, server.url, a.hosts, a.devices)
        for _, _, devs in hosts[:10]:
            admin.reserve(devs[0].device_id, 3_600_000, "bench: booked")
        ids: list[str] = []
        for start in range(0, a.tasks, 10_000):
            n = min(10_000, a.tasks - start)
            ids += client.submit_many(
                [{"goal": f"job {start + i}{' needle' if (start + i) % 100 == 0 else ''}",
                  "driver_type": "nowhere"} for i in range(n)]
            )  # fmt: skip
        client.cancel_many(ids[: a.tasks // 10])
        app = create_app(client)
        pages = [
            ("tasks", "/tasks"),
            ("tasks, cancelled", "/tasks?status=cancelled"),
            ("tasks, text search", "/tasks?q=needle"),
            ("fleet", "/fleet"),
            ("a cancelled task", f"/tasks/{ids[0]}"),
        ]
        if a.new_pages:
            pages += [
                ("tasks, failed tab", "/tasks?status=failed"),
                ("a device", f"/devices/{hosts[0][2][0].device_id}"),
            ]
        rows = []
        for name, target in pages:
            status, size = asyncio.run(_get(app, target))  # warm-up (and the check)
            assert status == 200, (target, status)
            times = []
            for _ in range(a.runs):
                t0 = time.perf_counter()
                asyncio.run(_get(app, target))
                times.append((time.perf_counter() - t0) * 1000)
            rows.append([name, target.split("/")[1].split("?")[0], a.runs,
                         median(times), min(times), size / 1024])  # fmt: skip
        r.close()
    text = (
        f"{machine()}; {a.tasks:,} tasks ({a.tasks // 10:,} cancelled), "
        f"{a.hosts * a.devices:,} devices on {a.hosts} hosts\n\n"
        + table(["page", "route", "runs", "median ms", "fastest ms", "kB"], rows)
        + "\n"
    )
    print(text)
    if a.out:
        Path(a.out).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
