"""The pool invariants of the design brief, checked from Redis alone: the stateful test checks
them after every step, the script fuzz test after every accepted call, the soak at its end."""

from __future__ import annotations

from typing import Any

import redis

from deviceq.core import eligibility
from deviceq.core.keys import Keys
from deviceq.core.vocabulary import LEASED_STATUSES, STATUSES, TERMINAL_STATUSES

ACTIVE = frozenset(LEASED_STATUSES)
TERMINAL = frozenset(TERMINAL_STATUSES)


def task_ids(r: redis.Redis, keys: Keys) -> set[str]:
    """Every task of the pool, by its hash (a bounded SCAN of the test's own pool)."""
    out = set()
    for k in r.scan_iter(match=keys.task("*"), count=1000):
        rest = str(k)[len(keys.task("")) :]
        if ":" not in rest:
            out.add(rest)
    return out


def devices_and_leases_agree(r: redis.Redis, keys: Keys) -> None:
    """A device is reserved by at most one active lease; every active task holds exactly its
    device and has one lease-index entry; an idle candidate is one by the eligibility rule."""
    holders: dict[str, str] = {}
    idle = set(r.zrange(keys.idle, 0, -1))
    for did in r.smembers(keys.devices):
        d = r.hgetall(keys.device(did))
        tid = d.get("reserved_by") or ""
        if did in idle:  # the one rule (deviceq.core.eligibility) makes it a candidate
            assert eligibility.device_blocker(d) is None, (did, d)
        if not tid:
            continue
        assert tid not in holders, f"{tid} holds {holders.get(tid)} and {did}"
        holders[tid] = did
        t = r.hgetall(keys.task(tid))
        assert t.get("status") in ACTIVE, (did, t)
        assert (t["device_id"], t["lease_id"]) == (did, d["lease_id"])
    assert not idle - set(r.smembers(keys.devices)), "idle entries without a device"
    active = {tid for s in LEASED_STATUSES for tid in r.zrange(keys.status(s), 0, -1)}
    # a multi-device task holds no device itself: each of its parts (GANG.ROLE, in no status
    # index) does, and it holds all of them or none
    for tid in list(active):
        parts = r.hget(keys.task(tid), "parts")
        if parts:
            active.discard(tid)
            states = [r.hget(keys.task(p), "status") for p in parts.split(",")]
            assert all(st in ACTIVE for st in states), f"gang {tid} holds only some parts {states}"
            active.update(parts.split(","))
    assert set(holders) == active, "every active task holds exactly its device"
    leased = dict(r.zrange(keys.leases, 0, -1, withscores=True))
    assert set(leased) == active
    for tid in active:
        assert leased[tid] == float(r.hget(keys.task(tid), "lease_expires_at") or 0)


def nothing_lost(r: redis.Redis, keys: Keys) -> dict[str, dict[str, str]]:
    """Every task is in exactly the one status index its hash names, every index entry has its
    task, and the attempt history has one record per attempt. Returns the tasks."""
    index: dict[str, list[str]] = {}
    for s in STATUSES:
        for tid in r.zrange(keys.status(s), 0, -1):
            index.setdefault(tid, []).append(s)
    tasks = {tid: r.hgetall(keys.task(tid)) for tid in task_ids(r, keys)}
    assert set(index) <= set(tasks), f"index entries without a task: {set(index) - set(tasks)}"
    for tid, t in tasks.items():
        if t.get("gang"):  # a part of a multi-device task: only the task is indexed
            assert tid not in index and t["status"] in STATUSES, (tid, t)
            assert t["status"] in ACTIVE or tid not in holders_of(r, keys)
        else:
            assert index.get(tid) == [t["status"]], (tid, index.get(tid), t["status"])
        assert r.llen(keys.attempts(tid)) == int(t["attempt"]), (tid, t["attempt"])
    return tasks


def holders_of(r: redis.Redis, keys: Keys) -> set[str]:
    return {r.hget(keys.device(d), "reserved_by") or "" for d in r.smembers(keys.devices)}


def queued_depth_is_consistent(r: redis.Redis, keys: Keys) -> None:
    """Queued depth == ZCARD status:queued == the bucket sizes; buckets indexed by their
    head's seq; a bucket's constraints exist exactly while it is non-empty."""
    queued = r.zrange(keys.status("queued"), 0, -1, withscores=True)
    buckets = r.zrange(keys.queues, 0, -1, withscores=True)
    total = 0
    members: set[str] = set()
    for sig, head in buckets:
        q = r.zrange(keys.queue(sig), 0, -1, withscores=True)
        assert q and q[0][1] == head, "a bucket is indexed by its head's seq"
        total += len(q)
        members |= {m for m, _ in q}
        for m, _ in q:
            assert r.hget(keys.task(m), "sig") == sig
    retries = dict(r.zrange(keys.retries, 0, -1, withscores=True))
    assert not members & set(retries), "a task waiting out its retry backoff is in no bucket"
    for tid, at in retries.items():
        assert float(r.hget(keys.task(tid), "eligible_at") or -1) == at
    gangs = dict(r.zrange(keys.gangs, 0, -1, withscores=True))  # multi-device tasks waiting
    assert not set(gangs) & (members | set(retries))
    for tid, seq in gangs.items():
        assert r.hget(keys.task(tid), "roles") and float(r.hget(keys.task(tid), "seq") or -1) == seq
    assert len(queued) == total + len(retries) + len(gangs)
    assert {m for m, _ in queued} == members | set(retries) | set(gangs)
    for tid, seq in queued:
        assert float(r.hget(keys.task(tid), "seq") or -1) == seq
    live = {sig for sig, _ in buckets}
    sigs = {str(k).rsplit(":", 1)[1] for k in r.scan_iter(match=keys.sig("*"), count=1000)}
    assert sigs == live, "a bucket's constraints exist exactly while it is non-empty"
    assert set(r.hkeys(keys.avoid)) <= {m for m, _ in queued}, "anti-affinity only while queued"


