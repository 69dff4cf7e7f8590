"""`verify`: audit one pool's Redis state and event stream against deviceq's invariants.

It reads, never writes, and every read is bounded: keys are found with ``SCAN`` over the
pool's own pattern (``COUNT batch``); hashes are read with pipelined ``HMGET`` of at most
``batch`` commands per round trip (the task hashes inside ``MULTI``/``EXEC``, so each task,
its attempt count and its attempt records are one snapshot); sorted sets and lists with
``ZCARD``/``LLEN`` and then ``ZRANGE``/``LRANGE`` windows packed so that one round trip asks
for at most ``batch`` entries; small hashes and sets with ``HSCAN``/``SSCAN``; the event stream
with ``XRANGE ... COUNT batch``. Nothing blocks and no single command is O(N) on a big key.

What is checked (each violation has a ``kind``, see `KINDS`):

- a device is reserved by at most one live lease, and a reservation agrees with the active
  task naming the device;
- a task holds at most one live lease (one status index, one open attempt, its open attempt
  is its lease, no assignment while a lease is live), reaches a terminal state once (two
  terminal events in the stream) and closes its attempt when it ends;
- a task names the host of its device or of its current attempt (``host_id`` decides whose
  token may report it);
- no report from a superseded lease was accepted: every terminal or ``released`` event carries
  the lease of the task's latest ``assigned`` event before it;
- the attempt history is whole: one record per attempt, one per ``assigned`` event;
- every task is in exactly the status index its hash names; every index entry (status, queue
  bucket, ``leases``, ``deadlines``, ``avoid``, host inboxes, ``devices``) has its task or
  device; a ``leases`` entry is a live lease with the task's expiry as its score, and every
  live lease has one; a task whose submission is in the stream and that never ended still
  exists;
- the counters agree with what they count: ``caps``/``drivers``/``qdrivers`` with the
  registered devices, the queue depth with the buckets, ``queues`` with the buckets' heads,
  ``sig:SIG`` with the non-empty buckets, and the ``idle`` index holds only idle, unreserved,
  unquarantined, unheld, unbooked devices whose health check neither runs nor failed;
- a multi-device task holds all its devices or none (every part's lease while it is active,
  none otherwise), and ``gangs`` holds exactly the queued ones;
- a device is held by at most one lease *or* one person's reservation (``deviceq reserve``:
  the device fields ``booked_*``), never both, and ``bookings`` indexes exactly the reserved
  devices, scored by their reservation's end.

The event stream is capped (``event_maxlen``): history checks judge a task only from its
``submitted`` event on (a resubmitted id starts a new history); tasks whose submission was
trimmed away are counted in ``skipped["history_trimmed"]`` and not judged by the
history-only rules. Terminal tasks (and their index entries) past the ``retention`` window
are waiting for the expiry scan's trim and are counted in ``skipped["past_retention"]``.

The reads are not one snapshot of the whole pool: on a pool that is busy while it is checked,
a transition between two round trips can show as a violation. Entities missing from one read
are re-checked before they are reported, and a pass that finds violations is repeated: only
what both passes find is reported (a real violation stays, a race does not), the rest is
counted in ``skipped["transient"]``.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from ..core import eligibility
from ..core.config import PoolConfig
from ..core.connection import PoolConnection
from ..core.errors import InvalidInput, NotFound

DEFAULT_BATCH = 200
"""Commands per round trip and entries per reply (the bound of every read)."""
MIN_BATCH, MAX_BATCH = 16, 10_000
ATTEMPTS_HEAD = 16
"""Attempt records read with their task (longer histories are read in further windows)."""

ACTIVE = ("assigned", "dispatched")
TERMINAL = ("done", "failed", "cancelled")
STATUSES = ("queued", *ACTIVE, *TERMINAL)
TASK_FIELDS = (
    "status", "attempt", "lease_id", "lease_expires_at", "device_id", "host_id", "seq", "sig",
    "finished_at", "tenant", "gang", "parts", "roles",
)  # fmt: skip
DEVICE_FIELDS = (
    "host_id", "driver_type", "tags", "state", "reserved_by", "lease_id", "quarantined", "held",
    "booked_until", "health",
)  # fmt: skip

KINDS: dict[str, str] = {
    "device_two_leases": "two active tasks hold a lease on the same device",
    "reservation_mismatch": "a device's reserved_by/lease_id disagrees with the active task "
    "naming it (or names a task that holds no lease on it)",
    "task_two_leases": "a task with two live leases: in two active status indexes, two open "
    "attempts, an open attempt that is not its lease, or assigned while a lease was live",
    "terminal_twice": "two terminal events for one task in the event stream",
    "unclosed_attempt": "a task that is not active (terminal or queued) with an attempt record "
    "still 'active'",
    "superseded_report": "a terminal or released event whose lease is not the lease of the "
    "task's latest assignment",
    "attempt_missing": "the attempt history lacks an attempt: record count != attempt, an "
    "assigned lease without a record, or a live lease without an open record",
    "task_lost": "a task whose submission is in the stream, that never ended, is gone",
    "task_unindexed": "a task in no status index",
    "task_in_two_indexes": "a task in two status indexes",
    "status_index_mismatch": "a task indexed under another status than its hash names, or "
    "scored other than its submission seq",
    "orphan_index_entry": "an index entry whose task or device does not exist",
    "stale_index_entry": "an avoid or host inbox entry whose task is not in the state that "
    "index is for",
    "lease_entry_stale": "a leases entry for a task without a live lease, or scored other "
    "than its lease_expires_at",
    "lease_entry_missing": "an active task without a leases entry (its lease never expires)",
    "device_counts": "caps/drivers/qdrivers disagree with the registered devices",
    "queue_depth": "ZCARD status:queued differs from the sum of the queue buckets and the "
    "retries waiting out their backoff",
    "retry_index": "retries holds a task that is not queued, or that is also in a bucket",
    "tenant_held": "tenant_held disagrees with the leases of the tenants' tasks (the cap on "
    "devices a tenant holds would be wrong)",
    "bucket_mismatch": "a queue bucket holds a task that is not queued in it, or a queued "
    "task is missing from its bucket",
    "queue_head": "the queues index disagrees with the buckets' heads",
    "bucket_constraints": "sig:SIG exists while its bucket is empty, or is missing while it is not",
    "idle_not_assignable": "an idle index entry that is reserved, quarantined, held, not idle, "
    "under or failing a health check, or not a registered device",
    "lease_and_booking": "a device held by a task's lease and a person's reservation at once",
    "booking_index": "bookings disagrees with the devices' reservations: an entry for a device "
    "that is not reserved (or not registered), a reserved device without an entry, or an "
    "entry scored other than the reservation's end",
    "gang_partial": "a multi-device task holding only some of its devices: it is active while "
    "a part holds no lease (or holds one of another attempt), or a part holds a lease while "
    "the task is not active",
    "gang_index": "gangs holds a task that is not a queued multi-device task, or a queued "
    "multi-device task is neither in gangs nor waiting out a retry",
    "task_host_mismatch": "a task whose host_id is neither its device's host nor the host of "
    "its current attempt (its hash was rewritten to let another host report it)",
    "wrong_type": "a key of the pool holds another Redis type than the layout says (it could "
    "not be read)",
}

Progress = Callable[[str, int, int | None], None]
"""``progress(stage, done, total)``: called as the verifier reads (total None: unknown)."""


# -- results -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Violation:
    """One broken invariant: its ``kind`` (a key of `KINDS`), what it concerns and why."""

    kind: str
    detail: str
    task: str | None = None
    device: str | None = None
    host: str | None = None
    key: str | None = None
    """The index or counter concerned, relative to the pool prefix (``status:done``)."""

    def as_dict(self) -> dict[str, str]:
        """``kind``, the subjects that are set, and ``detail``."""
        out = {"kind": self.kind}
        for name in ("task", "device", "host", "key"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        out["detail"] = self.detail
        return out

    def line(self) -> str:
        """One readable line: kind, subject, detail."""
        subject = " ".join(
            f"{name} {getattr(self, name)}"
            for name in ("task", "device", "host", "key")
            if getattr(self, name) is not None
        )
        return f"{self.kind}: {subject + ': ' if subject else ''}{self.detail}"


@dataclass
class VerifyResult:
    """What `verify` found: the violations, how much it checked and what it could not judge."""

    pool: str
    violations: list[Violation] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No violation found."""
        return not self.violations

    def kinds(self) -> set[str]:
        """The kinds of the violations found."""
        return {v.kind for v in self.violations}

    def as_dict(self) -> dict[str, Any]:
        """The JSON form: ``{pool, violations, checked, skipped}``."""
        return {
            "pool": self.pool,
            "violations": [v.as_dict() for v in self.violations],
            "checked": dict(self.checked),
            "skipped": dict(self.skipped),
        }


