"""Selecting tasks by a filter (`TaskFilter`: status, constraints, host, device, tenant,
submission time): `find_tasks` reads the status indexes page by page, bounded, never the
keyspace; `FindResult` is what it selected."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from ..core.keys import Keys
from ..core.models import ScheduledTask
from ..core.vocabulary import TaskStatus
from .submission import check_int

FIND_PAGE = 500
"""Task ids read per page of a status index when filtering (`Client.find`)."""
FIND_MAX_SCAN = 100_000
"""Default cap on index entries a filter examines (`Client.find`): a filter is bounded."""


@dataclass(frozen=True)
class TaskFilter:
    """Which tasks a bulk operation or a filtered listing selects (all given conditions must
    hold). ``statuses`` empty: every status. Times are ms since epoch (Redis time).

    - ``driver_type``: the task's required driver type;
    - ``tags``: tags the task requires (all of them);
    - ``host_id``: the host it is (or last was) assigned to;
    - ``device_id``: the device it is (or last was) assigned to;
    - ``tenant``: the tenant it was submitted for;
    - ``submitted_before`` / ``submitted_after``: its submission time."""

    statuses: tuple[TaskStatus, ...] = ()
    driver_type: str | None = None
    tags: frozenset[str] = frozenset()
    host_id: str | None = None
    tenant: str | None = None
    device_id: str | None = None
    submitted_before: int | None = None
    submitted_after: int | None = None

    def matches(self, t: ScheduledTask) -> bool:
        """True if task ``t`` passes every condition."""
        return (
            (not self.statuses or t.status in self.statuses)
            and (self.driver_type is None or t.driver_type == self.driver_type)
            and self.tags <= set(t.tags)
            and (self.host_id is None or t.host_id == self.host_id)
            and (self.device_id is None or t.device_id == self.device_id)
            and (self.tenant is None or t.tenant == self.tenant)
            and (self.submitted_before is None or t.submitted_at < self.submitted_before)
            and (self.submitted_after is None or t.submitted_at >= self.submitted_after)
        )


@dataclass
class FindResult:
    """What `Client.find` selected: the tasks, how many index entries it examined, and
    whether it stopped at ``max_scan`` before reading every candidate (``truncated``)."""

    tasks: list[ScheduledTask]
    examined: int
    truncated: bool


def find_tasks(
    r: redis.Redis,
    keys: Keys,
    get_many: Callable[[list[str]], list[ScheduledTask]],
    flt: TaskFilter,
    *,
    limit: int = 1000,
    max_scan: int = FIND_MAX_SCAN,
) -> FindResult:
    """Tasks matching ``flt`` (at most ``limit``; ``get_many`` reads tasks by id), read from
    the status indexes of ``keys`` in pages of ``FIND_PAGE`` ids, examining at most
    ``max_scan`` index entries: see `deviceq.producer.Client.find`."""
    check_int("limit", limit, 1)
    check_int("max_scan", max_scan, 1)
    statuses = flt.statuses or tuple(TaskStatus)
    found: list[ScheduledTask] = []
    examined = 0
    truncated = False
    for st in statuses:
        key = keys.status(st.value)
        start = 0
        done_with_status = False
        while not done_with_status and len(found) < limit:
            if examined >= max_scan:
                truncated = True
                break
            n = min(FIND_PAGE, max_scan - examined)
            if st.terminal:
                raw = r.zrevrange(key, start, start + n - 1, withscores=True)
            else:
                raw = r.zrange(key, start, start + n - 1)
            page: Any = raw
            if not page:
                break
            start += len(page)
            examined += len(page)
            if st.terminal:
                ids = [str(m) for m, _ in page]
                if flt.submitted_after is not None and float(page[-1][1]) < float(
                    flt.submitted_after
                ):
                    done_with_status = True  # finished before: submitted before too
            else:
                ids = [str(m) for m in page]
            for t in get_many(ids):
                if t.status != st:  # moved on between the two reads
                    continue
                if (
                    not st.terminal
                    and flt.submitted_before is not None
                    and t.submitted_at >= flt.submitted_before
                ):
                    done_with_status = True  # by submission order: the rest are newer
                    break
                if flt.matches(t):
                    found.append(t)
                    if len(found) >= limit:
                        break
            if len(page) < n:
                break
        if truncated or len(found) >= limit:
            break
    return FindResult(found, examined, truncated)
