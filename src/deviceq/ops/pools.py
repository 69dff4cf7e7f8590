"""Every pool of a Redis server or Redis Cluster, summarised (``deviceq status --all-pools``).

A pool is found by its event stream (``dq:{POOL}:events``: every transition writes one, so
any pool that ever had a host or a task has it). Each primary of a cluster is scanned with
``SCAN MATCH dq:{*}:events TYPE stream`` in steps of ``COUNT`` keys, so Redis is never
blocked; at most ``limit`` pools are listed. An operator's command, never a hot path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
from redis.connection import ConnectionPool

from ..core.errors import DeviceqError
from ..core.vocabulary import TaskStatus
from .admin import PoolAdmin
from .status import device_counts, hosts_and_devices, leader, status_counts

MAX_POOLS = 10_000
SCAN_COUNT = 1000
_PREFIX, _SUFFIX = "dq:{", "}:events"


@dataclass(frozen=True)
class PoolRef:
    pool: str
    node: str  # HOST:PORT of the primary that serves it


def primaries(r: redis.Redis) -> list[tuple[str, int]] | None:
    """The primaries of the cluster ``r`` talks to, or None for a standalone server."""
    try:
        slots = r.execute_command("CLUSTER SLOTS")
    except redis.ResponseError:  # "cluster support disabled"
        return None
    seen: dict[tuple[str, int], None] = {}
    for entry in slots or []:
        seen[(str(entry[2][0]), int(entry[2][1]))] = None
    return sorted(seen)


def _node_client(r: redis.Redis, host: str, port: int) -> redis.Redis:
    pool = r.connection_pool
    kwargs = {**pool.connection_kwargs, "host": host, "port": port}
    return redis.Redis(connection_pool=ConnectionPool(connection_class=pool.connection_class,
                                                      **kwargs))  # fmt: skip


def _scan(r: redis.Redis, node: str, limit: int, out: list[PoolRef]) -> None:
    for key in r.scan_iter(match=_PREFIX + "*" + _SUFFIX, count=SCAN_COUNT, _type="STREAM"):
        name = str(key)
        if name.startswith(_PREFIX) and name.endswith(_SUFFIX):
            out.append(PoolRef(name[len(_PREFIX) : -len(_SUFFIX)], node))
            if len(out) >= limit:
                return


def find_pools(r: redis.Redis, limit: int = MAX_POOLS) -> list[PoolRef]:
    """Every pool (at most ``limit``), sorted by name, with the node that serves it."""
    out: list[PoolRef] = []
    nodes = primaries(r)
    if nodes is None:
        kw = r.connection_pool.connection_kwargs
        _scan(r, f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}", limit, out)
    else:
        for host, port in nodes:
            client = _node_client(r, host, port)
            try:
                _scan(client, f"{host}:{port}", limit, out)
            finally:
                client.close()
            if len(out) >= limit:
                break
    return sorted(out, key=lambda p: p.pool)


def pool_summary(r: redis.Redis, ref: PoolRef) -> dict[str, Any]:
    """One pool in a line: its tasks by status, hosts alive, devices by state, leader."""
    admin = PoolAdmin(r, ref.pool)
    counts = status_counts(admin)
    hosts, devices = hosts_and_devices(admin)
    lead = leader(admin)
    return {
        "pool": ref.pool,
        "node": ref.node,
        "counts": counts,
        "running": counts[TaskStatus.assigned.value] + counts[TaskStatus.dispatched.value],
        "hosts": len(hosts),
        "hosts_alive": sum(1 for h in hosts if h.alive),
        "devices": len(devices),
        "devices_by_state": device_counts(devices),
        "leader": lead["owner"] if lead else None,
    }


def all_pools_status(r: redis.Redis, limit: int = MAX_POOLS) -> dict[str, Any]:
    """Every pool summarised; a pool that cannot be read (a name deviceq would refuse, keys
    of the wrong type) is listed with its ``error`` instead of stopping the listing."""
    refs = find_pools(r, limit)
    pools = []
    for ref in refs:
        try:
            pools.append(pool_summary(r, ref))
        except (DeviceqError, redis.ResponseError, ValueError, KeyError, TypeError) as exc:
            pools.append({"pool": ref.pool, "node": ref.node,
                          "error": f"{type(exc).__name__}: {exc}"})  # fmt: skip
    totals: dict[str, int] = {}
    for p in pools:
        for k, v in p.get("counts", {}).items():
            totals[k] = totals.get(k, 0) + v
    return {
        "cluster": primaries(r) is not None,
        "nodes": sorted({p["node"] for p in pools}),
        "pools": pools,
        "totals": totals,
        "truncated": len(refs) >= limit,
    }
