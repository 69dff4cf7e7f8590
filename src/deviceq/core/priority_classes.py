"""Priority classes: a named priority a task is submitted with (``submit --class NAME``), and
whether its tasks may take a device from running work (preempt) or be stopped for it.

``dq:{POOL}:pclasses`` (hash) maps a class name to ``PRIORITY:PREEMPTS:PREEMPTIBLE:GRACE_MS``
(``9:1:0:30000``): the task priority its tasks get (0..9, the task priority range), whether its
tasks may preempt a running task of a strictly lower priority, whether its own running tasks may
be preempted, and how long a preempted run of it is given to stop after its runner's stop signal
before it is killed. ``lua/preempt.lua`` reads the same text (``parse_class`` there).

A task without a class keeps the behaviour of a pool without classes: it is never preempted and
never preempts."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import redis

from .errors import InvalidInput, NotFound
from .keys import Keys
from .models import TaskSpec
from .validation import validate_id

MAX_PRIORITY = 9
MAX_GRACE_S = 3600.0
DEFAULT_GRACE_S = 30.0
MAX_CLASSES = 1000


@dataclass(frozen=True)
class PriorityClass:
    """One priority class."""

    name: str
    priority: int
    preempts: bool = False
    preemptible: bool = True
    grace: float = DEFAULT_GRACE_S  # seconds

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def stored(self) -> str:
        """The hash value (see the module docstring)."""
        return (
            f"{self.priority}:{int(self.preempts)}:{int(self.preemptible)}:"
            f"{round(self.grace * 1000)}"
        )


def parse_class(name: str, spec: str | bytes | None) -> PriorityClass | None:
    """The class stored as ``spec``; None when missing or malformed (the scripts then treat
    it as absent too: no preemption either way)."""
    if isinstance(spec, bytes):
        spec = spec.decode(errors="replace")
    parts = (spec or "").split(":")
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
        return None
    prio, pre, able, grace = (int(p) for p in parts)
    if prio > MAX_PRIORITY or pre > 1 or able > 1 or grace > MAX_GRACE_S * 1000:
        return None
    return PriorityClass(name, prio, bool(pre), bool(able), grace / 1000)


def check_class(c: PriorityClass) -> PriorityClass:
    """``c`` if valid, else InvalidInput naming the first bad field."""
    validate_id(c.name, "priority class")
    if isinstance(c.priority, bool) or not isinstance(c.priority, int):
        raise InvalidInput(f"priority must be an integer 0-{MAX_PRIORITY}, got {c.priority!r}")
    if not 0 <= c.priority <= MAX_PRIORITY:
        raise InvalidInput(f"priority must be an integer 0-{MAX_PRIORITY}, got {c.priority}")
    if not isinstance(c.grace, int | float) or not 0 <= c.grace <= MAX_GRACE_S:
        raise InvalidInput(f"grace must be 0-{MAX_GRACE_S:g} seconds, got {c.grace!r}")
    if c.preempts and c.priority == 0:
        raise InvalidInput("a class that preempts needs a priority above 0 (it preempts only "
                           "strictly lower priorities)")  # fmt: skip
    return c


def add_class(r: redis.Redis, keys: Keys, c: PriorityClass) -> PriorityClass:
    """Validate and store ``c`` (replacing a class of that name). InvalidInput, nothing
    written, for a bad field or when the pool has ``MAX_CLASSES`` classes already."""
    check_class(c)
    if not r.hexists(keys.pclasses, c.name) and r.hlen(keys.pclasses) >= MAX_CLASSES:
        raise InvalidInput(f"the pool has {MAX_CLASSES} priority classes already")
    r.hset(keys.pclasses, c.name, c.stored())
    return c


def remove_class(r: redis.Redis, keys: Keys, name: str) -> bool:
    """Forget a class. Tasks submitted with it keep their priority; while it is missing they
    neither preempt nor are preempted. True if it existed."""
    validate_id(name, "priority class")
    return bool(r.hdel(keys.pclasses, name))


def get_class(r: redis.Redis, keys: Keys, name: str) -> PriorityClass:
    """The class ``name``; NotFound when the pool has none of that name."""
    validate_id(name, "priority class")
    c = parse_class(name, r.hget(keys.pclasses, name))
    if c is None:
        raise NotFound(f"no priority class {name!r} (add it with: deviceq priority-class add)")
    return c


def all_classes(r: redis.Redis, keys: Keys) -> list[PriorityClass]:
    """Every well-formed class, highest priority first, then by name (one hash read, at most
    ``MAX_CLASSES`` entries)."""
    out = []
    for name, spec in (r.hgetall(keys.pclasses) or {}).items():
        n = name.decode() if isinstance(name, bytes) else str(name)
        c = parse_class(n, spec)
        if c is not None:
            out.append(c)
    return sorted(out, key=lambda c: (-c.priority, c.name))


def resolve_classes(r: redis.Redis, keys: Keys, specs: list[TaskSpec]) -> list[TaskSpec]:
    """``specs`` with each named class's priority set (one read of the classes named).
    NotFound for an unknown class; InvalidInput for a spec giving another priority than its
    class's, or a class on a multi-device task (a gang is never preempted one part at a time
    and does not preempt)."""
    names = sorted({s.priority_class for s in specs if s.priority_class})
    if not names:
        return specs
    found = dict(zip(names, r.hmget(keys.pclasses, names), strict=True))
    out = []
    for s in specs:
        if not s.priority_class:
            out.append(s)
            continue
        c = parse_class(s.priority_class, found[s.priority_class])
        if c is None:
            raise NotFound(
                f"no priority class {s.priority_class!r} (list them: deviceq priority-class list)"
            )
        if s.roles:
            raise InvalidInput("a multi-device task (roles) takes no priority class")
        if s.priority not in (0, c.priority):
            raise InvalidInput(
                f"priority {s.priority} contradicts class {c.name}'s priority {c.priority}: "
                "give one of them"
            )
        out.append(s.model_copy(update={"priority": c.priority}))
    return out
