"""What the dashboard's pages show, read through deviceq's own read paths (``ops.status``,
``Client.get``/``get_many``, ``explain``, the event stream reader) with every read bounded:

* task lists page through the ``status:STATUS`` indexes with a score cursor
  (``ZRANGE ... BYSCORE LIMIT``), reading at most ``MAX_SCAN`` candidates per request, so a
  selective filter never scans the whole pool in one request ("more" continues);
* the queue's throughput and latency come from the newest ``MAX_RATE_EVENTS`` events of the
  last ``RATE_MINUTES`` minutes;
* a task's events are looked for among at most ``MAX_TASK_EVENTS`` events from its submission.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from ..core.errors import InvalidInput
from ..core.events import Event, last_event_id
from ..core.live_logs import LogReader
from ..core.models import (
    ScheduledTask,
    TaskStatus,
    validate_id,
    validate_tag,
)
from ..ops import status as st
from ..ops.admin import PoolAdmin
from ..ops.explain import explain
from ..producer import Client

PAGE_SIZES = (25, 50, 100, 200)
MAX_SCAN = 2000
"""Task hashes read at most per list request (in batches of ``SCAN_BATCH``)."""
SCAN_BATCH = 250
MAX_QUERY = 200
RATE_MINUTES = 15
MAX_RATE_EVENTS = 20_000
MAX_TASK_EVENTS = 20_000
TASK_EVENT_LIMIT = 200
TAIL_CHARS = 4000
HOSTS_PER_PAGE = 50
STATUS_ORDER = tuple(TaskStatus)


def _opt_id(value: str | None, what: str) -> str | None:
    if value is None or value == "":
        return None
    return validate_id(value, what)


@dataclass(frozen=True)
class TaskFilter:
    """The task list's filters, validated (InvalidInput on a bad value)."""

    status: TaskStatus | None = None
    driver_type: str | None = None
    tag: str | None = None
    host: str | None = None
    tenant: str | None = None
    text: str | None = None
    limit: int = 50

    @classmethod
    def parse(cls, q: dict[str, str]) -> TaskFilter:
        unknown = set(q) - {"status", "driver_type", "tag", "host", "tenant", "q", "limit", "after"}
        if unknown:
            raise InvalidInput(f"unknown query parameter {sorted(unknown)[0]!r}")
        status_s = q.get("status") or None
        status = None
        if status_s is not None:
            try:
                status = TaskStatus(status_s)
            except ValueError:
                raise InvalidInput(
                    f"unknown status {status_s[:40]!r}; one of: " + ", ".join(TaskStatus)
                ) from None
        tag = q.get("tag") or None
        text = q.get("q") or None
        if text is not None:
            if len(text) > MAX_QUERY:
                raise InvalidInput(f"search text is longer than {MAX_QUERY} characters")
            text = text.strip() or None
        limit_s = q.get("limit") or "50"
        if not limit_s.isdigit() or int(limit_s) not in PAGE_SIZES:
            raise InvalidInput(f"limit must be one of {', '.join(map(str, PAGE_SIZES))}")
        return cls(
            status=status,
            driver_type=_opt_id(q.get("driver_type"), "driver_type"),
            tag=validate_tag(tag) if tag else None,
            host=_opt_id(q.get("host"), "host id"),
            tenant=_opt_id(q.get("tenant"), "tenant"),
            text=text,
            limit=int(limit_s),
        )

    def query(self, after: str | None = None) -> dict[str, str]:
        """The query string of this filter (for links), with a cursor when given."""
        out = {
            "status": self.status.value if self.status else "",
            "driver_type": self.driver_type or "",
            "tag": self.tag or "",
            "host": self.host or "",
            "tenant": self.tenant or "",
            "q": self.text or "",
            "limit": str(self.limit) if self.limit != 50 else "",
            "after": after or "",
        }
        return {k: v for k, v in out.items() if v}

    def matches(self, t: ScheduledTask) -> bool:
        if self.driver_type and t.driver_type != self.driver_type:
            return False
        if self.tag and self.tag not in t.tags:
            return False
        if self.host and t.host_id != self.host:
            return False
        if self.tenant and t.tenant != self.tenant:
            return False
        if self.text:
            hay = (t.goal or t.workflow or "").casefold()
            if self.text.casefold() not in hay:
                return False
        return True

    @property
    def active(self) -> bool:
        return bool(self.driver_type or self.tag or self.host or self.tenant or self.text)


