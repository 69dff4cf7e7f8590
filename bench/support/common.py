"""Shared helpers of the core benchmarks (bench.lifecycle, bench.fleet, bench.scheduler, ...):
a private redis-server, command statistics deltas, machine load, percentiles and tables.

Run the benches from the repository root (``python -m bench.SUBJECT.NAME``, see
bench/README.md); they import ``deviceq`` from the installed/editable package."""

from __future__ import annotations

import math
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis

from deviceq.core.redis_server import RedisServer  # noqa: E402
from deviceq.host.link import DeviceReport  # noqa: E402
from deviceq.host.redis_link import HostClient  # noqa: E402
from deviceq.ops.admin import PoolAdmin  # noqa: E402

GOAL = "open the settings app, enable wifi, check the connection: ok"
"""The typical goal every benchmark submits (60 bytes: the task hash stays a listpack)."""
assert len(GOAL) == 60

# commands a benchmark sends itself around the measured calls: never counted as script work
CLIENT_SIDE = {"evalsha", "eval", "info", "config", "ping", "script", "hello", "client", "select"}


@contextmanager
def private_redis(appendonly: bool = False) -> Any:
    """A private redis-server (no persistence unless ``appendonly``), stopped on exit."""
    server = RedisServer(appendonly=appendonly)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def raw_client(url: str, decode: bool = True) -> redis.Redis:
    """A plain client without health-check PINGs (they would pollute command counts)."""
    return redis.Redis.from_url(url, decode_responses=decode)


def preload_scripts(r: redis.Redis) -> None:
    """SCRIPT LOAD every transition so that no measured EVALSHA meets NOSCRIPT."""
    from deviceq.core import scripts

    for name in scripts.names():
        r.script_load(scripts.source(name))


def commandstats(r: redis.Redis) -> dict[str, dict[str, float]]:
    """``INFO commandstats`` as {command: {calls, usec, ...}} (lower-case command names)."""
    out: dict[str, dict[str, float]] = {}
    for key, val in r.info("commandstats").items():
        out[key.removeprefix("cmdstat_").lower()] = {k: float(v) for k, v in val.items()}
    return out


@dataclass
class StatDelta:
    """What the server did between two ``commandstats`` snapshots."""

    per_command: dict[str, int]
    evalsha_calls: int
    evalsha_usec: float
    inner_usec: float  # time the server spent in the script's commands themselves

    @property
    def inner_calls(self) -> int:
        """Commands run by scripts (everything but what the client sends itself)."""
        return sum(n for c, n in self.per_command.items() if c not in CLIENT_SIDE)

    def breakdown(self, per: int) -> str:
        items = sorted(
            ((c, n) for c, n in self.per_command.items() if c not in CLIENT_SIDE and n),
            key=lambda cn: -cn[1],
        )
        return " ".join(f"{c.upper()}:{n / per:.3g}" for c, n in items)


def stat_delta(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> StatDelta:
    per: dict[str, int] = {}
    inner_usec = 0.0
    for cmd, v in after.items():
        n = int(v["calls"] - before.get(cmd, {}).get("calls", 0))
        if n:
            per[cmd] = n
            if cmd not in CLIENT_SIDE:
                inner_usec += v["usec"] - before.get(cmd, {}).get("usec", 0)
    ev_a, ev_b = after.get("evalsha", {}), before.get("evalsha", {})
    return StatDelta(
        per_command=per,
        evalsha_calls=int(ev_a.get("calls", 0) - ev_b.get("calls", 0)),
        evalsha_usec=ev_a.get("usec", 0) - ev_b.get("usec", 0),
        inner_usec=inner_usec,
    )


def redis_cpu_s(r: redis.Redis) -> float:
    """CPU seconds the redis-server process used so far (user + sys): unlike commandstats'
    wall-clock usec, not inflated when other processes preempt the server."""
    c = r.info("cpu")
    return float(c["used_cpu_user"]) + float(c["used_cpu_sys"])


def machine() -> str:
    """One line: cores, load averages, Python, redis-server version."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    try:
        ver = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, check=False
        ).stdout.split()[2]
    except (OSError, IndexError):
        ver = "?"
    return (
        f"{os.cpu_count()} cores, load avg (1/5/15 min) {load}, "
        f"Python {platform.python_version()}, redis-server {ver.removeprefix('v=')}"
    )


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100), nearest-rank: the smallest value with at least p% of the
    values at or below it."""
    if not values:
        return float("nan")
    s = sorted(values)
    return float(s[max(0, min(len(s) - 1, math.ceil(len(s) * p / 100) - 1))])


def median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub markdown table (also readable on a terminal)."""

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            if v != v:
                return "-"
            return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
        if isinstance(v, int):
            return f"{v:,}"
        return str(v)

    body = [[fmt(v) for v in r] for r in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(headers)
    ]
    lines = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    lines += [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in body
    ]
    return "\n".join(lines)


def add_hosts(
    admin: PoolAdmin,
    url: str,
    n_hosts: int,
    devices_per_host: int,
    driver_type: str = "android",
    tags: tuple[str, ...] = (),
) -> list[tuple[str, str, list[DeviceReport]]]:
    """Create hosts with idle devices (one heartbeat each); returns (host_id, token, devices)."""
    out = []
    for h in range(n_hosts):
        host_id = f"h{h:03d}"
        token = admin.add_host(host_id)
        devs = [
            DeviceReport(f"{host_id}-d{d:03d}", driver_type, tags) for d in range(devices_per_host)
        ]
        hc = HostClient(url, admin.pool, host_id, token)
        hc.heartbeat(devs)
        hc.close()
        out.append((host_id, token, devs))
    return out


class Timer:
    """``with Timer() as t: ...`` then ``t.s`` seconds (perf_counter)."""

    def __enter__(self) -> Timer:
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.s = time.perf_counter() - self.t0
