"""Reading the pool's event stream (``dq:{POOL}:events``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis

from .keys import Keys

READ_COUNT = 1000


RENAMED = {"task": "task_id", "lease": "lease_id", "host": "host_id", "device": "device_id"}
"""Stream field -> name in the typed view: the names of the task JSON (``ScheduledTask``)."""

INT_FIELDS = frozenset(
    {
        "attempt",
        "epoch",
        "failures",
        "handbacks",
        "queued_ms",
        "claim_ms",
        "since_submit_ms",
        "quarantined",
        "devices",
        "until",  # ms: a reservation's end (device_reserved, device_released)
        "eligible_at",  # ms: when a retry waiting out its backoff is enqueued (requeued)
    }
)
"""Fields the scripts write as decimal integers: ints in the typed view."""


def typed_fields(fields: dict[str, str]) -> dict[str, Any]:
    """The typed view of an event's stream fields: the task JSON's names (``task_id``,
    ``lease_id``, ``host_id``, ``device_id``), integers for numeric fields and None for empty
    ones (the scripts write ``""`` for "none"). A numeric field that does not parse stays
    a string (never an error: the stream is read, not validated)."""
    out: dict[str, Any] = {}
    for k, v in fields.items():
        name = RENAMED.get(k, k)
        if v == "":
            out[name] = None
        elif k in INT_FIELDS:
            try:
                out[name] = int(v)
            except ValueError:
                try:
                    out[name] = int(float(v))
                except ValueError:
                    out[name] = v
        else:
            out[name] = v
    return out


@dataclass(frozen=True)
class Event:
    """One transition: its stream id, type and fields (task, lease, host, device, ...).

    ``fields`` is the stream entry as the Lua scripts wrote it (every value a string, ``""``
    for none); ``data`` and ``as_dict()`` are the typed model every printed or returned
    event uses: ``task_id``/``lease_id``/``host_id``/``device_id`` as in the task JSON,
    integers for ``attempt``, ``epoch``, ``queued_ms``..., None for empty fields."""

    id: str
    type: str
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def task(self) -> str | None:
        return self.fields.get("task") or None

    @property
    def ms(self) -> int:
        return int(self.id.split("-")[0])

    @property
    def data(self) -> dict[str, Any]:
        """The typed fields (see `typed_fields`)."""
        return typed_fields(self.fields)

    @property
    def task_id(self) -> str | None:
        return self.task

    @property
    def attempt(self) -> int | None:
        value = self.data.get("attempt")
        return value if isinstance(value, int) else None

    @property
    def failure_kind(self) -> str | None:
        return self.fields.get("failure_kind") or None

    def as_dict(self) -> dict[str, Any]:
        """The event as JSON: ``id``, ``type``, ``time_ms`` (ms since epoch, from the id)
        and the typed fields."""
        return {"id": self.id, "type": self.type, "time_ms": self.ms, **self.data}


def last_event_id(r: redis.Redis, keys: Keys) -> str:
    """The id of the newest event, or ``0-0`` for an empty stream."""
    newest = r.xrevrange(keys.events, count=1)
    return str(newest[0][0]) if newest else "0-0"


def read_events(
    r: redis.Redis, keys: Keys, cursor: str, *, block_ms: int | None, count: int = READ_COUNT
) -> tuple[str, list[Event]]:
    """Events after ``cursor`` (at most ``count``), blocking up to ``block_ms`` when there are
    none. Returns the new cursor and the events."""
    resp: Any = r.xread({keys.events: cursor}, count=count, block=block_ms)
    if not resp:
        return cursor, []
    entries = resp[0][1]
    out = []
    for eid, fields in entries:
        data = dict(fields)
        out.append(Event(id=eid, type=data.pop("type", "?"), fields=data))
    return str(entries[-1][0]), out