@dataclass(frozen=True)
class Cursor:
    """Where a task list page starts: a status index, and the score and id of the last task
    shown in it (members of equal score are ordered by id)."""

    status: TaskStatus
    score: float | None = None
    member: str = ""

    def encode(self) -> str:
        if self.score is None:
            return self.status.value
        return f"{self.status.value}:{int(self.score)}:{self.member}"

    @classmethod
    def parse(cls, raw: str | None, first: TaskStatus) -> Cursor:
        if not raw:
            return cls(first)
        parts = raw.split(":")
        try:
            status = TaskStatus(parts[0])
            if len(parts) == 1:
                return cls(status)
            if len(parts) != 3 or not parts[1].isdigit() or len(parts[1]) > 20:
                raise ValueError
            return cls(status, float(parts[1]), validate_id(parts[2], "cursor task id"))
        except (ValueError, InvalidInput):
            raise InvalidInput(f"bad page cursor {raw[:60]!r}") from None


@dataclass
class TaskPage:
    tasks: list[ScheduledTask]
    next_cursor: str | None
    scanned: int
    exhausted_scan: bool
    counts: dict[str, int] = field(default_factory=dict)


def _index_batch(client: Client, cur: Cursor, count: int) -> list[tuple[str, float]]:
    """The next ``count`` members of ``cur.status``'s index after the cursor: oldest first
    (queued, active: by seq) or newest first (terminal: by finish time). Members equal to
    the cursor's score are ordered by id, so ties are neither skipped nor repeated."""
    key = client.keys.status(cur.status.value)
    r = client.redis
    desc = cur.status.terminal
    raw: Any
    if cur.score is None:
        raw = r.zrange(
            key, "+inf" if desc else "-inf", "-inf" if desc else "+inf",
            byscore=True, desc=desc, offset=0, num=count, withscores=True,
        )  # fmt: skip
        return [(str(m), float(s)) for m, s in raw]
    # the cursor's task still in the index with that score: continue after its rank (ties in
    # score are ordered by id); else (it moved on) after its score
    score = int(cur.score)
    pipe = r.pipeline(transaction=False)
    pipe.zscore(key, cur.member)
    pipe.zrevrank(key, cur.member) if desc else pipe.zrank(key, cur.member)
    held, rank = pipe.execute()
    if held is not None and int(held) == score and rank is not None:
        raw = r.zrange(key, rank + 1, rank + count, desc=desc, withscores=True)
    else:
        raw = r.zrange(key, f"({score}", "-inf" if desc else "+inf", byscore=True, desc=desc,
                       offset=0, num=count, withscores=True)  # fmt: skip
    return [(str(m), float(s)) for m, s in raw]


def list_tasks(client: Client, flt: TaskFilter, after: str | None) -> TaskPage:
    """One page of tasks matching ``flt``, starting after the cursor ``after``. Reads at most
    ``MAX_SCAN`` task hashes; when the filter is that selective the page may hold fewer tasks
    and ``next_cursor`` continues the scan."""
    statuses = [flt.status] if flt.status else list(STATUS_ORDER)
    cur = Cursor.parse(after, statuses[0])
    if cur.status not in statuses:
        raise InvalidInput("the page cursor does not belong to this status filter")
    si = statuses.index(cur.status)
    found: list[ScheduledTask] = []
    scanned = 0
    next_cursor: str | None = None
    while True:
        batch = _index_batch(client, cur, min(SCAN_BATCH, MAX_SCAN - scanned))
        if not batch:
            si += 1
            if si >= len(statuses):
                next_cursor = None
                break
            cur = Cursor(statuses[si])
            continue
        scanned += len(batch)
        by_id = {t.id: t for t in client.get_many([m for m, _ in batch])}
        for m, s in batch:
            cur = Cursor(cur.status, s, m)
            t = by_id.get(m)
            if t is not None and flt.matches(t):
                found.append(t)
                if len(found) >= flt.limit:
                    break
        if len(found) >= flt.limit or scanned >= MAX_SCAN:
            next_cursor = cur.encode()
            break
    return TaskPage(
        tasks=found,
        next_cursor=next_cursor,
        scanned=scanned,
        exhausted_scan=scanned >= MAX_SCAN and len(found) < flt.limit,
        counts=client.counts(),
    )


