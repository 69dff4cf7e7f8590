"""The in-process fleet and the Redis CPU counters of the assignment benchmarks
(``bench.scheduler.assign``, ``bench.scheduler.policy``, ``bench.fleet``): hosts of
``DEVICES_PER_HOST`` devices registered by one heartbeat each, tasks finished by claiming and
reporting them, and Redis CPU and command time read from ``INFO`` with the cost of that
reading measured apart (`stats_overhead`)."""

from __future__ import annotations

from typing import Any

import redis

from deviceq import DeviceReport, HostClient, PoolAdmin
from deviceq.host.link import Report

POOL = "bench"
GOAL = "open the settings app, enable wifi, check the connection"
DEVICES_PER_HOST = 100


def signatures(n: int) -> list[dict[str, Any]]:
    if n == 1:
        return [{}]
    return [{"driver_type": f"d{i % 4}", "tags": [f"t{i // 4}"]} for i in range(n)]


def device_kind(i: int, sigs: int) -> tuple[str, tuple[str, ...]]:
    if sigs == 1:
        return ("d0", ())
    return (f"d{i % 4}", tuple(f"t{j}" for j in range(max(1, sigs // 4))))


def stats(r: redis.Redis) -> tuple[float, float, int]:
    info = r.execute_command("INFO", "cpu", "commandstats")
    cpu = float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])
    usec = sum(
        int(v["usec"]) for k, v in info.items() if k.startswith("cmdstat_") and k != "cmdstat_info"
    )
    calls = sum(
        int(v["calls"]) for k, v in info.items() if k.startswith("cmdstat_") and k != "cmdstat_info"
    )
    return cpu * 1e6, float(usec), calls


def stats_overhead(r: redis.Redis, n: int = 30) -> tuple[float, float]:
    """Redis CPU and command time that one stats() pair adds by itself (subtracted)."""
    cpu = us = 0.0
    for _ in range(n):
        c0, u0, _ = stats(r)
        c1, u1, _ = stats(r)
        cpu += c1 - c0
        us += u1 - u0
    return cpu / n, us / n


def add_fleet(url: str, admin: PoolAdmin, n: int, sigs: int, tag: str) -> list[HostClient]:
    hosts = []
    for h in range(0, n, DEVICES_PER_HOST):
        host_id = f"{tag}-h{h // DEVICES_PER_HOST}"
        token = admin.add_host(host_id)
        hc = HostClient(url, POOL, host_id, token)
        devs = []
        for i in range(h, min(n, h + DEVICES_PER_HOST)):
            drv, tags = device_kind(i, sigs)
            devs.append(DeviceReport(f"{tag}-dev{i}", drv, tags))
        hc.heartbeat(devs)
        hosts.append(hc)
    return hosts


def finish_all(hosts: list[HostClient]) -> int:
    n = 0
    for h in hosts:
        while True:
            got = h.claim(1000)
            if not got:
                break
            h.report_many([Report(a.task.id, a.lease_id, "done") for a in got])
            n += len(got)
    return n
