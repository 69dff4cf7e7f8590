"""What `verify` reads: the bounds of its reads, the fields it reads, and the shapes it reads
them into (`TaskRow`, `KeySpace`, `PoolState`)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ...core import vocabulary

DEFAULT_BATCH = 200
"""Commands per round trip and entries per reply (the bound of every read)."""
MIN_BATCH, MAX_BATCH = 16, 10_000
ATTEMPTS_HEAD = 16
"""Attempt records read with their task (longer histories are read in further windows)."""

ACTIVE = vocabulary.LEASED_STATUSES
"""A task holding a lease (`deviceq.core.vocabulary`)."""
TERMINAL = vocabulary.TERMINAL_STATUSES
STATUSES = vocabulary.STATUSES
TASK_FIELDS = (
    "status", "attempt", "lease_id", "lease_expires_at", "device_id", "host_id", "seq", "sig",
    "finished_at", "tenant", "gang", "parts", "roles", "preempting", "preempting_task",
)  # fmt: skip
DEVICE_FIELDS = (
    "host_id", "driver_type", "tags", "state", "reserved_by", "lease_id", "quarantined", "held",
    "booked_until", "health", "registered_at", "preempt_for",
)  # fmt: skip
DEVICE_RECENT = 20
"""Attempt ends a device's history (``device:ID:history``) keeps, newest first: the mirror of
``DEVICE_RECENT`` in lua/lib/history.lua (tests/ops/test_verify_forgery.py compares them)."""


def to_int(x: str | None) -> int | None:
    try:
        return int(x) if x not in (None, "") else None
    except ValueError:
        return None


def to_float(x: str | None) -> float | None:
    try:
        return float(x) if x not in (None, "") else None
    except ValueError:
        return None


def parse_record(raw: str) -> tuple[str | None, str, str]:
    """(lease_id, outcome, host_id) of one attempt record (``(None, "?", "")`` when it is not
    JSON)."""
    try:
        rec = json.loads(raw)
    except ValueError:
        return None, "?", ""
    if not isinstance(rec, dict):
        return None, "?", ""
    return rec.get("lease_id"), str(rec.get("outcome", "?")), str(rec.get("host_id") or "")


@dataclass(frozen=True, slots=True)
class AttemptEnd:
    """What an attempt record says of where it ran and when it ended."""

    attempt: int | None
    host_id: str
    device_id: str
    assigned_at: int | None
    ended_at: int | None
    outcome: str

    @classmethod
    def parse(cls, raw: str) -> AttemptEnd:
        try:
            rec = json.loads(raw)
        except ValueError:
            rec = None
        if not isinstance(rec, dict):
            return cls(None, "", "", None, None, "?")

        def text(name: str) -> str:
            return str(rec.get(name) or "")

        return cls(to_int(text("attempt")), text("host_id"), text("device_id"),
                   to_int(text("assigned_at")), to_int(text("ended_at")),
                   str(rec.get("outcome", "?")))  # fmt: skip


def parse_history(raw: str) -> tuple[str, int | None, str, int | None] | None:
    """(task, attempt, outcome, at) of one entry of a device's history (None: not JSON)."""
    try:
        e = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(e, dict):
        return None
    return (str(e.get("task") or ""), to_int(str(e.get("attempt") or "")),
            str(e.get("outcome") or ""), to_int(str(e.get("at") or "")))  # fmt: skip


@dataclass(slots=True)
class TaskRow:
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
    preempting: str = ""  # (queued) the device it preempted a run of, waiting for it
    preempting_task: str = ""  # the task whose run it preempted there
    ends: list[AttemptEnd] = field(default_factory=list)
    """Each attempt record's host, device and times (in the order of ``records``)."""

    def add_records(self, raw: Iterable[str]) -> None:
        for x in raw:
            self.records.append(parse_record(x))
            self.ends.append(AttemptEnd.parse(x))

    @classmethod
    def parse(cls, tid: str, vals: Sequence[str | None], n: int, raw: Iterable[str]) -> TaskRow:
        f = dict(zip(TASK_FIELDS, vals, strict=True))
        row = cls(
            id=tid,
            status=f["status"] or "",
            attempt=to_int(f["attempt"]),
            lease_id=f["lease_id"] or "",
            lease_expires_at=to_int(f["lease_expires_at"]),
            device_id=f["device_id"] or "",
            host_id=f["host_id"] or "",
            seq=to_float(f["seq"]),
            sig=f["sig"] or "",
            finished_at=to_int(f["finished_at"]),
            attempts_len=int(n),
            tenant=f["tenant"] or "",
            records=[],
            gang=f["gang"] or "",
            parts=tuple(filter(None, (f["parts"] or "").split(","))),
            roles=bool(f["roles"]),
            preempting=f["preempting"] or "",
            preempting_task=f["preempting_task"] or "",
        )
        row.add_records(raw)
        return row


@dataclass
class KeySpace:
    """The pool's keys by shape, as one SCAN saw them."""

    total: int = 0
    tasks: set[str] = field(default_factory=set)
    queues: set[str] = field(default_factory=set)
    sigs: set[str] = field(default_factory=set)
    devices: set[str] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    inboxes: set[str] = field(default_factory=set)
    idle_classes: set[str] = field(default_factory=set)  # class ids of ``idle:c:CLASS``

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
        elif head == "idle" and n == 3 and parts[1] == "c":
            self.idle_classes.add(parts[2])


@dataclass
class PoolState:
    """Everything the state checks look at."""

    now: int
    cutoff: int
    """Terminal tasks finished at or before this are past ``retention`` (awaiting the trim)."""
    space: KeySpace
    tasks: dict[str, TaskRow]
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
    idle_classes: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    """Class id -> its idle set (``idle:c:CLASS``), in score order."""
    device_history: dict[str, list[tuple[str, int | None, str, int | None]]] = field(
        default_factory=dict
    )
    """Registered device -> its history (``device:ID:history``: task, attempt, outcome,
    at), newest first."""
    preemptible: list[tuple[str, float]] = field(default_factory=list)
    """``preemptible``: the running tasks of a priority class, by assignment time."""

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
