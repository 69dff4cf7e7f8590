"""Device attributes in heartbeats on a private redis-server: ``python -m bench.fleet.attr_heartbeat
[--devices 5000] [--rounds 20] [--realtime-redis] [--out PATH]`` (or by path).

A host of ``--devices`` devices (5,000), each with 5 attributes (``sdk``, ``model``,
``release``, ``battery``, ``temperature``), heartbeating through ``HostClient`` with its
attributes (``heartbeat(devices, attributes=...)``); ``SLOWLOG`` logs every call (slower than
0 µs), so each script call's own time is read from it (Redis' time inside the call: load on
the machine cannot make it look shorter, only a busy core longer). Bytes are what Redis read
from the client (``INFO stats`` ``total_net_input_bytes``, the INFO calls' own bytes
subtracted):

1. ``register``: the host's first heartbeat, a full snapshot of its devices with their
   attributes, chunked (the pacer sizes chunks toward 2.5 ms, at most 100 devices);
2. ``unchanged``: a heartbeat in which nothing changed (a delta of no device), per heartbeat;
3. ``one battery``: a discovery round that changed one device's ``battery`` (the delta carries
   that device's row and ``battery=n:N`` alone), per heartbeat;
4. ``full resync``: the whole snapshot again with every attribute (a new client: Redis asks it
   for the full snapshot), chunked as in 1;
5. for comparison, the path heartbeats replaced: ``device_attrs`` calls (``send_attributes``,
   100 devices a call, as the host daemon sent them before) -- the 5,000 devices' first upload
   on a host that registered without attributes, and one battery level (the unchanged heartbeat
   then went with it).

Per probe: script calls, the longest call and the median call (µs, SLOWLOG), bytes sent, and
Redis command µs (``INFO commandstats``) in all."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (run by path: the repository root)

from bench.fleet.probes import sha_names  # noqa: E402
from bench.support.assignment import POOL, stats, stats_overhead  # noqa: E402
from bench.support.procs import REALTIME_ENV, realtime  # noqa: E402
from deviceq import DeviceReport, HostClient, PoolAdmin  # noqa: E402
from deviceq.core.redis_server import RedisServer  # noqa: E402

Row = tuple[str, int, int, float, float, float, float]
# probe, devices, calls, longest µs, median µs, bytes, Redis command µs


def attributes(n: int, battery_of: Callable[[int], int]) -> dict[str, dict[str, object]]:
    return {
        f"d{i}": {"sdk": 28 + i % 8, "model": f"Pixel {i % 9}", "release": f"14.{i % 3}.1",
                  "battery": battery_of(i), "temperature": 30 + (i % 10) / 2}
        for i in range(n)
    }  # fmt: skip


def net_in(r: redis.Redis) -> int:
    return int(r.info("stats")["total_net_input_bytes"])


def measure(
    r: redis.Redis, names: dict[str, str], fn: Callable[[], object]
) -> tuple[int, float, float, float, float]:
    """Script calls, longest and median call µs (SLOWLOG), bytes Redis read, command µs."""
    _, us_oh = stats_overhead(r, 10)
    b_oh = net_in(r)
    b_oh = net_in(r) - b_oh  # (one INFO stats call's bytes)
    r.slowlog_reset()
    b0 = net_in(r)
    _, u0, _ = stats(r)
    fn()
    _, u1, _ = stats(r)
    b1 = net_in(r)
    durations = []
    for e in r.slowlog_get(100_000):
        cmd = e["command"]
        parts = (cmd.decode(errors="replace") if isinstance(cmd, bytes) else str(cmd)).split(" ")
        if parts[0].upper() == "EVAL" or (  # (EVAL: a script's first call sends its body)
            parts[0].upper() == "EVALSHA"
            and names.get(parts[1], "") in ("heartbeat", "device_attrs")
        ):
            durations.append(int(e["duration"]))
    longest = max(durations, default=0)
    median = statistics.median(durations) if durations else 0.0
    return len(durations), longest, median, max(0, b1 - b0 - 2 * b_oh), max(0.0, u1 - u0 - us_oh)


def run(devices: int, rounds: int) -> list[Row]:
    names = sha_names()
    out: list[Row] = []
    srv = realtime(RedisServer().start())
    try:
        r = redis.Redis.from_url(srv.url, decode_responses=True)
        r.config_set("slowlog-log-slower-than", 0)
        r.config_set("slowlog-max-len", 100_000)
        admin = PoolAdmin(srv.url, POOL)
        admin.set_config("host_timeout", 3600)
        token = admin.add_host("big")
        big = HostClient(srv.url, POOL, "big", token)
        devs = [DeviceReport(f"d{i}", "android", ()) for i in range(devices)]
        attrs = attributes(devices, lambda i: i % 101)

        calls, lo, med, nbytes, us = measure(
            r, names, lambda: big.heartbeat(devs, attributes=attrs)
        )
        out.append(
            ("register, with attributes (full snapshot)", devices, calls, lo, med, nbytes, us)
        )

        def beats(make: Callable[[int], dict[str, dict[str, object]]]) -> Callable[[], None]:
            def go() -> None:
                for k in range(rounds):
                    big.heartbeat(devs, attributes=make(k))

            return go

        big.heartbeat(devs, attributes=attrs)
        calls, lo, med, nbytes, us = measure(r, names, beats(lambda k: attrs))
        out.append(
            ("unchanged, per heartbeat", devices, calls, lo, med, nbytes / rounds, us / rounds)
        )

        def one_battery(k: int) -> dict[str, dict[str, object]]:
            a = dict(attrs)
            a["d7"] = {**attrs["d7"], "battery": 50 + k % 2}  # (d7's level moves every round)
            return a

        calls, lo, med, nbytes, us = measure(r, names, beats(one_battery))
        out.append(
            (
                "one battery changed, per heartbeat",
                devices,
                calls,
                lo,
                med,
                nbytes / rounds,
                us / rounds,
            )
        )

        fresh = HostClient(srv.url, POOL, "big", token)
        calls, lo, med, nbytes, us = measure(
            r, names, lambda: fresh.heartbeat(devs, attributes=attrs)
        )
        out.append(("full resync, with attributes", devices, calls, lo, med, nbytes, us))

        # the path heartbeats replaced: device_attrs calls beside a heartbeat without attributes
        t2 = admin.add_host("old")
        old = HostClient(srv.url, POOL, "old", t2)
        odevs = [DeviceReport(f"o{i}", "android", ()) for i in range(devices)]
        old.heartbeat(odevs)
        oattrs = {f"o{i}": a for i, a in enumerate(attrs.values())}
        changes = {d: (a, ()) for d, a in oattrs.items()}
        calls, lo, med, nbytes, us = measure(r, names, lambda: old.send_attributes(changes))
        out.append(
            (
                "before: first upload by device_attrs (100 a call)",
                devices,
                calls,
                lo,
                med,
                nbytes,
                us,
            )
        )

        def old_one_battery() -> None:
            for k in range(rounds):
                old.heartbeat(odevs)
                old.send_attributes({"o7": ({"battery": 50 + k % 2}, ())})

        calls, lo, med, nbytes, us = measure(r, names, old_one_battery)
        probe = "before: unchanged heartbeat + device_attrs of one battery, per round"
        out.append((probe, devices, calls, lo, med, nbytes / rounds, us / rounds))
        r.close()
    finally:
        srv.stop()
    return out


def markdown(rows: list[Row]) -> str:
    lines = [
        "| probe | devices | script calls | longest call µs | median call µs | bytes sent "
        "| Redis command µs |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for probe, n, calls, lo, med, nbytes, us in rows:
        lines.append(f"| {probe} | {n:,} | {calls} | {lo:,.0f} | {med:,.0f} | {nbytes:,.0f} "
                     f"| {us:,.0f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--devices", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--out", type=Path)
    p.add_argument(
        "--realtime-redis",
        action="store_true",
        help="run the redis-server under SCHED_FIFO (root): SLOWLOG then times the calls' own "
        "work, not the time other processes take the CPU from it",
    )
    a = p.parse_args()
    if a.realtime_redis:
        os.environ[REALTIME_ENV] = "1"
    t = time.time()
    text = markdown(run(a.devices, a.rounds))
    print(text)
    print(f"({time.time() - t:.0f}s)", file=sys.stderr)
    if a.out:
        a.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
