"""The dashboard's task list: its filters (`TaskFilter`, validated from the query string) and
one bounded page of it (`list_tasks`), read from the ``status:STATUS`` indexes with a score
cursor (``ZRANGE ... BYSCORE LIMIT``), at most ``MAX_SCAN`` candidates per request.

Without a status filter the list is failures first: failed tasks, then running, assigned and
queued ones, then done and cancelled ones (`FAILURES_FIRST`); within a status newest first
(``order=oldest`` reverses that: queued tasks in the order they will be served)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..core.errors import InvalidInput
from ..core.models import ScheduledTask
from ..core.validation import validate_id, validate_tag
from ..core.vocabulary import TaskStatus
from ..producer.client import Client

PAGE_SIZES = (25, 50, 100, 200)
MAX_SCAN = 2000
"""Task hashes read at most per list request (in batches of ``SCAN_BATCH``)."""
SCAN_BATCH = 250
MAX_QUERY = 200
ORDERS = ("newest", "oldest")
FAILURES_FIRST = (
    TaskStatus.failed, TaskStatus.dispatched, TaskStatus.assigned, TaskStatus.queued,
    TaskStatus.done, TaskStatus.cancelled,
)  # fmt: skip
"""The order of the statuses in a list without a status filter."""
QUERY_KEYS = ("status", "driver_type", "tag", "host", "tenant", "q", "limit", "order", "after")


def opt_id(value: str | None, what: str) -> str | None:
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
    order: str = "newest"

    @classmethod
    def parse(cls, q: dict[str, str]) -> TaskFilter:
        unknown = set(q) - set(QUERY_KEYS)
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
        order = q.get("order") or "newest"
        if order not in ORDERS:
            raise InvalidInput(f"order must be one of {', '.join(ORDERS)}")
        return cls(
            status=status,
            driver_type=opt_id(q.get("driver_type"), "driver_type"),
            tag=validate_tag(tag) if tag else None,
            host=opt_id(q.get("host"), "host id"),
            tenant=opt_id(q.get("tenant"), "tenant"),
            text=text,
            limit=int(limit_s),
            order=order,
        )

    def with_status(self, status: TaskStatus | None) -> TaskFilter:
        """The same filter for another status tab (None: every status, failures first)."""
        return replace(self, status=status)

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
            "order": self.order if self.order != "newest" else "",
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


def list_query(q: dict[str, str]) -> dict[str, str]:
    """The task list's query string from a page's query parameters (validated: a task page
    carries the list it was opened from, to link back to it)."""
    flt = TaskFilter.parse(q)
    after = q.get("after") or None
    if after is not None:
        Cursor.parse(after, flt.status or FAILURES_FIRST[0])
    return flt.query(after)


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


def _index_batch(client: Client, cur: Cursor, count: int, desc: bool) -> list[tuple[str, float]]:
    """The next ``count`` members of ``cur.status``'s index after the cursor (queued, active:
    by seq; terminal: by finish time), newest first when ``desc``. Members equal to the
    cursor's score are ordered by id, so ties are neither skipped nor repeated."""
    key = client.keys.status(cur.status.value)
    r = client.redis
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
    statuses = [flt.status] if flt.status else list(FAILURES_FIRST)
    desc = flt.order == "newest"
    cur = Cursor.parse(after, statuses[0])
    if cur.status not in statuses:
        raise InvalidInput("the page cursor does not belong to this status filter")
    si = statuses.index(cur.status)
    found: list[ScheduledTask] = []
    scanned = 0
    next_cursor: str | None = None
    while True:
        batch = _index_batch(client, cur, min(SCAN_BATCH, MAX_SCAN - scanned), desc)
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


def carried_query(raw: str) -> str:
    """A task list's query string carried through a form or a link (``status=failed&...``),
    validated and in canonical form; '' when it is empty or not a valid list query."""
    from urllib.parse import parse_qsl, urlencode

    if not raw or len(raw) > 2000:
        return ""
    try:
        return urlencode(list_query(dict(parse_qsl(raw, keep_blank_values=False))))
    except InvalidInput:
        return ""
