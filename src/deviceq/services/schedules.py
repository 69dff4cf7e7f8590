"""Schedules: a task submitted periodically, at the times of a cron expression (UTC).

``deviceq schedule add nightly --cron "0 2 * * *" "run the soak" --driver-type android``
stores a schedule in ``schedules`` (name -> JSON: cron, the submit spec, ``paused``,
``created_at``); the leading scheduler's `Firer` looks every `TICK` seconds and, for each
schedule not paused, takes the latest due time of its cron (at or before now, Redis time). When
that is newer than the last run recorded in ``schedules:last`` (and than the schedule's
creation or its last resume), it submits ONE task for it:

- a run is claimed through ``lua/schedule_fire.lua``, fenced by the leader epoch: only the
  leading scheduler can, and only once (the recorded run must be older), so two schedulers
  never both own a run;
- the task is submitted with the idempotency key ``schedule.NAME.RUN_TIME`` (seconds since
  the epoch; ids allow no ``:``), and its id recorded on the run; a run left pending by a
  scheduler that died between the two is submitted again by the next leader with the same key,
  so it is submitted once (the key holds for the pool's ``idempotency_ttl``);
- slots missed while no scheduler led (or while it was paused) are not replayed one by one:
  the latest missed slot is run once (catch-up), the older ones are skipped; slots before the
  schedule was added or resumed are never run.

A submission the pool refuses for good (an unknown workflow, an unmatchable task, a bad spec)
is recorded as the run's ``error`` (event ``schedule_failed``); a full queue or an unreachable
Redis leave the run pending, tried again at the next look."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

import redis
from croniter import croniter

from ..core.errors import DeviceqError, Fenced, InvalidInput, NotConfirmed, NotFound, QueueFull
from ..core.keys import Keys
from ..core.scripts import Scripts
from ..core.validation import ID_RE
from .leader_loop import LeaderLoop

_LOG = logging.getLogger("deviceq.schedules")

TICK = 5.0  # seconds between two looks of the leading scheduler
MAX_SCHEDULES = 200
MAX_NAME = 64  # so that schedule.NAME.RUN_TIME stays an id (at most 128 characters)
MAX_CRON = 200
SPEC_FIELDS = (
    "goal", "workflow", "driver_type", "tags", "priority", "max_attempts", "queue_timeout",
    "timeout", "reject_unmatched", "retry_on", "retry_backoff", "tenant", "roles", "where",
    "priority_class",
)  # fmt: skip
"""The `deviceq.producer.Client.submit` arguments a schedule's spec may hold."""


def check_name(name: object) -> str:
    """A schedule name: an id (A-Z a-z 0-9 . _ -, starting with a letter or digit) of at most
    64 characters; InvalidInput otherwise."""
    if not isinstance(name, str) or len(name) > MAX_NAME or not ID_RE.fullmatch(name):
        shown = repr(name[:MAX_NAME]) + ("..." if len(name) > MAX_NAME else "") if isinstance(
            name, str) else type(name).__name__  # fmt: skip
        raise InvalidInput(
            f"invalid schedule name {shown}: use 1-{MAX_NAME} characters from A-Z a-z 0-9 . _ - "
            "starting with a letter or digit"
        )
    return name


def check_cron(expr: object) -> str:
    """A cron expression of five fields (minute hour day-of-month month day-of-week, e.g.
    ``0 2 * * *``) or a macro (``@hourly``, ``@daily``...), checked by croniter; InvalidInput
    otherwise (seconds fields are refused: a schedule runs at most once a minute)."""
    if not isinstance(expr, str) or not expr.strip() or len(expr) > MAX_CRON:
        raise InvalidInput(f"a cron expression must be 1-{MAX_CRON} characters")
    text = " ".join(expr.split())
    fields = text.split(" ")
    if not (text.startswith("@") and len(fields) == 1) and len(fields) != 5:
        raise InvalidInput(
            f"bad cron expression {expr!r}: give five fields (minute hour day month weekday), "
            'e.g. "0 2 * * *", or @hourly/@daily/@weekly/@monthly/@yearly'
        )
    if not croniter.is_valid(text):
        raise InvalidInput(f"bad cron expression {expr!r}: croniter cannot read it")
    try:
        croniter(text, datetime.fromtimestamp(0, UTC)).get_next(float)
    except Exception as exc:  # noqa: BLE001 - croniter raises several kinds for odd input
        raise InvalidInput(f"bad cron expression {expr!r}: {exc}") from None
    return text