class _Findings:
    """Collects violations and skip counts while the checks run."""

    def __init__(self) -> None:
        self.violations: list[Violation] = []
        self.skipped: Counter[str] = Counter()

    def add(self, kind: str, detail: str, **subjects: str | None) -> None:
        assert kind in KINDS, kind
        self.violations.append(Violation(kind, detail, **subjects))

    def skip(self, what: str, n: int = 1) -> None:
        self.skipped[what] += n


# -- what is read ------------------------------------------------------------------------------
@dataclass(slots=True)
class _Task:
    """The fields of one task the checks need, with its attempt records (lease, outcome,
    host)."""

    id: str
    status: str
    attempt: int | None
    lease_id: str
    lease_expires_at: int | None
    device_id: str
    host_id: str
    seq: float | None
    sig: str
    finished_at: int | None
    attempts_len: int
    tenant: str
    records: list[tuple[str | None, str, str]]
    gang: str = ""  # a part of multi-device task ``gang`` (in no status index)
    parts: tuple[str, ...] = ()  # a multi-device task's parts (after its first placement)
    roles: bool = False  # a multi-device task (waits in ``gangs``, not a bucket)

    @classmethod
    def parse(cls, tid: str, vals: Sequence[str | None], n: int, raw: Iterable[str]) -> _Task:
        f = dict(zip(TASK_FIELDS, vals, strict=True))
        return cls(
            id=tid,
            status=f["status"] or "",
            attempt=_int(f["attempt"]),
            lease_id=f["lease_id"] or "",
            lease_expires_at=_int(f["lease_expires_at"]),
            device_id=f["device_id"] or "",
            host_id=f["host_id"] or "",
            seq=_float(f["seq"]),
            sig=f["sig"] or "",
            finished_at=_int(f["finished_at"]),
            attempts_len=int(n),
            tenant=f["tenant"] or "",
            records=[_record(x) for x in raw],
            gang=f["gang"] or "",
            parts=tuple(filter(None, (f["parts"] or "").split(","))),
            roles=bool(f["roles"]),
        )


@dataclass
class _KeySpace:
    """The pool's keys by shape, as one SCAN saw them."""

    total: int = 0
    tasks: set[str] = field(default_factory=set)
    queues: set[str] = field(default_factory=set)
    sigs: set[str] = field(default_factory=set)
    devices: set[str] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    inboxes: set[str] = field(default_factory=set)

    def add(self, rest: str) -> None:
        """Classify one key (its name after the pool prefix)."""
        self.total += 1
        parts = rest.split(":")
        head, n = parts[0], len(parts)
        if head == "task" and n == 2:
            self.tasks.add(parts[1])
        elif head == "queue" and n == 2:
            self.queues.add(parts[1])
        elif head == "sig" and n == 2:
            self.sigs.add(parts[1])
        elif head == "device" and n == 2:
            self.devices.add(parts[1])
        elif head == "host" and n == 2:
            self.hosts.add(parts[1])
        elif head == "host" and n == 3 and parts[2] == "inbox":
            self.inboxes.add(parts[1])


@dataclass
class _State:
    """Everything the state checks look at."""

    now: int
    cutoff: int
    """Terminal tasks finished at or before this are past ``retention`` (awaiting the trim)."""
    space: _KeySpace
    tasks: dict[str, _Task]
    vanished: set[str]
    status: dict[str, list[tuple[str, float]]]
    leases: list[tuple[str, float]]
    deadlines: list[tuple[str, float]]
    retries: list[tuple[str, float]]
    idle: list[tuple[str, float]]
    bookings: list[tuple[str, float]]
    queues: list[tuple[str, float]]
    gangs: list[tuple[str, float]]
    buckets: dict[str, list[tuple[str, float]]]
    avoid: dict[str, str]
    inboxes: dict[str, list[str]]
    devices: set[str]
    device_rows: dict[str, dict[str, str | None]]
    counters: dict[str, dict[str, str]]

    def index_entries(self) -> int:
        """How many index entries were read."""
        ranged = [self.leases, self.deadlines, self.retries, self.idle, self.bookings, self.queues,
                  self.gangs]  # fmt: skip
        ranged += [*self.status.values(), *self.buckets.values()]
        return (
            sum(len(x) for x in ranged)
            + sum(len(x) for x in self.inboxes.values())
            + len(self.avoid)
            + len(self.devices)
        )


def _int(x: str | None) -> int | None:
    try:
        return int(x) if x not in (None, "") else None
    except ValueError:
        return None


def _float(x: str | None) -> float | None:
    try:
        return float(x) if x not in (None, "") else None
    except ValueError:
        return None


