"""The caller's CPU per call of the host daemon's hot calls, in one process on a private
redis-server (``time.process_time`` around a sequential loop: user + system CPU of this
process, which is what a daemon pays per call; wall time beside it):

- ``EVALSHA return 1`` through a plain redis-py client: the floor of a script call from Python;
- ``claim`` of an empty inbox, and a ``report`` the script refuses (``rejected:not_found``):
  each one script call through `HostClient`, with everything deviceq wraps around it;
- a wake-up then a claim, as the host's main loop does after an empty claim: an ``LPUSH`` on
  the host's wake list, then the wait and the claim (``HostClient.wait_and_claim`` where the
  tree has it, else ``wait_for_work`` and ``claim``);
- ``report`` of one done task and ``claim`` of one assignment, over a real lifecycle
  (submit and assignment in between are not counted).

Usage: ``python bench/fleet/call_cpu.py [--calls N] [--out F]``; side by side with a baseline:
``python -m bench.ab --baseline REV --rounds 3 bench/fleet/call_cpu.py``."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (run by path: the repository root)

from bench.support.common import add_hosts, preload_scripts, private_redis, raw_client  # noqa: E402
from deviceq.core.connection import connect  # noqa: E402
from deviceq.host.link import Report  # noqa: E402
from deviceq.host.redis_link import HostClient  # noqa: E402
from deviceq.ops.admin import PoolAdmin  # noqa: E402
from deviceq.producer import Client  # noqa: E402
from deviceq.scheduler.client import SchedulerClient  # noqa: E402


def cpu_per_call(fn: Callable[[], Any], n: int) -> tuple[float, float]:
    """(CPU µs, wall µs) per call of ``fn``, over ``n`` calls after 50 warm-up calls."""
    for _ in range(50):
        fn()
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        fn()
    return (time.process_time() - c0) * 1e6 / n, (time.perf_counter() - w0) * 1e6 / n


def run(n: int) -> list[tuple[str, float, float]]:
    rows: list[tuple[str, float, float]] = []
    with private_redis() as server:
        raw = raw_client(server.url)
        preload_scripts(raw)
        admin = PoolAdmin(raw, "bench")
        admin.set_config("max_queue_depth", 10_000_000)
        host_id, token, _ = add_hosts(admin, server.url, 1, 100)[0]
        r = connect(server.url)  # as a daemon connects
        host = HostClient(r, "bench", host_id, token)
        host.start_session("bench-session")
        floor = raw.register_script("return 1")
        rows.append(("EVALSHA return 1 (plain redis-py)",
                     *cpu_per_call(lambda: floor(keys=["dq:{bench}:x"], args=[]), n)))  # fmt: skip
        rows.append(("claim, empty inbox", *cpu_per_call(lambda: host.claim(100), n)))
        refused = [Report("no-such-task", "no-lease", "done", None, "")]
        rows.append(("report, refused", *cpu_per_call(lambda: host.report_many(refused), n)))
        wake = host.keys.host_wake(host_id)
        both = getattr(host, "wait_and_claim", None)

        def woken_claim() -> None:
            raw.lpush(wake, "x")
            if both is not None:
                both(1.0, 100)
            else:
                host.wait_for_work(1.0)
                host.claim(100)

        push_cpu, push_wall = cpu_per_call(lambda: raw.lpush(wake + ":other", "x"), n)
        cpu, wall = cpu_per_call(woken_claim, n)
        rows.append(("wake-up then claim (LPUSH excluded)", cpu - push_cpu, wall - push_wall))

        client, store = Client(raw, "bench"), SchedulerClient(raw, "bench")
        device = f"{host_id}-d000"
        claim_cpu = report_cpu = claim_wall = report_wall = 0.0
        m = max(50, n // 4)
        for _ in range(m):
            tid = client.submit("g", driver_type="android")
            store.commit([(tid, device)])
            c0, w0 = time.process_time(), time.perf_counter()
            (a,) = host.claim(1)
            c1, w1 = time.process_time(), time.perf_counter()
            host.report_many([Report(a.task.id, a.lease_id, "done", None, "ok")])
            c2, w2 = time.process_time(), time.perf_counter()
            claim_cpu, claim_wall = claim_cpu + c1 - c0, claim_wall + w1 - w0
            report_cpu, report_wall = report_cpu + c2 - c1, report_wall + w2 - w1
        rows.append(("claim, one assignment", claim_cpu * 1e6 / m, claim_wall * 1e6 / m))
        rows.append(("report, one done", report_cpu * 1e6 / m, report_wall * 1e6 / m))
        r.close()
        raw.close()
    return rows


def table(rows: list[tuple[str, float, float]], calls: int) -> str:
    lines = ["| call | through | calls | caller CPU µs/call | wall µs/call |",
             "|---|---|---:|---:|---:|"]  # fmt: skip
    for name, cpu, wall in rows:
        through = "redis-py" if "redis-py" in name else "HostClient"
        n = calls if "one " not in name else max(50, calls // 4)
        lines.append(f"| {name} | {through} | {n} | {cpu:.1f} | {wall:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per row [2000]")
    ap.add_argument("--out", type=Path, help="write the markdown table here too")
    a = ap.parse_args()
    if a.calls < 10:
        ap.error("--calls must be >= 10")
    md = table(run(a.calls), a.calls)
    print(md, end="")
    if a.out:
        a.out.write_text(md, encoding="utf-8")


if __name__ == "__main__":
    main()
