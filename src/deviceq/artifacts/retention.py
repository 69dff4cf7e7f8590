"""``artifact_retention``: the store's folders of tasks finished longer ago than that (or gone
from Redis) are removed in bounded batches (``deviceq artifacts prune``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..core.errors import DeviceqError
from ..core.validation import validate_id
from .store import ArtifactStore, safe_name


@dataclass(frozen=True)
class Pruned:
    removed: list[str]  # task ids whose artifacts were removed
    scanned: int  # task folders looked at
    more: bool  # the call stopped at its limit: call again


def prune(conn: Any, store: ArtifactStore, limit: int = 100, now_ms: int | None = None) -> Pruned:
    """Remove the store's folders of tasks past the pool's ``artifact_retention`` (seconds
    after the task finished; 0: keep everything): a task gone from Redis (trimmed by
    ``retention``) or finished longer ago than that. At most ``limit`` tasks are removed per
    call (each is a delete in the store); the pool's folder is listed once per call."""
    keep_s = conn.config().artifact_retention
    if keep_s <= 0:
        return Pruned([], 0, False)
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    folder = f"{store.root()}/{validate_id(conn.pool, 'pool')}"
    try:
        entries = sorted(store.fs.ls(folder, detail=False))
    except FileNotFoundError:
        return Pruned([], 0, False)
    removed: list[str] = []
    scanned = 0
    for entry in entries:
        tid = str(entry).rstrip("/").rsplit("/", 1)[-1]
        if not safe_name(tid):
            continue
        try:
            validate_id(tid, "task id")
        except DeviceqError:
            continue
        if len(removed) >= limit:
            return Pruned(removed, scanned, True)
        scanned += 1
        h = conn.redis.hmget(conn.keys.task(tid), "status", "finished_at")
        finished = int(h[1]) if h[1] and str(h[1]).isdigit() else None
        if h[0] is None or (finished is not None and now - finished > keep_s * 1000):
            store.remove_task(conn.pool, tid)
            removed.append(tid)
    return Pruned(removed, scanned, False)
