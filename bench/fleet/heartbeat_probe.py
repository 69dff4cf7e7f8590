"""Heartbeat cost on a private redis-server: ``python -m bench.fleet.heartbeat_probe [--out PATH]``
(or by path, as ``bench.ab`` runs it).

The heartbeat part of ``bench.fleet.probes`` alone, with ``SLOWLOG`` logging calls over 1 ms
(not 5 ms), so the longest heartbeat call is known down to 1 ms (``<1`` when none is over):

1. ``register``: a 5,000-device host's first heartbeat (the devices register);
2. ``unchanged``: Redis command time (``INFO commandstats``) and Redis CPU per heartbeat in
   which nothing changed, of a host with 10 devices and of one with 5,000
   (`bench.fleet.probes.heartbeat_cost`, 200 heartbeats each);
   ``unchanged 50 ms apart``: the same, each heartbeat starting 50 ms after the previous one
   for both hosts: a call that finds Redis idle costs it more than one right after another
   (caches gone cold), and a 5,000-device host's client spends ~10 ms building its rows
   between two back-to-back heartbeats, a 10-device host's none -- spaced alike, the two
   compare the Redis work alone;
3. ``one changed``: per heartbeat of the 5,000-device host in which one device changes state;
4. ``full resync``: the 5,000-device host's full snapshot again (a client of its own that never
   heartbeated: on a delta-heartbeat tree the chunked full path, else the only one).

5. ``unchanged, calls alone``: 200 (10 devices) and 50 (5,000) unchanged heartbeat script
   calls back to back with their arguments built once (the Redis work alone, without the
   client's time between calls): on a delta tree delta calls with no device (the version
   read from ``host:ID``), else the full-snapshot call.

6. ``floor``: what any script call costs on this server, a script doing nothing and one of
   two commands (a read and a write of the host's hash: the least a heartbeat can do), back
   to back and 50 ms apart.

For each: script calls (``EVALSHA``, ``INFO commandstats``), the longest heartbeat call (ms,
SLOWLOG) and Redis command µs and CPU µs in all (per heartbeat for 2 and 3).
Runs on whatever ``deviceq`` is importable (``PYTHONPATH=.../src``): this tree's or a
baseline's, with the same numbers. Prints a markdown table (``--out`` writes it too)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (run by path: the repository root)

from bench.fleet.probes import (  # noqa: E402
    FLOORS,
    calls_alone,
    enable_slowlog,
    heartbeat_cost,
    read_slowlog,
    sha_names,
)
from bench.support.assignment import POOL, stats, stats_overhead  # noqa: E402
from deviceq import DeviceReport, HostClient, PoolAdmin  # noqa: E402
from deviceq.core.redis_server import RedisServer  # noqa: E402

Row = tuple[str, int, int, float, float, float]  # probe devices calls longest_ms cmd_us cpu_us


SLOWER_THAN_US = 1000
GAP = 0.05  # seconds from one spaced heartbeat's start to the next


def evalsha_calls(r: redis.Redis) -> int:
    info = r.execute_command("INFO", "commandstats")
    return int(info.get("cmdstat_evalsha", {}).get("calls", 0))


def longest_heartbeat(r: redis.Redis, names: dict[str, str]) -> float:
    entries = [e for e in read_slowlog(r, names) if e.is_script and e.script == "heartbeat"]
    return max((e.duration_ms for e in entries), default=0.0)


def measure(
    r: redis.Redis, names: dict[str, str], fn: Callable[[], None]
) -> tuple[int, float, float, float]:
    """Script calls, longest heartbeat call (ms), Redis command µs and CPU µs of ``fn``."""
    cpu_oh, us_oh = stats_overhead(r, 10)
    r.slowlog_reset()
    n0 = evalsha_calls(r)
    c0, u0, _ = stats(r)
    fn()
    c1, u1, _ = stats(r)
    n = evalsha_calls(r) - n0
    lo = longest_heartbeat(r, names)
    return n, lo, max(0.0, u1 - u0 - us_oh), max(0.0, c1 - c0 - cpu_oh)


def floors(r: redis.Redis, names: dict[str, str], key: str) -> list[Row]:
    """Each `FLOORS` script called 200 times back to back, then 40 times 50 ms apart."""
    out: list[Row] = []
    for probe, body in FLOORS.items():
        sha = str(r.script_load(body))

        def alone(sha: str = sha) -> None:
            for i in range(200):
                r.evalsha(sha, 1, key, str(i))

        def spaced(sha: str = sha) -> None:
            for i in range(40):
                t = time.perf_counter()
                r.evalsha(sha, 1, key, str(i))
                time.sleep(max(0.0, GAP - (time.perf_counter() - t)))

        calls, lo, us, cpu = measure(r, names, alone)
        out.append((f"{probe}, calls alone", 0, calls, lo, us / 200, cpu / 200))
        calls, lo, us, cpu = measure(r, names, spaced)
        out.append((f"{probe}, 50 ms apart", 0, calls, lo, us / 40, cpu / 40))
    return out


def run() -> list[Row]:
    names = sha_names()
    out: list[Row] = []
    with RedisServer() as srv:
        r = redis.Redis.from_url(srv.url, decode_responses=True)
        admin = PoolAdmin(srv.url, POOL)
        admin.set_config("host_timeout", 3600)
        enable_slowlog(r)
        r.config_set("slowlog-log-slower-than", SLOWER_THAN_US)
        token = admin.add_host("big")
        big = HostClient(srv.url, POOL, "big", token)
        devs = [DeviceReport(f"big-d{i}", "d0", ()) for i in range(5000)]
        calls, lo, us, cpu = measure(r, names, lambda: big.heartbeat(devs))
        out.append(("register", 5000, calls, lo, us, cpu))

        small = HostClient(srv.url, POOL, "small", admin.add_host("small"))
        small_devs = [DeviceReport(f"small-d{i}", "d1", ()) for i in range(10)]
        small.heartbeat(small_devs)
        for hc, d, beats in ((small, small_devs, 200), (big, devs, 200)):
            r.slowlog_reset()
            n0 = evalsha_calls(r)
            cost = heartbeat_cost(r, hc, d, beats)
            n = evalsha_calls(r) - n0 - 1  # the first beat applies what changed: not measured
            lo = longest_heartbeat(r, names)
            out.append(("unchanged", cost.devices, n, lo, cost.cmd_us, cost.cpu_us))

        for hc, d in ((small, small_devs), (big, devs)):
            hc.heartbeat(d)

            def spaced(hc: HostClient = hc, d: list[DeviceReport] = d) -> None:
                for _ in range(40):
                    t = time.perf_counter()
                    hc.heartbeat(d)
                    time.sleep(max(0.0, GAP - (time.perf_counter() - t)))

            calls, lo, us, cpu = measure(r, names, spaced)
            out.append(("unchanged 50 ms apart", len(d), calls, lo, us / 40, cpu / 40))

        beats = 20

        def one_changed() -> None:
            for i in range(beats):
                state = "busy" if i % 2 == 0 else "idle"
                devs[7] = DeviceReport("big-d7", "d0", (), state)  # type: ignore[arg-type]
                big.heartbeat(devs)

        calls, lo, us, cpu = measure(r, names, one_changed)
        out.append(("one changed", 5000, calls, lo, us / beats, cpu / beats))

        fresh = HostClient(srv.url, POOL, "big", token)
        calls, lo, us, cpu = measure(r, names, lambda: fresh.heartbeat(devs))
        out.append(("full resync", 5000, calls, lo, us, cpu))

        for hc, d, beats in ((small, small_devs, 200), (big, devs, 50)):
            fn = calls_alone(r, hc, d, beats)
            calls, lo, us, cpu = measure(r, names, fn)
            out.append(("unchanged, calls alone", len(d), calls, lo, us / beats, cpu / beats))
        out += floors(r, names, small.keys.host("small"))
        r.close()
    return out


def markdown(rows: list[Row]) -> str:
    lines = [
        "| probe | devices | heartbeat calls | longest call ms | Redis command µs | Redis CPU µs |",
        "|---|---|---|---|---|---|",
    ]
    for probe, n, calls, lo, us, cpu in rows:
        per = " per heartbeat" if probe.startswith(("unchanged", "one changed")) else ""
        per = " per call" if probe.endswith("calls alone") or probe.startswith("floor") else per
        longest = f"{lo:.2f}" if lo else "<1"
        lines.append(f"| {probe}{per} | {n:,} | {calls} | {longest} | {us:,.0f} | {cpu:,.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    t = time.time()
    text = markdown(run())
    print(text)
    print(f"({time.time() - t:.0f}s)", file=sys.stderr)
    if a.out:
        a.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
