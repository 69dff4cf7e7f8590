"""A suite's ETA: its shards' estimated durations placed, longest first, on the devices that
match it, each device free once what it runs now is estimated to end."""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def eta(pending: Sequence[float], ready: Sequence[float], running: Sequence[float] = ()) -> float:
    """Seconds until the suite's last shard ends: ``running`` (what its running shards still
    need; their devices take pending shards after them), ``pending`` (the estimated durations
    of shards not started, placed longest first on the first device free) and ``ready``
    (seconds until each other matching device is free). Infinity when shards are pending and
    no device matches."""
    end = max(running, default=0.0)
    if not pending:
        return end
    free = [float(r) for r in ready] + [float(r) for r in running]
    if not free:
        return float("inf")
    heapq.heapify(free)
    for d in sorted(pending, reverse=True):
        start = heapq.heappop(free)
        heapq.heappush(free, start + d)
        end = max(end, start + d)
    return end


def remaining(estimate_s: float, elapsed_s: float) -> float:
    """What a running shard is estimated to need still (never below a second: it runs)."""
    return max(1.0, estimate_s - elapsed_s)