def _at(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def due_before(cron: str, now: float) -> int:
    """The latest time of ``cron`` at or before ``now`` (seconds since the epoch, UTC)."""
    return int(croniter(cron, _at(int(now) + 1)).get_prev(float))


def next_after(cron: str, now: float) -> int:
    """The first time of ``cron`` after ``now``."""
    return int(croniter(cron, _at(int(now))).get_next(float))


def idempotency_key(name: str, run_time: int) -> str:
    """The idempotency key of a schedule's run: ``schedule.NAME.RUN_TIME``."""
    return f"schedule.{name}.{int(run_time)}"


def iso(t: float | None) -> str | None:
    """``2026-12-02T02:00:00Z`` (None stays None)."""
    return None if t is None else _at(t).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class LastRun:
    """The last run recorded for a schedule: its time, and the task submitted for it (None
    while pending) or why none could be."""

    run_time: int
    task_id: str | None = None
    error: str | None = None

    @property
    def pending(self) -> bool:
        return self.task_id is None and self.error is None

    @classmethod
    def from_json(cls, raw: str) -> LastRun | None:
        try:
            d = json.loads(raw)
            return cls(int(d["run"]), d.get("task") or None, d.get("error") or None)
        except (ValueError, KeyError, TypeError):
            return None

    def public(self) -> dict[str, Any]:
        return {"run_time": self.run_time, "task_id": self.task_id, "error": self.error}


@dataclass(frozen=True)
class Schedule:
    """A schedule: its name, cron expression, the submit spec of each run, when it was added
    (ms) and, when paused or resumed, since when (ms)."""

    name: str
    cron: str
    spec: dict[str, Any]
    created_at: int
    paused: bool = False
    changed_at: int | None = None  # the last pause or resume (ms)

    def since(self) -> float:
        """Seconds since the epoch before which no run of it is due: its creation, or its
        last resume (slots missed while paused are not caught up)."""
        return max(self.created_at, self.changed_at or 0) / 1000

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "cron": self.cron, "spec": self.spec,
                           "created_at": self.created_at, "paused": self.paused,
                           "changed_at": self.changed_at}, sort_keys=True)  # fmt: skip

    @classmethod
    def from_json(cls, raw: str) -> Schedule:
        d = json.loads(raw)
        return cls(str(d["name"]), str(d["cron"]), dict(d["spec"]), int(d["created_at"]),
                   bool(d.get("paused")), d.get("changed_at"))  # fmt: skip

    def public(self, last: LastRun | None, now: float) -> dict[str, Any]:
        """As ``schedule list --json`` prints it (``next_run``: None while paused)."""
        nxt = None if self.paused else next_after(self.cron, max(now, self.since()))
        return {"name": self.name, "cron": self.cron, "paused": self.paused,
                "goal": self.spec.get("goal"), "workflow": self.spec.get("workflow"),
                "spec": self.spec, "created_at": self.created_at,
                "next_run": nxt, "next_run_iso": iso(nxt),
                "last_run": last.public() if last else None,
                "last_run_iso": iso(last.run_time) if last else None}  # fmt: skip


def check_spec(name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The submit spec of a schedule's runs, validated as a submission would be (a goal or a
    workflow, tags, priority...); InvalidInput for an unknown field or a bad value."""
    from ..producer.submission import spec_from

    unknown = sorted(set(spec) - set(SPEC_FIELDS))
    if unknown:
        raise InvalidInput(f"a schedule's spec has no field {unknown[0]!r}")
    clean = {k: v for k, v in spec.items() if v is not None and v != [] and v != ()}
    if isinstance(clean.get("tags"), tuple):
        clean["tags"] = list(clean["tags"])
    spec_from({**clean, "idempotency_key": idempotency_key(name, 10**10)})
    return clean


def redis_now(r: redis.Redis) -> float:
    """Redis's clock (seconds): every scheduler of the pool agrees on it."""
    sec, usec = r.time()
    return int(sec) + int(usec) / 1e6


class ScheduleStore:
    """The pool's schedules (``schedules``) and their last runs (``schedules:last``)."""

    def __init__(self, r: redis.Redis, keys: Keys) -> None:
        self.r, self.keys = r, keys

    def add(self, name: str, cron: str, spec: Mapping[str, Any]) -> Schedule:
        """Store a new schedule (InvalidInput for a bad name, cron or spec, or a name in use;
        nothing is written then)."""
        check_name(name)
        cron = check_cron(cron)
        clean = check_spec(name, spec)
        if self.r.hexists(self.keys.schedules, name):
            raise InvalidInput(f"schedule {name} exists: remove it first")
        if self.r.hlen(self.keys.schedules) >= MAX_SCHEDULES:
            raise InvalidInput(f"a pool has at most {MAX_SCHEDULES} schedules: remove one first")
        s = Schedule(name, cron, clean, int(redis_now(self.r) * 1000))
        self.r.hdel(self.keys.schedule_last, name)  # (a run of an earlier schedule of that name)
        if not self.r.hsetnx(self.keys.schedules, name, s.to_json()):
            raise InvalidInput(f"schedule {name} exists: remove it first")
        return s

    def get(self, name: str) -> Schedule:
        check_name(name)
        raw = self.r.hget(self.keys.schedules, name)
        if raw is None:
            raise NotFound(f"no schedule {name}")
        return Schedule.from_json(str(raw))

    def all(self) -> list[Schedule]:
        """Every readable schedule, by name (one written by hand that cannot be read is
        skipped)."""
        raw: dict[str, str] = self.r.hgetall(self.keys.schedules)  # type: ignore[assignment]
        out = []
        for v in raw.values():
            try:
                out.append(Schedule.from_json(v))
            except (ValueError, KeyError, TypeError):
                continue
        return sorted(out, key=lambda s: s.name)

    def last_runs(self) -> dict[str, LastRun]:
        raw: dict[str, str] = self.r.hgetall(self.keys.schedule_last)  # type: ignore[assignment]
        return {n: lr for n, v in raw.items() if (lr := LastRun.from_json(v)) is not None}

    def remove(self, name: str) -> None:
        check_name(name)
        if not self.r.hdel(self.keys.schedules, name):
            raise NotFound(f"no schedule {name}")
        self.r.hdel(self.keys.schedule_last, name)

    def set_paused(self, name: str, paused: bool) -> bool:
        """Pause or resume; False when it already was so."""
        s = self.get(name)
        if s.paused == paused:
            return False
        now = int(redis_now(self.r) * 1000)
        new = Schedule(s.name, s.cron, s.spec, s.created_at, paused, now)
        self.r.hset(self.keys.schedules, name, new.to_json())
        return True


