"""The bounded reads of one pool (`Reader`: at most ``batch`` commands per round trip and
``batch`` entries per reply) and the read of the whole state the checks need (`read_state`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import redis

from ...core.config import PoolConfig
from ...core.connection import PoolConnection
from ...core.limits import COUNTERS as LIMIT_COUNTERS
from .model import (
    ATTEMPTS_HEAD,
    DEVICE_FIELDS,
    STATUSES,
    TASK_FIELDS,
    KeySpace,
    PoolState,
    TaskRow,
    parse_history,
    to_float,
)
from .results import Progress


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


class Reader:
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
        value = to_float(raw)
        if value is None or value != value:
            value = default
        lo, hi = PoolConfig.bounds("retention")
        return int(min(max(value, lo), hi) * 1000)

    def last_event_id(self) -> str | None:
        newest: Any = self._guarded(
            self.keys.events, lambda: self.r.xrevrange(self.keys.events, count=1), []
        )
        return str(newest[0][0]) if newest else None

    def scan(self) -> KeySpace:
        space = KeySpace()
        for key in self.r.scan_iter(match=self.keys.prefix + "*", count=self.batch):
            space.add(self.rel(str(key)))
            if space.total % 10_000 == 0:
                self.tell("scanning keys", space.total)
        self.tell("scanning keys", space.total, space.total)
        return space

    def tasks(self, ids: list[str]) -> tuple[dict[str, TaskRow], set[str]]:
        """Each task's fields, attempt count and attempt records; and the ids whose hash
        vanished since the scan (expired by retention meanwhile)."""
        k, head = self.keys, min(self.batch, ATTEMPTS_HEAD)
        out: dict[str, TaskRow] = {}
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
                out[tid] = TaskRow.parse(tid, vals, n or 0, raw or [])
                if (n or 0) > head:
                    longer.append((k.attempts(tid), head, int(n)))
            self.tell(
                "reading tasks", min(len(ids), (done + 1) * max(1, self.batch // 3)), len(ids)
            )
        owner = {k.attempts(tid): tid for tid in out}
        for key, entries in self._ranged("lrange", longer):
            out[owner[key]].add_records(entries)
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


def read_state(rd: Reader) -> PoolState:
    """Read every key the checks need (the event stream is read afterwards, streamed)."""
    k = rd.keys
    now = rd.now_ms()
    cutoff = now - rd.retention_ms()
    space = rd.scan()
    tasks, vanished = rd.tasks(sorted(space.tasks))
    sigs = sorted(space.queues)
    status_keys = [k.status(s) for s in STATUSES]
    pool_zsets = [k.leases, k.deadlines, k.retries, k.idle, k.bookings, k.queues, k.gangs,
                  k.preemptible]  # fmt: skip
    z = rd.zsets(status_keys + pool_zsets, "reading indexes")
    queues = z[k.queues]
    sigs = sorted(set(sigs) | {sig for sig, _ in queues})
    buckets = rd.zsets([k.queue(sig) for sig in sigs], "reading queue buckets")
    inboxes = rd.lists([k.inbox(h) for h in sorted(space.inboxes)], "reading host inboxes")
    devices = rd.members(k.devices)
    classes = sorted(space.idle_classes)
    by_class = rd.zsets([k.idle_class(c) for c in classes], "reading idle classes")
    registered = sorted(devices)
    histories = rd.lists([k.device_history(d) for d in registered], "reading device histories")
    return PoolState(
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
        preemptible=z[k.preemptible],
        buckets={sig: buckets[k.queue(sig)] for sig in sigs},
        avoid=rd.hash(k.avoid),
        inboxes={h: inboxes[k.inbox(h)] for h in sorted(space.inboxes)},
        devices=devices,
        device_rows=rd.devices(sorted(devices | space.devices)),
        counters={
            **{name: rd.hash(getattr(k, name)) for name in ("caps", "drivers", "qdrivers")},
            **{c: rd.hash(k.counter(c)) for c in LIMIT_COUNTERS},
        },
        idle_classes={c: by_class[k.idle_class(c)] for c in classes},
        device_history={
            d: [e for e in map(parse_history, histories[k.device_history(d)]) if e is not None]
            for d in registered
        },
    )