def _record(raw: str) -> tuple[str | None, str, str]:
    """(lease_id, outcome, host_id) of one attempt record (``(None, "?", "")`` when it is not
    JSON)."""
    try:
        rec = json.loads(raw)
    except ValueError:
        return None, "?", ""
    if not isinstance(rec, dict):
        return None, "?", ""
    return rec.get("lease_id"), str(rec.get("outcome", "?")), str(rec.get("host_id") or "")


def _chunks(items: Sequence[Any], n: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def _windows(
    spans: Iterable[tuple[str, int, int]], budget: int
) -> Iterator[list[tuple[str, int, int]]]:
    """Pack ``(key, start, end)`` spans (``end`` exclusive) into round trips that ask for at
    most ``budget`` entries in all (so at most ``budget`` commands too)."""
    trip: list[tuple[str, int, int]] = []
    left = budget
    for key, start, end in spans:
        while start < end:
            take = min(end - start, left)
            trip.append((key, start, start + take))
            start += take
            left -= take
            if left == 0:
                yield trip
                trip, left = [], budget
    if trip:
        yield trip


def _next_id(stream_id: str) -> str:
    """The smallest stream id after ``stream_id`` (an exclusive XRANGE start on any Redis)."""
    ms, _, seq = stream_id.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"


# -- reading -----------------------------------------------------------------------------------
class _Reader:
    """Bounded reads of one pool: at most ``batch`` commands per round trip and at most
    ``batch`` entries per reply."""

    def __init__(self, conn: PoolConnection, batch: int, progress: Progress | None) -> None:
        self.r: redis.Redis = conn.redis
        self.keys = conn.keys
        self.batch = batch
        self._progress = progress
        self.errors: dict[str, str] = {}
        """Keys that could not be read (another Redis type than the layout says): the error."""

    def tell(self, stage: str, done: int, total: int | None = None) -> None:
        if self._progress is not None:
            self._progress(stage, done, total)

    def rel(self, key: str) -> str:
        """A key's name after the pool prefix."""
        return key[len(self.keys.prefix) :]

    def run(self, pipe: Any, keys: Sequence[str]) -> list[Any]:
        """Execute a pipeline whose commands read ``keys`` (one each); a command refused
        (WRONGTYPE: the key holds another type) is recorded in ``errors`` and answers None."""
        out = []
        for key, reply in zip(keys, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(reply, redis.ResponseError):
                self.errors[self.rel(key)] = str(reply)
                reply = None
            out.append(reply)
        return out

    def _guarded(self, key: str, read: Callable[[], Any], empty: Any) -> Any:
        """``read()``, or ``empty`` (the error recorded) when the key holds another type."""
        try:
            return read()
        except redis.ResponseError as exc:
            self.errors[self.rel(key)] = str(exc)
            return empty

    def now_ms(self) -> int:
        sec, usec = self.r.time()
        return int(sec) * 1000 + int(usec) // 1000

    def retention_ms(self) -> int:
        """The ``retention`` setting as the scripts read it: stored value or default,
        clamped to its bounds."""
        raw: Any = self.r.hget(self.keys.config, "retention")
        default = float(PoolConfig.model_fields["retention"].default)
        value = _float(raw)
        if value is None or value != value:
            value = default
        lo, hi = PoolConfig.bounds("retention")
        return int(min(max(value, lo), hi) * 1000)

    def last_event_id(self) -> str | None:
        newest: Any = self._guarded(
            self.keys.events, lambda: self.r.xrevrange(self.keys.events, count=1), []
        )
        return str(newest[0][0]) if newest else None

    def scan(self) -> _KeySpace:
        space = _KeySpace()
        for key in self.r.scan_iter(match=self.keys.prefix + "*", count=self.batch):
            space.add(self.rel(str(key)))
            if space.total % 10_000 == 0:
                self.tell("scanning keys", space.total)
        self.tell("scanning keys", space.total, space.total)
        return space

    def tasks(self, ids: list[str]) -> tuple[dict[str, _Task], set[str]]:
        """Each task's fields, attempt count and attempt records; and the ids whose hash
        vanished since the scan (expired by retention meanwhile)."""
        k, head = self.keys, min(self.batch, ATTEMPTS_HEAD)
        out: dict[str, _Task] = {}
        vanished: set[str] = set()
        longer: list[tuple[str, int, int]] = []
        for done, chunk in enumerate(_chunks(ids, max(1, self.batch // 3))):
            pipe = self.r.pipeline(transaction=True)
            read: list[str] = []
            for tid in chunk:
                pipe.hmget(k.task(tid), list(TASK_FIELDS))
                pipe.llen(k.attempts(tid))
                pipe.lrange(k.attempts(tid), 0, head - 1)
                read += [k.task(tid), k.attempts(tid), k.attempts(tid)]
            res = self.run(pipe, read)
            for i, tid in enumerate(chunk):
                vals, n, raw = res[3 * i : 3 * i + 3]
                if vals is None:
                    continue  # not a hash: reported as wrong_type
                if all(v is None for v in vals):
                    vanished.add(tid)
                    continue
                out[tid] = _Task.parse(tid, vals, n or 0, raw or [])
                if (n or 0) > head:
                    longer.append((k.attempts(tid), head, int(n)))
            self.tell(
                "reading tasks", min(len(ids), (done + 1) * max(1, self.batch // 3)), len(ids)
            )
        owner = {k.attempts(tid): tid for tid in out}
        for key, entries in self._ranged("lrange", longer):
            out[owner[key]].records.extend(_record(x) for x in entries)
        return out, vanished

    def _ranged(self, cmd: str, spans: list[tuple[str, int, int]]) -> Iterator[tuple[str, Any]]:
        """``(key, entries)`` for each window of the spans, read with ZRANGE (with scores)
        or LRANGE, at most ``batch`` entries per round trip."""
        for trip in _windows(spans, self.batch):
            pipe = self.r.pipeline(transaction=False)
            for key, start, end in trip:
                if cmd == "zrange":
                    pipe.zrange(key, start, end - 1, withscores=True)
                else:
                    pipe.lrange(key, start, end - 1)
            for (key, _, _), entries in zip(
                trip, self.run(pipe, [t[0] for t in trip]), strict=True
            ):
                yield key, entries or []

    def _sizes(self, cmd: str, keys: list[str]) -> list[tuple[str, int, int]]:
        spans = []
        for chunk in _chunks(keys, self.batch):
            pipe = self.r.pipeline(transaction=False)
            for key in chunk:
                if cmd == "zrange":
                    pipe.zcard(key)
                else:
                    pipe.llen(key)
            spans += [
                (key, 0, int(n or 0)) for key, n in zip(chunk, self.run(pipe, chunk), strict=True)
            ]
        return spans

    def zsets(self, keys: list[str], stage: str) -> dict[str, list[tuple[str, float]]]:
        """Whole sorted sets (member, score), in score order."""
        out: dict[str, list[tuple[str, float]]] = {key: [] for key in keys}
        spans = self._sizes("zrange", keys)
        total, done = sum(n for _, _, n in spans), 0
        for key, entries in self._ranged("zrange", spans):
            out[key] += [(str(m), float(s)) for m, s in entries]
            done += len(entries)
            self.tell(stage, done, total)
        return out

    def lists(self, keys: list[str], stage: str) -> dict[str, list[str]]:
        """Whole lists."""
        out: dict[str, list[str]] = {key: [] for key in keys}
        for key, entries in self._ranged("lrange", self._sizes("lrange", keys)):
            out[key] += [str(x) for x in entries]
        self.tell(stage, sum(len(v) for v in out.values()))
        return out

    def hash(self, key: str) -> dict[str, str]:
        """A whole hash, by HSCAN."""
        pairs = self._guarded(key, lambda: list(self.r.hscan_iter(key, count=self.batch)), [])
        return {str(f): str(v) for f, v in pairs}

    def members(self, key: str) -> set[str]:
        """A whole set, by SSCAN."""
        found = self._guarded(key, lambda: list(self.r.sscan_iter(key, count=self.batch)), [])
        return {str(m) for m in found}

    def devices(self, ids: list[str]) -> dict[str, dict[str, str | None]]:
        """The fields of each device hash that exists."""
        out: dict[str, dict[str, str | None]] = {}
        for chunk in _chunks(ids, self.batch):
            pipe = self.r.pipeline(transaction=False)
            for did in chunk:
                pipe.hmget(self.keys.device(did), list(DEVICE_FIELDS))
            read = [self.keys.device(did) for did in chunk]
            for did, vals in zip(chunk, self.run(pipe, read), strict=True):
                if vals is not None and any(v is not None for v in vals):
                    out[did] = dict(zip(DEVICE_FIELDS, vals, strict=True))
        self.tell("reading devices", len(ids), len(ids))
        return out

    def events(self, end: str | None) -> Iterator[tuple[str, dict[str, str]]]:
        """Every event up to ``end`` (the newest when the check began), oldest first."""
        if end is None:
            return
        start, seen = "-", 0
        while True:
            raw: Any = self.r.xrange(self.keys.events, min=start, max=end, count=self.batch)
            for eid, fields in raw:
                yield str(eid), fields
            seen += len(raw)
            self.tell("reading events", seen)
            if len(raw) < self.batch:
                return
            start = _next_id(str(raw[-1][0]))

    def existing(self, keys: list[str]) -> set[str]:
        """Which of ``keys`` exist now (re-checks before a missing entity is reported)."""
        out: set[str] = set()
        for chunk in _chunks(keys, self.batch):
            pipe = self.r.pipeline(transaction=False)
            for key in chunk:
                pipe.exists(key)
            out |= {key for key, n in zip(chunk, pipe.execute(), strict=True) if n}
        return out


def _read_state(rd: _Reader) -> _State:
    """Read every key the checks need (the event stream is read afterwards, streamed)."""
    k = rd.keys
    now = rd.now_ms()
    cutoff = now - rd.retention_ms()
    space = rd.scan()
    tasks, vanished = rd.tasks(sorted(space.tasks))
    sigs = sorted(space.queues)
    status_keys = [k.status(s) for s in STATUSES]
    pool_zsets = [k.leases, k.deadlines, k.retries, k.idle, k.bookings, k.queues, k.gangs]
    z = rd.zsets(status_keys + pool_zsets, "reading indexes")
    queues = z[k.queues]
    sigs = sorted(set(sigs) | {sig for sig, _ in queues})
    buckets = rd.zsets([k.queue(sig) for sig in sigs], "reading queue buckets")
    inboxes = rd.lists([k.inbox(h) for h in sorted(space.inboxes)], "reading host inboxes")
    devices = rd.members(k.devices)
    return _State(
        now=now,
        cutoff=cutoff,
        space=space,
        tasks=tasks,
        vanished=vanished,
        status={s: z[k.status(s)] for s in STATUSES},
        leases=z[k.leases],
        deadlines=z[k.deadlines],
        retries=z[k.retries],
        idle=z[k.idle],
        bookings=z[k.bookings],
        queues=queues,
        gangs=z[k.gangs],
        buckets={sig: buckets[k.queue(sig)] for sig in sigs},
        avoid=rd.hash(k.avoid),
        inboxes={h: inboxes[k.inbox(h)] for h in sorted(space.inboxes)},
        devices=devices,
        device_rows=rd.devices(sorted(devices | space.devices)),
        counters={
            name: rd.hash(getattr(k, name))
            for name in ("caps", "drivers", "qdrivers", "tenant_held")
        },
    )


# -- state checks ------------------------------------------------------------------------------
def _check_status_indexes(st: _State, f: _Findings) -> None:
    """Each task is in exactly the status index its hash names (scored by its seq while not
    terminal); past-retention terminal tasks are awaiting the expiry scan's trim."""
    where: dict[str, list[str]] = defaultdict(list)
    for s, entries in st.status.items():
        for tid, _ in entries:
            where[tid].append(s)
    for tid, t in st.tasks.items():
        found = where.get(tid, [])
        if t.gang:  # a part of a multi-device task: only its task is indexed
            if found:
                f.add(
                    "status_index_mismatch",
                    f"a part of multi-device task {t.gang} is in status:{found[0]}",
                    task=tid,
                )
            continue
        if not found:
            if t.status in TERMINAL and (t.finished_at or 0) <= st.cutoff:
                f.skip("past_retention")
            else:
                f.add(
                    "task_unindexed", f"task is {t.status or '?'} but in no status index", task=tid
                )
        elif len(found) > 1:
            two_active = sum(s in ACTIVE for s in found) > 1
            f.add(
                "task_two_leases" if two_active else "task_in_two_indexes",
                f"task is in status indexes {', '.join(found)} (its hash says {t.status or '?'})",
                task=tid,
            )
        elif found[0] != t.status:
            f.add(
                "status_index_mismatch",
                f"task is {t.status or '?'} but indexed in status:{found[0]}",
                task=tid,
            )
    for s in ("queued", *ACTIVE):
        for tid, score in st.status[s]:
            row = st.tasks.get(tid)
            if row is not None and row.status == s and row.seq is not None and score != row.seq:
                f.add(
                    "status_index_mismatch",
                    f"status:{s} scores it {score:g}, its seq is {row.seq:g}",
                    task=tid,
                )


def _orphans(st: _State, f: _Findings, index: str, entries: Iterable[tuple[str, float]]) -> None:
    """Entries of a task index whose task does not exist (past-retention terminal entries
    are awaiting the trim)."""
    terminal = index.removeprefix("status:") in TERMINAL
    for tid, score in entries:
        if tid in st.tasks or tid in st.vanished:
            continue
        if terminal and score <= st.cutoff:
            f.skip("past_retention")
            continue
        f.add(
            "orphan_index_entry",
            f"{index} names task {tid}, which does not exist",
            task=tid,
            key=index,
        )


def _check_leases(st: _State, f: _Findings) -> None:
    """``leases`` holds exactly the live leases, each scored by its expiry."""
    leased = set()
    for tid, score in st.leases:
        leased.add(tid)
        t = st.tasks.get(tid)
        if t is None:
            continue  # an orphan, reported by _orphans
        if t.status not in ACTIVE or t.parts:
            f.add(
                "lease_entry_stale",
                f"leases holds the task, which is {t.status or '?'} (no live lease)",
                task=tid,
            )
        elif t.lease_expires_at != int(score):
            f.add(
                "lease_entry_stale",
                f"leases scores lease {t.lease_id} at {int(score)}, its lease_expires_at is "
                f"{t.lease_expires_at}",
                task=tid,
            )
    for tid, t in st.tasks.items():
        if t.status in ACTIVE and tid not in leased and not t.parts:
            f.add(
                "lease_entry_missing",
                f"task is {t.status} with lease {t.lease_id} but has no leases entry "
                "(the expiry scan never ends it)",
                task=tid,
            )


def _check_reservations(st: _State, f: _Findings) -> None:
    """One live lease per device, and each reservation agrees with its task."""
    by_device: dict[str, list[str]] = defaultdict(list)
    for tid, t in st.tasks.items():
        if t.status not in ACTIVE or t.parts:  # (a multi-device task's parts hold its devices)
            continue
        if not t.device_id:
            f.add("reservation_mismatch", f"task is {t.status} but names no device", task=tid)
        else:
            by_device[t.device_id].append(tid)
    for did, tids in sorted(by_device.items()):
        if len(tids) > 1:
            held = ", ".join(f"{tid} (lease {st.tasks[tid].lease_id})" for tid in sorted(tids))
            f.add("device_two_leases", f"tasks {held} all hold a live lease on it", device=did)
        else:
            _task_side(st, f, did, st.tasks[tids[0]])
    for did, d in sorted(st.device_rows.items()):
        holder = d["reserved_by"] or ""
        if not holder or holder in by_device.get(did, ()):
            continue
        f.add(
            "reservation_mismatch",
            f"reserved by task {holder}, {_holder_state(st.tasks.get(holder))}",
            device=did,
            task=holder,
        )


def _holder_state(t: _Task | None) -> str:
    """Why the task a device names as its holder does not hold it."""
    if t is None:
        return "which does not exist"
    if t.status not in ACTIVE:
        return f"which is {t.status or '?'}"
    return f"whose lease is on device {t.device_id or '(none)'}"


def _task_side(st: _State, f: _Findings, did: str, t: _Task) -> None:
    """The device an active task names is reserved by that task, under its lease."""
    d = st.device_rows.get(did)
    if d is None or did not in st.devices:
        f.add(
            "reservation_mismatch",
            f"task holds lease {t.lease_id} on device {did}, which is not registered",
            task=t.id,
            device=did,
        )
    elif (d["reserved_by"] or "") != t.id:
        f.add(
            "reservation_mismatch",
            f"task is {t.status} with lease {t.lease_id} on the device, which is reserved by "
            f"{d['reserved_by'] or 'nobody'}",
            task=t.id,
            device=did,
        )
    elif (d["lease_id"] or "") != t.lease_id:
        f.add(
            "reservation_mismatch",
            f"the device holds lease {d['lease_id'] or '(none)'} for the task, whose lease is "
            f"{t.lease_id}",
            task=t.id,
            device=did,
        )


def _check_attempts(st: _State, f: _Findings) -> None:
    """One record per attempt; the only open record is the live lease's; an attempt is
    closed when its task is not active."""
    for tid, t in st.tasks.items():
        if t.attempt is None or t.attempts_len != t.attempt:
            f.add(
                "attempt_missing",
                f"attempt is {t.attempt} but the history holds {t.attempts_len} record(s)",
                task=tid,
            )
        open_ = [i + 1 for i, (_, outcome, _) in enumerate(t.records) if outcome == "active"]
        if len(open_) > 1:
            f.add(
                "task_two_leases",
                f"attempts {', '.join(map(str, open_))} are all still open (outcome active)",
                task=tid,
            )
        if t.status in ACTIVE:
            _live_attempt(f, t)
        elif open_:
            n = open_[-1]
            f.add(
                "unclosed_attempt",
                f"task is {t.status or '?'} but attempt {n} (lease {t.records[n - 1][0]}) is "
                "still active",
                task=tid,
            )


def _check_task_hosts(st: _State, f: _Findings) -> None:
    """A task's ``host_id`` (the host whose token may report it) is its device's host or the
    host of its current attempt: any other host was written into the hash by hand."""
    for tid, t in st.tasks.items():
        if not t.host_id:
            continue
        d = st.device_rows.get(t.device_id) if t.device_id else None
        device_host = (d or {}).get("host_id") or ""
        n = t.attempt or 0
        attempt_host = t.records[n - 1][2] if 0 < n <= len(t.records) else ""
        known = {h for h in (device_host, attempt_host) if h}
        if known and t.host_id not in known:
            f.add(
                "task_host_mismatch",
                f"task is {t.status or '?'} on host {t.host_id}, but its device "
                f"{t.device_id or '(none)'} belongs to {device_host or '(unknown)'} and its "
                f"attempt {n} was assigned to {attempt_host or '(unknown)'}",
                task=tid,
                host=t.host_id,
                device=t.device_id or None,
            )


def _live_attempt(f: _Findings, t: _Task) -> None:
    """An active task's last attempt record is open and is its lease."""
    if not t.records:
        return  # the count check above already reports a missing history
    lease, outcome, _ = t.records[-1]
    if outcome != "active":
        f.add(
            "attempt_missing",
            f"live lease {t.lease_id} has no open attempt record (the last one is {outcome})",
            task=t.id,
        )
    elif lease != t.lease_id:
        f.add(
            "task_two_leases",
            f"the open attempt is lease {lease} but the task holds lease {t.lease_id}",
            task=t.id,
        )


def _check_buckets(st: _State, f: _Findings) -> None:
    """Queue depth, bucket membership and order, bucket heads and bucket constraints."""
    depth = len(st.status["queued"])
    total = sum(len(e) for e in st.buckets.values())
    if depth != total + len(st.retries) + len(st.gangs):
        f.add(
            "queue_depth",
            f"status:queued holds {depth} task(s), the queue buckets {total}, retries "
            f"{len(st.retries)} and gangs {len(st.gangs)}",
            key="status:queued",
        )
    members: set[tuple[str, str]] = set()
    for sig, entries in st.buckets.items():
        _orphans(st, f, f"queue:{sig}", entries)
        for tid, score in entries:
            members.add((sig, tid))
            t = st.tasks.get(tid)
            why = None
            if t is None:
                continue
            if t.status != "queued":
                why = f"the task is {t.status or '?'}"
            elif t.sig != sig:
                why = f"the task's bucket is {t.sig or '(none)'}"
            elif t.seq is not None and score != t.seq:
                why = f"it is scored {score:g}, the task's seq is {t.seq:g}"
            if why:
                f.add(
                    "bucket_mismatch",
                    f"queue:{sig} holds the task but {why}",
                    task=tid,
                    key=f"queue:{sig}",
                )
    waiting = {tid for tid, _ in st.retries}
    _orphans(st, f, "retries", st.retries)
    for tid in sorted(waiting):
        t = st.tasks.get(tid)
        if t is not None and (t.status != "queued" or (t.sig, tid) in members):
            f.add(
                "retry_index",
                f"retries holds the task, which is {t.status or '?'}"
                + (" and also in its bucket" if (t.sig, tid) in members else ""),
                task=tid,
                key="retries",
            )
    in_gangs = {tid for tid, _ in st.gangs}
    for tid, t in st.tasks.items():
        if t.gang or t.roles:  # parts wait in no index; multi-device tasks: _check_gangs
            continue
        if t.status == "queued" and (t.sig, tid) not in members and tid not in waiting:
            f.add(
                "bucket_mismatch",
                f"task is queued but not in its bucket queue:{t.sig or '?'} (never scheduled)",
                task=tid,
            )
    _check_heads(st, f)
    _check_gangs(st, f, in_gangs, waiting)


def _check_gangs(st: _State, f: _Findings, in_gangs: set[str], waiting: set[str]) -> None:
    """A multi-device task holds all its devices or none: while it is active every part
    holds a lease of its attempt; otherwise no part holds one. ``gangs`` holds exactly the
    queued multi-device tasks not waiting out a retry."""
    _orphans(st, f, "gangs", st.gangs)
    for tid in sorted(in_gangs):
        t = st.tasks.get(tid)
        if t is not None and (t.status != "queued" or not t.roles or tid in waiting):
            f.add("gang_index", f"gangs holds the task, which is {t.status or '?'}", task=tid)
    for tid, t in st.tasks.items():
        if t.roles and t.status == "queued" and tid not in in_gangs and tid not in waiting:
            f.add("gang_index", "queued multi-device task is not in gangs (never placed)", task=tid)
        if t.gang and t.status in ACTIVE:
            g = st.tasks.get(t.gang)
            if g is None or g.status not in ACTIVE:
                f.add(
                    "gang_partial",
                    f"part holds lease {t.lease_id} while its task {t.gang} is "
                    f"{g.status if g else 'gone'}",
                    task=tid,
                )
        if not t.parts or t.status not in ACTIVE:
            continue
        for pid in t.parts:
            p = st.tasks.get(pid)
            if p is None or p.status not in ACTIVE or p.attempt != t.attempt:
                state = "gone" if p is None else f"{p.status} (attempt {p.attempt})"
                f.add(
                    "gang_partial",
                    f"task is {t.status} (attempt {t.attempt}) but its part {pid} is {state}",
                    task=tid,
                )


def _check_heads(st: _State, f: _Findings) -> None:
    """``queues`` scores each non-empty bucket by its head; ``sig:SIG`` exists exactly while
    its bucket is non-empty."""
    heads = {sig: e[0][1] for sig, e in st.buckets.items() if e}
    indexed = dict(st.queues)
    for sig, head in sorted(heads.items()):
        if sig not in indexed:
            f.add(
                "queue_head",
                f"bucket queue:{sig} holds tasks but is not in queues (never scheduled)",
                key="queues",
            )
        elif indexed[sig] != head:
            f.add(
                "queue_head",
                f"queues scores bucket {sig} at {indexed[sig]:g}, its head's seq is {head:g}",
                key="queues",
            )
    for sig in sorted(set(indexed) - set(heads)):
        f.add("queue_head", f"queues names bucket {sig}, which is empty", key="queues")
    for sig in sorted(set(heads) - st.space.sigs):
        f.add(
            "bucket_constraints",
            f"bucket queue:{sig} holds tasks but sig:{sig} is missing",
            key=f"sig:{sig}",
        )
    for sig in sorted(st.space.sigs - set(heads)):
        f.add("bucket_constraints", f"sig:{sig} exists but its bucket is empty", key=f"sig:{sig}")


def _check_task_entries(st: _State, f: _Findings) -> None:
    """``avoid`` only while queued; a host inbox only holds that host's assignments."""
    for tid in sorted(st.avoid):
        t = st.tasks.get(tid)
        if t is not None and t.status != "queued":
            f.add(
                "stale_index_entry",
                f"avoid holds the task, which is {t.status or '?'} (kept only while queued)",
                task=tid,
                key="avoid",
            )
    _orphans(st, f, "avoid", ((tid, 0.0) for tid in st.avoid))
    for host, entries in st.inboxes.items():
        key = f"host:{host}:inbox"
        _orphans(st, f, key, ((tid, 0.0) for tid in entries))
        for tid in entries:
            t = st.tasks.get(tid)
            if t is not None and t.gang and t.status != "assigned":
                continue  # a part ended with its task: the host's next claim drops it
            if t is not None and (t.status != "assigned" or t.host_id != host):
                f.add(
                    "stale_index_entry",
                    f"{key} holds the task, which is {t.status or '?'} on host "
                    f"{t.host_id or '(none)'}",
                    task=tid,
                    host=host,
                    key=key,
                )


def _check_devices(st: _State, f: _Findings) -> None:
    """``devices`` entries have their hash; the counters count the registered devices."""
    counted: dict[str, Counter[str]] = {n: Counter() for n in ("caps", "drivers", "qdrivers")}
    for did in sorted(st.devices):
        d = st.device_rows.get(did)
        if d is None:
            f.add(
                "orphan_index_entry",
                "devices names a device without a hash",
                device=did,
                key="devices",
            )
            continue
        driver = d["driver_type"] or ""
        counted["caps"][f"{driver}|{d['tags'] or ''}"] += 1
        counted["drivers"][driver] += 1
        if d["quarantined"] == "1":
            counted["qdrivers"][driver] += 1
    for did in sorted(set(st.device_rows) - st.devices):
        f.add(
            "device_counts", "the device has a hash but is not in devices (not counted)", device=did
        )
    for name, count in counted.items():
        stored = st.counters[name]
        for key in sorted(set(stored) | set(count)):
            have, want = stored.get(key), count.get(key, 0)
            if _int(have) != want and not (have is None and want == 0):
                f.add(
                    "device_counts",
                    f"{name}[{key}] is {have if have is not None else '(missing)'}, the "
                    f"registered devices count {want}",
                    key=name,
                )


def _check_idle(st: _State, f: _Findings) -> None:
    """Every ``idle`` entry is a registered device that the one rule
    (`deviceq.core.eligibility.device_blocker`) makes an idle candidate."""
    for did, _ in st.idle:
        d = st.device_rows.get(did)
        if d is None or did not in st.devices:
            f.add(
                "idle_not_assignable",
                "idle names a device that is not registered",
                device=did,
                key="idle",
            )
            continue
        why = eligibility.device_blockers(d)
        if why:
            f.add(
                "idle_not_assignable",
                f"the device is an idle candidate but {', '.join(why)}",
                device=did,
                key="idle",
            )


def _check_bookings(st: _State, f: _Findings) -> None:
    """A device is held by a lease or a person's reservation, not both; ``bookings`` indexes
    exactly the reserved devices, by their reservation's end."""
    indexed = dict(st.bookings)
    for did, end in st.bookings:
        d = st.device_rows.get(did)
        if d is None or did not in st.devices:
            f.add("booking_index", "bookings names a device that is not registered", device=did,
                  key="bookings")  # fmt: skip
        elif not d["booked_until"]:
            f.add("booking_index", "bookings names a device that is not reserved", device=did,
                  key="bookings")  # fmt: skip
        elif _int(d["booked_until"]) != int(end):
            f.add(
                "booking_index",
                f"the reservation ends at {d['booked_until']}, bookings says {int(end)}",
                device=did,
                key="bookings",
            )
    for did, d in sorted(st.device_rows.items()):
        if not d["booked_until"]:
            continue
        if did not in indexed:
            f.add("booking_index", "a reserved device is not in bookings (it never expires)",
                  device=did, key="bookings")  # fmt: skip
        if d["reserved_by"]:
            f.add(
                "lease_and_booking",
                f"reserved for a person and held by task {d['reserved_by']}'s lease",
                device=did,
                task=d["reserved_by"],
            )


# -- history checks ----------------------------------------------------------------------------
@dataclass(slots=True)
class _Trail:
    """One task's history in the stream since its ``submitted`` event (``complete``), or
    since the oldest event kept."""

    complete: bool = False
    lease: str = ""
    """The lease of its latest ``assigned`` event."""
    live: bool = False
    """A lease is live: assigned, and not expired, released or ended since."""
    terminal: str = ""
    """``TYPE ID`` of its first terminal event ("" = none yet)."""
    leases: list[str] = field(default_factory=list)


class _History:
    """Follows the event stream oldest first and judges each task's transitions."""

    def __init__(self, f: _Findings) -> None:
        self.f = f
        self.trails: dict[str, _Trail] = {}
        self.events = 0

    def feed(self, eid: str, fields: dict[str, str]) -> None:
        self.events += 1
        tid, kind = fields.get("task"), fields.get("type")
        if not tid or not kind:
            return
        if kind == "submitted":
            self.trails[tid] = _Trail(complete=True)
            return
        tr = self.trails.get(tid)
        if tr is None:  # (a multi-device task's part: its history starts at its assignment)
            tr = self.trails[tid] = _Trail(complete=kind == "assigned" and bool(fields.get("gang")))
        lease = fields.get("lease", "")
        if kind == "assigned":
            self._assigned(tid, tr, eid, lease)
        elif kind in ("expired", "requeued"):  # (requeued: a multi-device task's parts ended)
            tr.live = False
        elif kind in ("released", "retrying"):  # retrying: failed, queued again (retry_on)
            self._lease_is_latest(tid, tr, eid, kind, lease)
            tr.live = False
        elif kind in TERMINAL:
            self._terminal(tid, tr, eid, kind, lease)

    def _assigned(self, tid: str, tr: _Trail, eid: str, lease: str) -> None:
        if tr.complete and tr.live:
            self.f.add(
                "task_two_leases",
                f"assigned event {eid} grants lease {lease} while lease {tr.lease} is live",
                task=tid,
            )
        tr.lease, tr.live = lease, True
        tr.leases.append(lease)

    def _terminal(self, tid: str, tr: _Trail, eid: str, kind: str, lease: str) -> None:
        if tr.terminal:
            self.f.add(
                "terminal_twice",
                f"{kind} event {eid} after the terminal event {tr.terminal}",
                task=tid,
            )
        else:
            tr.terminal = f"{kind} {eid}"
        self._lease_is_latest(tid, tr, eid, kind, lease)
        tr.live = False

    def _lease_is_latest(self, tid: str, tr: _Trail, eid: str, kind: str, lease: str) -> None:
        """An ending event carries the task's latest lease (or none, while none is live)."""
        if not tr.complete:
            return
        if lease and lease != tr.lease:
            self.f.add(
                "superseded_report",
                f"{kind} event {eid} carries lease {lease}, but the task's latest assignment "
                f"is lease {tr.lease or '(none)'}",
                task=tid,
            )
        elif not lease and tr.live:
            self.f.add(
                "superseded_report",
                f"{kind} event {eid} carries no lease while lease {tr.lease} is live",
                task=tid,
            )

    def check_against(self, st: _State, rd: _Reader) -> None:
        """Judge the state by the history: every assigned lease has its attempt record; a
        task that was submitted and never ended still exists. Counts untraceable tasks."""
        trimmed = {tid for tid, tr in self.trails.items() if not tr.complete}
        trimmed |= set(st.tasks) - set(self.trails)
        self.f.skip("history_trimmed", len(trimmed))
        lost = []
        for tid, tr in sorted(self.trails.items()):
            t = st.tasks.get(tid)
            if t is None:
                if tr.complete and not tr.terminal and tid not in st.vanished:
                    lost.append(tid)
                continue
            recorded = {lease for lease, *_ in t.records}
            for lease in tr.leases:
                if lease not in recorded:
                    self.f.add(
                        "attempt_missing",
                        f"lease {lease} was assigned (event stream) but has no attempt record",
                        task=tid,
                    )
        back = rd.existing([rd.keys.task(tid) for tid in lost])
        for tid in lost:
            if rd.keys.task(tid) in back:
                self.f.skip("changed_during_check")
            else:
                self.f.add(
                    "task_lost",
                    "the stream holds its submission and no terminal event, but the task is gone",
                    task=tid,
                )

    def check_deadlines(self, st: _State) -> None:
        """A ``deadlines`` entry outlives its task when the task ended and was trimmed before
        its deadline passed (entries are dropped lazily); it is an orphan only when the
        stream shows the task never ended."""
        for tid, _ in st.deadlines:
            if tid in st.tasks or tid in st.vanished:
                continue
            tr = self.trails.get(tid)
            if tr is None or not tr.complete or tr.terminal:
                self.f.skip("deadline_entries_unjudged")
            else:
                self.f.add(
                    "orphan_index_entry",
                    f"deadlines names task {tid}, which does not exist and never ended",
                    task=tid,
                    key="deadlines",
                )


# -- entry points ------------------------------------------------------------------------------
class PoolVerifier(PoolConnection):
    """Audits one pool (read-only); see the module documentation for what it checks."""

    def verify(
        self,
        *,
        batch: int = DEFAULT_BATCH,
        progress: Progress | None = None,
        confirm: bool = True,
    ) -> VerifyResult:
        """Read the pool and its event stream in bounded batches and report every violation
        of its invariants. With ``confirm``, a pass that finds violations is followed by a
        second one, and only what both find is reported (a transition that happened between
        two reads of a busy pool is counted in ``skipped["transient"]`` instead). Raises
        NotFound when the pool has no keys at all."""
        if not isinstance(batch, int) or not MIN_BATCH <= batch <= MAX_BATCH:
            raise InvalidInput(f"batch must be an integer {MIN_BATCH}-{MAX_BATCH}")
        if not self.redis.get_encoder().decode_responses:
            raise InvalidInput("verify needs a Redis client made with decode_responses=True")
        self.pin()  # on a cluster: SCAN the node that serves this pool
        first = self._pass(_Reader(self, batch, progress))
        if first.ok or not confirm:
            return first
        return _confirmed(first, self._pass(_Reader(self, batch, progress)))

    def _pass(self, rd: _Reader) -> VerifyResult:
        """One read of the pool and every check on it."""
        end = rd.last_event_id()  # events up to here are older than every state read below
        st = _read_state(rd)
        if st.space.total == 0:
            raise NotFound(f"pool {self.pool} has no keys ({self.keys.prefix}*): nothing to verify")
        f = _Findings()
        _check_state(st, f)
        history = _History(f)
        for eid, fields in rd.events(end):
            history.feed(eid, fields)
        history.check_against(st, rd)
        history.check_deadlines(st)
        _recheck_orphans(st, rd, f)
        for key, error in sorted(rd.errors.items()):
            f.add("wrong_type", error, key=key)
        return VerifyResult(
            pool=self.pool,
            violations=f.violations,
            checked={
                "keys": st.space.total,
                "tasks": len(st.tasks),
                "attempts": sum(len(t.records) for t in st.tasks.values()),
                "devices": len(st.devices),
                "hosts": len(st.space.hosts),
                "buckets": sum(1 for e in st.buckets.values() if e),
                "index_entries": st.index_entries(),
                "events": history.events,
                "passes": 1,
            },
            skipped=dict(sorted(f.skipped.items())),
        )


def _confirmed(first: VerifyResult, second: VerifyResult) -> VerifyResult:
    """The second pass's violations that the first found too (same kind and subjects)."""

    def ident(v: Violation) -> tuple[str | None, ...]:
        return (v.kind, v.task, v.device, v.host, v.key)

    before = {ident(v) for v in first.violations}
    after = {ident(v) for v in second.violations}
    skipped = Counter(second.skipped)
    skipped["transient"] += len(before ^ after)
    return VerifyResult(
        pool=second.pool,
        violations=[v for v in second.violations if ident(v) in before],
        checked={**second.checked, "passes": 2},
        skipped=dict(sorted(skipped.items())),
    )


def _check_state(st: _State, f: _Findings) -> None:
    """Every check that needs the state alone."""
    _check_status_indexes(st, f)
    for s in STATUSES:
        _orphans(st, f, f"status:{s}", st.status[s])
    _orphans(st, f, "leases", st.leases)
    _check_leases(st, f)
    _check_reservations(st, f)
    _check_attempts(st, f)
    _check_task_hosts(st, f)
    _check_buckets(st, f)
    _check_task_entries(st, f)
    _check_devices(st, f)
    _check_idle(st, f)
    _check_bookings(st, f)
    _check_tenants(st, f)


def _check_tenants(st: _State, f: _Findings) -> None:
    """``tenant_held`` counts each tenant's tasks holding a lease (assigned or running)."""
    held: dict[str, int] = {}
    for t in st.tasks.values():
        if t.tenant and t.status in ACTIVE:
            held[t.tenant] = held.get(t.tenant, 0) + 1
    stored = st.counters.get("tenant_held", {})
    for name in sorted(set(held) | set(stored)):
        want, got = held.get(name, 0), _int(stored.get(name)) or 0
        if want != got:
            f.add(
                "tenant_held",
                f"tenant_held counts {got} device(s) for tenant {name}, its tasks hold {want}",
                key="tenant_held",
            )


def _recheck_orphans(st: _State, rd: _Reader, f: _Findings) -> None:
    """Drop orphan reports whose task appeared after the scan (a busy pool)."""
    candidates = sorted({v.task for v in f.violations if v.kind == "orphan_index_entry" and v.task})
    back = rd.existing([rd.keys.task(tid) for tid in candidates])
    late = {tid for tid in candidates if rd.keys.task(tid) in back}
    if late:
        kept = [v for v in f.violations if not (v.kind == "orphan_index_entry" and v.task in late)]
        f.skip("changed_during_check", len(f.violations) - len(kept))
        f.violations[:] = kept


def verify(
    target: PoolConnection | redis.Redis | str | None = None,
    pool: str | None = None,
    *,
    batch: int = DEFAULT_BATCH,
    progress: Progress | None = None,
    confirm: bool = True,
) -> VerifyResult:
    """Check a pool's invariants; returns a `VerifyResult` (``.ok``, ``.violations``,
    ``.checked``, ``.skipped``).

    ``target`` is a `PoolConnection` (a `PoolAdmin`, `Client`, ...) or, like every client, a
    Redis client or URL with ``pool`` (both default to ``DEVICEQ_REDIS_URL`` and
    ``DEVICEQ_POOL``). Every read is bounded by ``batch`` (commands per round trip, entries per
    reply); ``progress(stage, done, total)`` is called as it reads. With ``confirm`` (the
    default) violations are reported only when a second pass finds them again. Raises
    NotFound for a pool without keys, ConfigError for a malformed URL."""
    options: dict[str, Any] = {"batch": batch, "progress": progress, "confirm": confirm}
    if isinstance(target, PoolConnection):
        if pool is not None and pool != target.pool:
            raise InvalidInput(f"pool {pool!r} given with a connection to pool {target.pool!r}")
        return PoolVerifier(target.redis, target.pool).verify(**options)
    own = not isinstance(target, redis.Redis)
    verifier = PoolVerifier(target, pool)
    try:
        return verifier.verify(**options)
    finally:
        if own:
            verifier.close()
