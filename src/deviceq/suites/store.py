"""A suite in Redis: recorded (suite_submit.lua), a shard's outcome recorded
(suite_shard.lua), cancelled (suite_cancel.lua), and read back with its ETA now; the devices
that match a suite, and each test's duration history per suite name."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.connection import PoolConnection
from ..core.errors import NotFound
from ..core.fleet import effective_state, read_devices, read_hosts
from ..core.models import satisfies
from ..core.validation import validate_id
from . import eta as eta_mod
from .model import MAX_SHARDS, Shard, Suite, TestResult, counts_of

UNAVAILABLE = frozenset({"offline", "quarantined", "unhealthy"})
"""Device states that do not count as matching a suite now (a busy device does: it is free
later)."""
LIST_MAX = 1000


@dataclass(frozen=True)
class MatchingDevice:
    device_id: str
    host_id: str
    state: str  # its effective state (idle, busy...)


def matching_devices(conn: PoolConnection, driver_type: str | None,
                     tags: Sequence[str]) -> list[MatchingDevice]:  # fmt: skip
    """The devices that satisfy the constraints and can take work now or once free (not
    offline, quarantined or unhealthy), sorted by id."""
    hosts = {h.host_id: h for h in read_hosts(conn)}
    out = []
    for d in read_devices(conn):
        if not satisfies(driver_type, tags, d.driver_type, d.tags):
            continue
        state = effective_state(d, hosts.get(d.host_id))
        if state not in UNAVAILABLE:
            out.append(MatchingDevice(d.device_id, d.host_id, state))
    return out


def read_history(conn: PoolConnection, name: str, tests: Sequence[str]) -> dict[str, float]:
    """The known durations (seconds) of ``tests`` in suites named ``name``."""
    key = conn.keys.suite_durations(validate_id(name, "suite name"))
    out: dict[str, float] = {}
    for i in range(0, len(tests), 1000):
        part = list(tests[i : i + 1000])
        for t, v in zip(part, conn.redis.hmget(key, part), strict=True):
            if v is not None:
                out[t] = int(v) / 1000
    return out


def record(
    conn: PoolConnection,
    suite_id: str,
    name: str,
    each: bool,
    spec: Mapping[str, Any],
    tests: int,
    eta_s: float | None,
    shards: Sequence[Mapping[str, Any]],
) -> None:
    """Record a suite whose shard tasks are submitted (suite_submit.lua)."""
    eta_ms = "" if eta_s is None or eta_s == float("inf") else str(int(eta_s * 1000))
    args: list[Any] = [suite_id, name, "1" if each else "0", json.dumps(dict(spec)), tests,
                       eta_ms, len(shards), *(json.dumps(dict(s)) for s in shards)]  # fmt: skip
    conn._run("suite_submit", args)


def cancel(conn: PoolConnection, suite_id: str, by: str = "") -> bool:
    """End a running suite as cancelled (suite_cancel.lua); False when it had ended. Its
    shards' tasks are the caller's to cancel."""
    validate_id(suite_id, "suite id")
    return bool(int(conn._run("suite_cancel", [suite_id, *([by] if by else [])])))


def shards_of(conn: PoolConnection, suite_id: str) -> list[Shard]:
    raw = conn.redis.hgetall(conn.keys.suite_shards(suite_id))
    shards = (Shard.from_json(int(i), str(v)) for i, v in raw.items())
    return sorted(shards, key=lambda s: s.index)


def get(conn: PoolConnection, suite_id: str, results: bool = True) -> Suite:
    """A suite with its shards (their tasks' status now), counts, failed and flaky tests, and
    its ETA now. NotFound without it."""
    validate_id(suite_id, "suite id")
    r, k = conn.redis, conn.keys
    h = {str(a): str(b) for a, b in r.hgetall(k.suite(suite_id)).items()}
    if not h:
        raise NotFound(f"no suite {suite_id} in pool {conn.pool}")
    shards = shards_of(conn, suite_id)
    pipe = r.pipeline(transaction=False)
    for s in shards:
        pipe.hmget(k.task(s.task_id), "status", "device_id", "dispatched_at")
    now = conn.server_time_ms()
    live: list[Shard] = []
    running: list[float] = []
    pending: list[float] = []
    for s, (status, device, started) in zip(shards, pipe.execute(), strict=True):
        if not s.done:
            s = Shard(s.index, s.task_id, s.tests, s.round, s.pin, s.done,
                      device or s.device_id, status or "gone", s.counts, s.estimate_s,
                      s.joined)  # fmt: skip
            if status == "dispatched" and started:
                running.append(eta_mod.remaining(s.estimate_s, (now - int(started)) / 1000))
            elif status in ("queued", "assigned"):
                pending.append(s.estimate_s)
        live.append(s)
    failed: list[TestResult] = []
    flaky: list[TestResult] = []
    if results:
        for test, raw in sorted(r.hgetall(k.suite_results(suite_id)).items()):
            res = TestResult.from_json(str(test), str(raw))
            if res.status == "failed":
                failed.append(res)
            elif res.status == "flaky":
                flaky.append(res)
    spec = json.loads(h.get("spec") or "{}")
    status = h.get("status") or "running"
    eta_now: float | None = None
    if status == "running":
        eta_now = eta_mod.eta(pending, _ready_now(conn, spec, len(running)), running)
        if eta_now == float("inf"):
            eta_now = None
    at_submit = h.get("eta_submit_ms")
    return Suite(
        id=suite_id,
        name=h.get("name") or "",
        status=status,
        submitted_at=int(h.get("submitted_at") or 0),
        finished_at=int(h["finished_at"]) if h.get("finished_at") else None,
        spec=spec,
        tests=int(h.get("tests") or 0),
        shards=live,
        counts=counts_of(h),
        failed=failed,
        flaky=flaky,
        eta_s=eta_now,
        eta_at_submit_s=None if not at_submit else int(at_submit) / 1000,
        join_until=int(h["join_until"]) if h.get("join_until") else None,
        join_closed=h.get("join_closed") == "1",
    )


def _ready_now(conn: PoolConnection, spec: Mapping[str, Any], running: int) -> list[float]:
    """When each matching device not running one of the suite's shards is free: now (0) for
    an idle one; a busy one is counted as free at once too (what it runs is not this suite's
    to estimate), so the ETA while running assumes the suite gets the devices it matches."""
    devices = matching_devices(conn, spec.get("driver_type"), spec.get("tags") or [])
    return [0.0] * max(0, min(len(devices), MAX_SHARDS) - running)


def list_suites(conn: PoolConnection, limit: int = 100) -> list[dict[str, Any]]:
    """The newest ``limit`` suites (at most `LIST_MAX`): id, name, status, tests, shards,
    counts, submitted_at, finished_at."""
    r, k = conn.redis, conn.keys
    ids = [str(x) for x in r.zrevrange(k.suites, 0, max(1, min(limit, LIST_MAX)) - 1)]
    pipe = r.pipeline(transaction=False)
    for sid in ids:
        pipe.hgetall(k.suite(sid))
    out = []
    for sid, raw in zip(ids, pipe.execute(), strict=True):
        if not raw:
            continue
        h = {str(a): str(b) for a, b in raw.items()}
        out.append({
            "id": sid,
            "name": h.get("name"),
            "status": h.get("status"),
            "tests": int(h.get("tests") or 0),
            "shards": int(h.get("shards") or 0),
            "counts": counts_of(h),
            "submitted_at": int(h.get("submitted_at") or 0),
            "finished_at": int(h["finished_at"]) if h.get("finished_at") else None,
        })  # fmt: skip
    return out