# -- fleet -------------------------------------------------------------------------------------
def fleet(admin: PoolAdmin, host_page: int, host_filter: str | None) -> dict[str, Any]:
    """Hosts (a page of ``HOSTS_PER_PAGE``) with their devices and each reserved device's
    current task; counts over the whole fleet."""
    now = admin.server_time_ms()
    hosts, devices = st.hosts_and_devices(admin)
    counts = st.device_counts(devices)
    if host_filter:
        hosts = [h for h in hosts if h.host_id == host_filter]
    pages = max(1, math.ceil(len(hosts) / HOSTS_PER_PAGE))
    if host_page >= pages:
        host_page = pages - 1
    shown = hosts[host_page * HOSTS_PER_PAGE : (host_page + 1) * HOSTS_PER_PAGE]
    ids = {h.host_id for h in shown}
    by_host: dict[str, list[dict[str, Any]]] = {h: [] for h in ids}
    task_ids: list[str] = []
    for d, state in devices:
        if d.host_id in ids:
            by_host[d.host_id].append(
                {"d": d, "state": state, "why": st.device_reason(d, state), "task": None}
            )
            if d.reserved_by:
                task_ids.append(d.reserved_by)
    goals: dict[str, str] = {}
    if task_ids:
        client = Client(admin.redis, admin.pool)
        for t in client.get_many(task_ids):
            goals[t.id] = (f"workflow:{t.workflow}" if t.workflow else t.goal) or ""
    for entries in by_host.values():
        for e in entries:
            tid = e["d"].reserved_by
            if tid:
                e["task"] = {"id": tid, "what": goals.get(tid, "")}
    return {
        "now": now,
        "hosts": [
            {
                "h": h,
                "age_ms": now - h.last_heartbeat if h.last_heartbeat else None,
                "devices": by_host.get(h.host_id, []),
            }
            for h in shown
        ],  # fmt: skip
        "host_total": len(hosts),
        "host_page": host_page,
        "host_pages": pages,
        "device_total": len(devices),
        "counts": counts,
    }


# -- queue -------------------------------------------------------------------------------------
RATE_KINDS = ("submitted", "dispatched", "done", "failed", "cancelled")


def _rate_row(minute: int) -> dict[str, Any]:
    return {"minute": minute * 60_000, **dict.fromkeys(RATE_KINDS, 0),
            "lat_sum": 0, "lat_n": 0, "lat_max": 0}  # fmt: skip


class RateWindow:
    """Per minute over the last ``RATE_MINUTES``: tasks submitted, dispatched, finished (done,
    failed, cancelled) and the submit→dispatch latency (mean and max, from ``dispatched``
    events' ``since_submit_ms``), kept in this process. The first read goes back over at
    most ``MAX_RATE_EVENTS`` events (newest first); each later one reads only the events
    since the previous read (more than ``MAX_RATE_EVENTS`` of them: it starts over)."""

    def __init__(self, minutes: int = RATE_MINUTES) -> None:
        self.minutes = minutes
        self._lock = threading.Lock()
        self._cursor: str | None = None
        self._rows: dict[int, dict[str, Any]] = {}
        self._truncated = False

    def _add(self, eid: str, f: dict[str, str]) -> None:
        kind = f.get("type")
        if kind not in RATE_KINDS:
            return
        minute = int(eid.split("-")[0]) // 60_000
        row = self._rows.get(minute)
        if row is None:
            row = self._rows[minute] = _rate_row(minute)
        row[kind] += 1
        if kind == "dispatched" and f.get("since_submit_ms", "").isdigit():
            lat = int(f["since_submit_ms"])
            row["lat_sum"] += lat
            row["lat_n"] += 1
            row["lat_max"] = max(row["lat_max"], lat)

    def _backfill(self, client: Client, first_minute: int) -> None:
        self._rows = {}
        raw: Any = client.redis.xrevrange(
            client.keys.events, "+", str(first_minute * 60_000), count=MAX_RATE_EVENTS
        )
        for eid, f in raw:
            self._add(str(eid), f)
        self._truncated = len(raw) >= MAX_RATE_EVENTS
        self._cursor = str(raw[0][0]) if raw else last_event_id(client.redis, client.keys)

    def read(self, client: Client, now_ms: int) -> dict[str, Any]:
        first_minute = now_ms // 60_000 - self.minutes + 1
        with self._lock:
            if self._cursor is None:
                self._backfill(client, first_minute)
            else:
                raw: Any = client.redis.xrange(
                    client.keys.events, f"({self._cursor}", "+", count=MAX_RATE_EVENTS
                )
                if len(raw) >= MAX_RATE_EVENTS:
                    self._backfill(client, first_minute)
                else:
                    for eid, f in raw:
                        self._add(str(eid), f)
                    if raw:
                        self._cursor = str(raw[-1][0])
            for m in [m for m in self._rows if m < first_minute]:
                del self._rows[m]
            rows = [dict(self._rows.get(m) or _rate_row(m))
                    for m in range(first_minute, first_minute + self.minutes)]  # fmt: skip
            truncated = self._truncated and first_minute <= min(self._rows, default=0)
        for row in rows:
            row["lat_mean"] = row["lat_sum"] // row["lat_n"] if row["lat_n"] else None
            row["finished"] = row["done"] + row["failed"] + row["cancelled"]
        return {"rows": rows, "truncated": truncated}


