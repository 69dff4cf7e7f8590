"""What the dashboard's pages show, read through deviceq's own read paths (``ops.status``,
``Client.get``/``get_many``, ``explain``, the event stream reader) with every read bounded:

* task lists (`task_list`) page through the ``status:STATUS`` indexes
  with a score cursor, reading at most ``MAX_SCAN`` candidates per request;
* the queue's throughput and latency come from the newest ``MAX_RATE_EVENTS`` events of the
  last ``RATE_MINUTES`` minutes;
* a task's events are looked for among at most ``MAX_TASK_EVENTS`` events from its submission.
"""

from __future__ import annotations

import math
import statistics
import threading
from dataclasses import dataclass
from itertools import islice
from typing import Any

from ..core.errors import InvalidInput
from ..core.events import Event, last_event_id
from ..core.fleet import read_attributes
from ..core.live_logs import LogReader
from ..core.models import ScheduledTask
from ..core.validation import validate_id
from ..ops import status as st
from ..ops.admin import PoolAdmin
from ..ops.explain import explain
from ..producer.client import Client
from .task_list import opt_id

RATE_MINUTES = 15
MAX_RATE_EVENTS = 20_000
MAX_TASK_EVENTS = 20_000
TASK_EVENT_LIMIT = 200
TAIL_CHARS = 4000
HOSTS_PER_PAGE = 50


# -- fleet -------------------------------------------------------------------------------------
SUMMARY_DEVICES = 2000
"""Devices whose attributes the fleet page's tiles read at most (spread evenly over the fleet:
one pipelined round trip whatever its size; a tile says when it is a sample)."""
SUMMARY_ATTRIBUTES = 4
"""Numeric attributes a driver type's tile shows at most (those most of its devices have)."""


def attribute_tiles(admin: PoolAdmin, devices: list[tuple[Any, str]]) -> list[dict[str, Any]]:
    """Per driver type: its devices, how many a gate holds (and by which gates), and for its
    numeric attributes (at most `SUMMARY_ATTRIBUTES`, the most common first) the lowest, the
    median and the highest value over at most `SUMMARY_DEVICES` devices of the fleet."""
    by_driver: dict[str, dict[str, Any]] = {}
    for d, _ in devices:
        t = by_driver.setdefault(d.driver_type, {"driver": d.driver_type, "devices": 0,
                                                 "gated": 0, "gates": {}, "ids": []})  # fmt: skip
        t["devices"] += 1
        t["ids"].append(d.device_id)
        if d.gated:
            t["gated"] += 1
            t["gates"][d.gated] = t["gates"].get(d.gated, 0) + 1
    step = max(1, math.ceil(len(devices) / SUMMARY_DEVICES))
    sample = [d.device_id for d, _ in devices][::step]
    values = read_attributes(admin, sample) if sample else {}
    driver_of = {d.device_id: d.driver_type for d, _ in devices}
    seen: dict[str, dict[str, list[float]]] = {}
    for did, (attrs, _) in values.items():
        per = seen.setdefault(driver_of[did], {})
        for name, v in attrs.items():
            if isinstance(v, int | float) and not isinstance(v, bool):
                per.setdefault(name, []).append(float(v))
    tiles = []
    for drv in sorted(by_driver):
        t = by_driver.pop(drv)
        t.pop("ids")
        per = seen.get(drv, {})
        names = sorted(per, key=lambda n: (-len(per[n]), n))[:SUMMARY_ATTRIBUTES]
        t["attributes"] = [
            {"name": n, "n": len(per[n]), "min": min(per[n]), "median": statistics.median(per[n]),
             "max": max(per[n])}
            for n in names
        ]  # fmt: skip
        t["sampled"] = step > 1
        tiles.append(t)
    return tiles


def fleet(admin: PoolAdmin, host_page: int, host_filter: str | None) -> dict[str, Any]:
    """Hosts (a page of ``HOSTS_PER_PAGE``) with their devices, each reserved device's
    current task and each booked one's reservation; counts over the whole fleet."""
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
    bookings = admin.reservations() if any(d.booked_until for d, _ in devices) else {}
    for d, state in devices:
        if d.host_id in ids:
            resv = bookings.get(d.device_id)
            by_host[d.host_id].append({"d": d, "state": state, "task": None, "resv": resv,
                                       "why": st.device_reason(d, state, resv)})  # fmt: skip
            if d.reserved_by:
                task_ids.append(d.reserved_by)
    goals: dict[str, str] = {}
    progress: dict[str, dict[str, Any] | None] = {}
    if task_ids:
        client = Client(admin.redis, admin.pool)
        for t in client.get_many(task_ids):
            goals[t.id] = (f"workflow:{t.workflow}" if t.workflow else t.goal) or ""
            progress[t.id] = t.progress
    for entries in by_host.values():
        for e in entries:
            tid = e["d"].reserved_by
            if tid:
                e["task"] = {"id": tid, "what": goals.get(tid, ""), "progress": progress.get(tid)}
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
        "tiles": attribute_tiles(admin, devices),
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
            task=opt_id(q.get("task"), "task id"),
            host=opt_id(q.get("host"), "host id"),
            device=opt_id(q.get("device"), "device id"),
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
