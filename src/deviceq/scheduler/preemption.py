"""Preemption: a queued task of a class that ``--preempts`` and matches no idle device takes
the device of a running task of a strictly lower priority (`deviceq.core.priority_classes`).

The leading scheduler decides at the end of a pass (`Preemptor.decide`), for the urgent tasks
near the heads of the buckets of a priority some preempting class has: the victim is the
shortest-running preemptible task (the newest in ``preemptible``, ties: the lowest priority)
on a device satisfying the urgent task's constraints. ``lua/preempt.lua`` commits each decision,
checking everything again atomically and fenced by the leader's epoch; the victim's host stops
the run (its renewal answers ``preempt:GRACE_MS``) and reports ``preempted``. In every pass
with something queued and a hand-over waiting (the ``preempt_handover`` zset, read with the
pass's base), before placing, the devices so freed are given to the tasks that preempted them
(`Preemptor.hand_over`), and ``assign.lua`` refuses them to anyone else meanwhile: the device is
never given away before the preempted run has stopped.

Every read is bounded: the classes hash, at most ``URGENT_BUCKETS`` buckets' first
``URGENT_HEADS`` tasks, the ``VICTIM_SCAN`` newest entries of ``preemptible``, the first
``HANDOVER_SCAN`` waiting hand-overs."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from ..core.config import PoolConfig
from ..core.keys import Keys
from ..core.models import satisfies
from ..core.priority_classes import PriorityClass, all_classes
from .client import SchedulerClient
from .placement.rows import Bucket, IdleDevice

URGENT_BUCKETS = 32  # buckets of a preempting priority looked at per pass
URGENT_HEADS = 8  # tasks per such bucket
VICTIM_SCAN = 256  # newest running tasks of a class looked at per pass
HANDOVER_SCAN = 100  # waiting hand-overs looked at per pass
CLASSES_TTL = 1.0  # seconds the classes read stay in use

TASK_FIELDS = ("status", "class", "priority", "driver_type", "tags", "preempting", "roles", "gang")
VICTIM_FIELDS = (
    "status", "class", "priority", "device_id", "preempt_by", "cancel_requested",
    "preemptions", "roles", "gang",
)  # fmt: skip
DEVICE_FIELDS = ("driver_type", "tags", "booked_until", "reserved_by")


def _s(v: Any) -> str:
    if v is None:
        return ""
    return v.decode() if isinstance(v, bytes) else str(v)


def _tags(v: Any) -> frozenset[str]:
    return frozenset(t for t in _s(v).split(",") if t)


@dataclass(frozen=True)
class Urgent:
    """A queued task that may preempt: its id, priority and constraints."""

    task_id: str
    priority: int
    driver_type: str
    tags: frozenset[str]
    cls: str


@dataclass(frozen=True)
class Victim:
    """A running task that may be preempted, on its device."""

    task_id: str
    device_id: str
    priority: int
    assigned_at: int
    driver_type: str
    tags: frozenset[str]


@dataclass
class Choice:
    """For one urgent task: the victim chosen, or why there is none."""

    urgent: str
    victim: Victim | None = None
    why_none: str = ""
    skipped: dict[str, int] = field(default_factory=dict)  # candidate victims by reason


def limits(r: redis.Redis, keys: Keys) -> tuple[int, int, int]:
    """(max_preemptions_per_minute, max_preemptions_per_task, preemptions in the last minute),
    as preempt.lua reads them (a malformed setting is its default, clamped to its bounds)."""
    pipe = r.pipeline(transaction=False)
    pipe.hmget(keys.config, "max_preemptions_per_minute", "max_preemptions_per_task")
    pipe.time()
    pipe.zrange(keys.preempt_recent, 0, -1, withscores=True)
    (per_min, per_task), (sec, usec), recent = pipe.execute()
    now = int(sec) * 1000 + int(usec) // 1000
    fields = PoolConfig.model_fields

    def setting(name: str, raw: Any) -> int:
        f = fields[name]
        lo = next(m.ge for m in f.metadata if hasattr(m, "ge"))
        hi = next(m.le for m in f.metadata if hasattr(m, "le"))
        try:
            v = int(float(_s(raw)))
        except ValueError:
            v = int(f.default)
        return max(lo, min(hi, v))

    used = sum(1 for _, score in recent if score > now - 60_000)
    return (
        setting("max_preemptions_per_minute", per_min),
        setting("max_preemptions_per_task", per_task),
        used,
    )


def read_victims(
    r: redis.Redis, keys: Keys, scan: int = VICTIM_SCAN
) -> list[tuple[Victim, dict[str, str]]]:
    """The newest ``scan`` running tasks of a class (shortest running first), each with the
    task fields preempt.lua checks (two pipelined round trips)."""
    got: list[Any] = list(r.zrevrange(keys.preemptible, 0, scan - 1, withscores=True) or [])
    if not got:
        return []
    ids = [_s(m) for m, _ in got]
    scores = [int(float(s)) for _, s in got]
    pipe = r.pipeline(transaction=False)
    for tid in ids:
        pipe.hmget(keys.task(tid), *VICTIM_FIELDS)
    rows = [dict(zip(VICTIM_FIELDS, map(_s, vals), strict=True)) for vals in pipe.execute()]
    devs = [row["device_id"] for row in rows]
    pipe = r.pipeline(transaction=False)
    for d in devs:
        pipe.hmget(keys.device(d or "-"), *DEVICE_FIELDS)
    drows = [dict(zip(DEVICE_FIELDS, map(_s, vals), strict=True)) for vals in pipe.execute()]
    out = []
    for tid, score, row0, dev in zip(ids, scores, rows, drows, strict=True):
        row = {**row0, **{"device_" + k: v for k, v in dev.items()}}
        prio = int(row["priority"] or 0)
        v = Victim(
            _s(tid), row["device_id"], prio, int(score), dev["driver_type"], _tags(dev["tags"])
        )
        out.append((v, row))
    return out


def victim_refusal(
    v: Victim,
    row: dict[str, str],
    urgent: Urgent,
    classes: dict[str, PriorityClass],
    max_per_task: int,
) -> str | None:
    """Why running task ``v`` (its fields ``row``) cannot be preempted for ``urgent`` (the
    checks of preempt.lua, in its order), or None when it can."""
    if row["status"] not in ("assigned", "dispatched"):
        return "not running"
    if row["roles"] or row["gang"]:
        return "part of a multi-device task"
    c = classes.get(row["class"])
    if c is None:
        return "no priority class"
    if not c.preemptible:
        return "not preemptible"
    if v.priority >= urgent.priority:
        return "not of a lower priority"
    if row["preempt_by"]:
        return "already stopping (in its grace)"
    if row["cancel_requested"] == "1":
        return "being cancelled"
    if int(row["preemptions"] or 0) >= max_per_task:
        return f"preempted {max_per_task} times already (max_preemptions_per_task)"
    if row["device_reserved_by"] != v.task_id:
        return "not on its device"
    if row["device_booked_until"]:
        return "device booked"
    if not satisfies(urgent.driver_type or None, urgent.tags, v.driver_type, v.tags):
        return "device does not match"
    return None


def choose(
    urgent: Urgent,
    victims: Sequence[tuple[Victim, dict[str, str]]],
    classes: dict[str, PriorityClass],
    max_per_task: int,
    taken: set[str] | None = None,
) -> Choice:
    """The victim for ``urgent`` among ``victims``: the shortest running (the latest
    assigned), with equal times the lowest priority; or why none can be preempted."""
    ch = Choice(urgent.task_id)
    best: tuple[int, int, Victim] | None = None
    for v, row in victims:
        why = "chosen for another urgent task" if taken and v.task_id in taken else None
        why = why or victim_refusal(v, row, urgent, classes, max_per_task)
        if why:
            ch.skipped[why] = ch.skipped.get(why, 0) + 1
            continue
        key = (-v.assigned_at, v.priority)
        if best is None or key < best[:2]:
            best = (key[0], key[1], v)
    if best is not None:
        ch.victim = best[2]
    elif not victims:
        ch.why_none = "no running task of a priority class"
    else:
        ch.why_none = "no running task can be preempted: " + ", ".join(
            f"{n} {why}" for why, n in sorted(ch.skipped.items(), key=lambda x: -x[1])
        )
    return ch


class Preemptor:
    """The scheduler's preemption step (see the module docstring)."""

    def __init__(self, store: SchedulerClient) -> None:
        self.store = store
        self.r = store.redis
        self.keys = store.keys
        self._classes: dict[str, PriorityClass] = {}
        self._read_at = float("-inf")

    def classes(self) -> dict[str, PriorityClass]:
        """The pool's classes (read again after ``CLASSES_TTL``)."""
        now = time.monotonic()
        if now - self._read_at > CLASSES_TTL:
            self._classes = {c.name: c for c in all_classes(self.r, self.keys)}
            self._read_at = now
        return self._classes

    def hand_over(self, fence: int | str, waiting: Sequence[str]) -> list[tuple[str, str, str]]:
        """Give each device whose preempted run has ended to the task that preempted it (one
        ``assign.lua`` call). ``waiting``: the first ``HANDOVER_SCAN`` tasks of the
        ``preempt_handover`` zset, as read with the pass's base
        (`snapshot.SnapshotReader.handovers`). Returns the (task, device, lease) assigned."""
        k = self.keys
        if not waiting or fence == "":
            return []
        pipe = self.r.pipeline(transaction=False)
        for uid in waiting:
            pipe.hget(k.task(uid), "preempting")
        devices = [_s(d) for d in pipe.execute()]
        pipe = self.r.pipeline(transaction=False)
        for d in devices:
            pipe.hmget(k.device(d or "-"), "reserved_by", "preempt_for")
        pairs = [
            (uid, d)
            for uid, d, (res, pf) in zip(waiting, devices, pipe.execute(), strict=True)
            if d and not _s(res) and _s(pf) == uid
        ]
        # a hold whose task left the queue is dropped by assign.lua (task_not_queued)
        stale = [(uid, d) for uid, d in zip(waiting, devices, strict=True) if not d]
        if not pairs and not stale:
            return []
        out = []
        answers = self.store.commit(pairs, fence) if pairs else []
        for (uid, d), a in zip(pairs, answers, strict=True):
            if a.startswith("ok:"):
                out.append((uid, d, a[3:]))
        if stale:  # no device named: nothing holds for them
            self.r.zrem(k.preempt_handover, *[u for u, _ in stale])
        return out

    def urgent_tasks(
        self, shells: Iterable[Bucket], devices: Sequence[IdleDevice], placed: set[str]
    ) -> list[Urgent]:
        """The queued tasks of a preempting class near their buckets' heads that no idle
        device matches and that have no preemption pending, highest priority first."""
        classes = self.classes()
        floor = min((c.priority for c in classes.values() if c.preempts), default=None)
        if floor is None:
            return []
        sigs = [b for b in shells if b.priority >= floor][:URGENT_BUCKETS]
        if not sigs:
            return []
        pipe = self.r.pipeline(transaction=False)
        for b in sigs:
            pipe.zrange(self.keys.queue(b.sig), 0, URGENT_HEADS - 1)
        ids = [_s(t) for heads in pipe.execute() for t in heads if _s(t) not in placed]
        if not ids:
            return []
        pipe = self.r.pipeline(transaction=False)
        for tid in ids:
            pipe.hmget(self.keys.task(tid), *TASK_FIELDS)
        out = []
        for tid, vals in zip(ids, pipe.execute(), strict=True):
            row = dict(zip(TASK_FIELDS, map(_s, vals), strict=True))
            c = classes.get(row["class"])
            if row["status"] != "queued" or c is None or not c.preempts or row["preempting"]:
                continue
            if row["roles"] or row["gang"]:
                continue
            u = Urgent(tid, int(row["priority"] or 0), row["driver_type"], _tags(row["tags"]),
                       row["class"])  # fmt: skip
            if any(satisfies(u.driver_type or None, u.tags, d.driver_type, d.tags)
                   for d in devices):  # fmt: skip
                continue  # an idle device matches: it is placed without preempting
            out.append(u)
        out.sort(key=lambda u: -u.priority)
        return out

    def decide(
        self, shells: Iterable[Bucket], devices: Sequence[IdleDevice], placed: set[str],
        fence: int | str,
    ) -> list[tuple[str, str, str]]:  # fmt: skip
        """Preempt for the urgent tasks of this pass (see the module docstring). Returns the
        (urgent, victim, device) committed."""
        if fence == "":
            return []
        urgent = self.urgent_tasks(shells, devices, placed)
        if not urgent:
            return []
        per_min, per_task, used = limits(self.r, self.keys)
        if used >= per_min:
            return []
        victims = read_victims(self.r, self.keys)
        if not victims:
            return []
        classes = self.classes()
        out: list[tuple[str, str, str]] = []
        taken: set[str] = set()
        for u in urgent:
            if used + len(out) >= per_min:
                break
            ch = choose(u, victims, classes, per_task, taken)
            if ch.victim is None:
                continue
            v = ch.victim
            taken.add(v.task_id)
            ans = self.store.preempt(u.task_id, v.task_id, v.device_id, fence)
            if ans == "ok":
                out.append((u.task_id, v.task_id, v.device_id))
            elif ans == "err:rate_limited":
                break
        return out