def queue(admin: PoolAdmin, window: RateWindow) -> dict[str, Any]:
    """``deviceq status``'s queue buckets (with matchability) plus the per-minute rates."""
    data = st.pool_status(admin, leases=0, failures=0)
    data["rates"] = window.read(Client(admin.redis, admin.pool), data["time_ms"])
    return data


# -- one task ----------------------------------------------------------------------------------
def task_events(client: Client, t: ScheduledTask) -> tuple[list[Event], bool]:
    """The task's events, from its submission on (at most ``MAX_TASK_EVENTS`` events read;
    True when that bound cut the search short)."""
    start = str(max(0, t.submitted_at - 1))
    out: list[Event] = []
    read = 0
    cursor = start
    while read < MAX_TASK_EVENTS:
        raw: Any = client.redis.xrange(client.keys.events, cursor, "+", count=2000)
        if cursor != start and raw and str(raw[0][0]) == cursor:
            raw = raw[1:]
        if not raw:
            return out, False
        read += len(raw)
        for eid, f in raw:
            if f.get("task") == t.id:
                data = dict(f)
                out.append(Event(id=str(eid), type=data.pop("type", "?"), fields=data))
                if len(out) >= TASK_EVENT_LIMIT:
                    return out, True
        cursor = str(raw[-1][0])
    return out, True


def tail(text: str | None) -> tuple[str | None, bool]:
    if text is None:
        return None, False
    if len(text) <= TAIL_CHARS:
        return text, False
    return text[-TAIL_CHARS:], True


MAX_LOG_ENTRIES = 2000  # of an ended attempt's log shown on its task page


def task_detail(admin: PoolAdmin, task_id: str) -> dict[str, Any]:
    validate_id(task_id, "task id")
    client = Client(admin.redis, admin.pool)
    t = client.get(task_id)
    events, cut = task_events(client, t)
    result, result_cut = tail(t.result)
    error, error_cut = tail(t.error)
    log_attempt = t.attempt or None
    reader = LogReader(admin.redis, admin.keys)
    live = log_attempt is not None and not reader.state(task_id).ended(log_attempt)
    log = [] if live or log_attempt is None else list(islice(reader.all(task_id, log_attempt),
                                                             MAX_LOG_ENTRIES))  # fmt: skip
    from ..artifacts.records import recorded_all

    return {
        "log_attempt": log_attempt,
        "log_live": live,
        "log": log,
        "log_cut": len(log) >= MAX_LOG_ENTRIES,
        "t": t,
        "artifacts": recorded_all(admin, task_id),
        "now": admin.server_time_ms(),
        "explain": explain(admin, task_id),
        "events": events,
        "events_cut": cut,
        "result": result,
        "result_cut": result_cut,
        "error": error,
        "error_cut": error_cut,
    }


# -- events ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EventFilter:
    types: tuple[str, ...] = ()
    task: str | None = None
    host: str | None = None
    device: str | None = None

    @classmethod
    def parse(cls, q: dict[str, str], allowed: set[str] | None = None) -> EventFilter:
        allowed = (allowed or set()) | {"type", "task", "host", "device"}
        unknown = set(q) - allowed
        if unknown:
            raise InvalidInput(f"unknown query parameter {sorted(unknown)[0]!r}")
        types = tuple(t for t in (q.get("type") or "").replace(",", " ").split() if t)
        for t in types:
            validate_id(t, "event type")
        return cls(
            types=types,
            task=_opt_id(q.get("task"), "task id"),
            host=_opt_id(q.get("host"), "host id"),
            device=_opt_id(q.get("device"), "device id"),
        )

    def matches(self, e: Event) -> bool:
        return (
            (not self.types or e.type in self.types)
            and (self.task is None or e.fields.get("task") == self.task)
            and (self.host is None or e.fields.get("host") == self.host)
            and (self.device is None or e.fields.get("device") == self.device)
        )


def recent_events(client: Client, flt: EventFilter, limit: int = 100) -> list[Event]:
    """The newest ``limit`` matching events among the newest ``MAX_TASK_EVENTS``, oldest
    first."""
    out: list[Event] = []
    cursor = "+"
    read = 0
    while read < MAX_TASK_EVENTS and len(out) < limit:
        raw: Any = client.redis.xrevrange(client.keys.events, cursor, "-", count=1000)
        if cursor != "+" and raw and str(raw[0][0]) == cursor:
            raw = raw[1:]
        if not raw:
            break
        read += len(raw)
        for eid, f in raw:
            data = dict(f)
            e = Event(id=str(eid), type=data.pop("type", "?"), fields=data)
            if flt.matches(e):
                out.append(e)
                if len(out) >= limit:
                    break
        cursor = str(raw[-1][0])
    out.reverse()
    return out