@dataclass(frozen=True)
class Fired:
    """What one look did for one schedule: the run's time and its task (or error)."""

    name: str
    run_time: int
    task_id: str | None
    error: str | None = None


SubmitFn = Callable[[dict[str, Any], str], str]


@dataclass
class Firer(LeaderLoop):
    """Submits the pool's scheduled runs while ``epoch()`` (the scheduler's leader epoch, None
    while it does not lead) says this process leads (see the module's doc)."""

    r: redis.Redis
    keys: Keys
    pool: str
    epoch: Callable[[], int | None]
    every: float = TICK
    stopping: threading.Event = field(default_factory=threading.Event)
    NAME: ClassVar[str] = "schedules"
    LOG: ClassVar[logging.Logger] = _LOG

    def __post_init__(self) -> None:
        from ..producer.client import Client

        self.store = ScheduleStore(self.r, self.keys)
        self.scripts = Scripts(self.r)
        self.client = Client(self.r, self.pool)
        self.client.priority_warnings = False  # (a schedule's priority: said at schedule add)

    def thread_name(self) -> str:
        return f"schedules-{self.pool}"

    def tick(self, now: float | None = None) -> list[Fired]:
        """One look: each due run submitted (``now``: seconds since the epoch; default the
        Redis clock). Returns what was submitted or recorded; nothing when this scheduler does
        not lead or another one took the lead meanwhile."""
        epoch = self.epoch()
        if epoch is None:
            return []
        if now is None:
            now = redis_now(self.r)
        lasts = self.store.last_runs()
        out: list[Fired] = []
        try:
            for s in self.store.all():
                if self.stopping.is_set():
                    break
                if s.paused:
                    continue
                last = lasts.get(s.name)
                if last is not None and last.pending:  # its owner died before submitting it
                    fired = self._submit(s, last.run_time, epoch)
                else:
                    due = due_before(s.cron, now)
                    if due <= s.since() or (last is not None and due <= last.run_time):
                        continue
                    if not self._script("claim", epoch, s.name, due):
                        continue  # recorded already (by another scheduler)
                    fired = self._submit(s, due, epoch)
                if fired is not None:
                    out.append(fired)
        except Fenced:
            _LOG.info("schedules: another scheduler leads pool %s now", self.pool)
        return out

    def _script(self, action: str, epoch: int, name: str, run: int, task: str = "",
                error: str = "") -> bool:  # fmt: skip
        args = [action, str(epoch), name, str(run), task, error[:500]]
        return bool(int(self.scripts.run("schedule_fire", self.keys.prefix, args)))

    def _submit(self, s: Schedule, run: int, epoch: int) -> Fired | None:
        """Submit the run at ``run`` (idempotent) and record its task; None when it stays
        pending (a full queue, an unconfirmed write: tried again at the next look) or another
        scheduler recorded it first."""
        key = idempotency_key(s.name, run)
        try:
            task_id: str | None = self.client.submit(**s.spec, idempotency_key=key)
            error = None
        except (QueueFull, NotConfirmed) as exc:
            _LOG.warning("schedule %s: run %s not submitted yet: %s", s.name, iso(run), exc)
            return None
        except Fenced:
            raise
        except DeviceqError as exc:  # refused for good: recorded, not retried
            task_id, error = None, f"{type(exc).__name__}: {exc}"
            _LOG.warning("schedule %s: run %s refused: %s", s.name, iso(run), error)
        if not self._script("done", epoch, s.name, run, task_id or "", error or ""):
            return None  # recorded meanwhile by another scheduler (the same task: same key)
        return Fired(s.name, run, task_id, error)


def start_firer(admin: Any, epoch: Callable[[], int | None]) -> Firer:
    """Run the schedules of ``admin``'s pool (a `PoolAdmin`) from this scheduler process while
    ``epoch()`` is its leader epoch."""
    f = Firer(admin.redis, admin.keys, admin.pool, epoch)
    f.start()
    return f


__all__ = [
    "Firer",
    "LastRun",
    "Schedule",
    "ScheduleStore",
    "check_cron",
    "check_name",
    "due_before",
    "idempotency_key",
    "next_after",
    "start_firer",
]