def device_counts_agree(r: redis.Redis, keys: Keys) -> None:
    """``caps`` (profiles), ``drivers`` and ``qdrivers`` count the registered devices."""
    caps: dict[str, int] = {}
    drivers: dict[str, int] = {}
    qdrivers: dict[str, int] = {}
    for did in r.smembers(keys.devices):
        d = r.hgetall(keys.device(did))
        p = f"{d['driver_type']}|{d.get('tags', '')}"
        caps[p] = caps.get(p, 0) + 1
        drivers[d["driver_type"]] = drivers.get(d["driver_type"], 0) + 1
        if d.get("quarantined") == "1":
            qdrivers[d["driver_type"]] = qdrivers.get(d["driver_type"], 0) + 1
    assert {p: int(n) for p, n in r.hgetall(keys.caps).items()} == caps
    assert {k: int(v) for k, v in r.hgetall(keys.drivers).items()} == drivers
    assert {k: int(v) for k, v in r.hgetall(keys.qdrivers).items()} == qdrivers


def tenants_hold_their_leases(tasks: dict[str, dict[str, str]], r: redis.Redis, keys: Keys) -> None:
    """``tenant_held`` counts, per tenant, its tasks holding a lease (assigned or running)."""
    held: dict[str, int] = {}
    for t in tasks.values():
        if t.get("tenant") and t["status"] in ACTIVE:
            held[t["tenant"]] = held.get(t["tenant"], 0) + 1
    assert {k: int(v) for k, v in r.hgetall(keys.tenant_held).items()} == held


def hosts_hold_their_leases(tasks: dict[str, dict[str, str]], r: redis.Redis, keys: Keys) -> None:
    """``host_held`` counts, per host, the leases (assigned or running) on its devices: single
    tasks and parts of multi-device tasks (not the multi-device task itself)."""
    held: dict[str, int] = {}
    for t in tasks.values():
        if t["status"] in ACTIVE and not t.get("roles"):
            held[t["host_id"]] = held.get(t["host_id"], 0) + 1
    assert {k: int(v) for k, v in r.hgetall(keys.host_held).items()} == held


def tenants_hold_their_leases_per_host(
    tasks: dict[str, dict[str, str]], r: redis.Redis, keys: Keys
) -> None:
    """``tenant_host_held`` counts, per tenant and host, the tenant's tasks holding a lease on
    the host's devices (field ``TENANT|HOST``)."""
    held: dict[str, int] = {}
    for t in tasks.values():
        if t.get("tenant") and t["status"] in ACTIVE and not t.get("roles"):
            key = f"{t['tenant']}|{t['host_id']}"
            held[key] = held.get(key, 0) + 1
    got = r.hgetall(keys.counter("tenant_host_held"))
    assert {k: int(v) for k, v in got.items()} == held  # type: ignore[union-attr]


def check_pool(r: redis.Redis, keys: Keys) -> dict[str, dict[str, str]]:
    """Every invariant above; returns the tasks."""
    devices_and_leases_agree(r, keys)
    tasks = nothing_lost(r, keys)
    queued_depth_is_consistent(r, keys)
    device_counts_agree(r, keys)
    tenants_hold_their_leases(tasks, r, keys)
    tenants_hold_their_leases_per_host(tasks, r, keys)
    hosts_hold_their_leases(tasks, r, keys)
    return tasks


def dump(r: redis.Redis, keys: Keys) -> dict[str, Any]:
    """Every key of the pool with its type-specific content (to prove nothing changed)."""
    out: dict[str, Any] = {}
    for k in sorted(str(x) for x in r.scan_iter(match=keys.prefix + "*", count=1000)):
        t = r.type(k)
        if t == "hash":
            out[k] = r.hgetall(k)
        elif t == "string":
            out[k] = r.get(k)
        elif t == "list":
            out[k] = r.lrange(k, 0, -1)
        elif t == "set":
            out[k] = sorted(r.smembers(k))
        elif t == "zset":
            out[k] = r.zrange(k, 0, -1, withscores=True)
        elif t == "stream":
            out[k] = (r.xlen(k), r.xrevrange(k, count=1))
        out[k + "#ttl"] = r.pttl(k) > 0
    return out
