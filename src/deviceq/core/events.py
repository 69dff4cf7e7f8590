"""Reading the pool's event stream (``dq:{POOL}:events``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis

from .keys import Keys

READ_COUNT = 1000


@dataclass(frozen=True)
class Event:
    """One transition: its stream id, type and fields (task, lease, host, device, ...)."""

    id: str
    type: str
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def task(self) -> str | None:
        return self.fields.get("task")

    @property
    def ms(self) -> int:
        return int(self.id.split("-")[0])

    def as_dict(self) -> dict[str, str]:
        return {"id": self.id, "type": self.type, **self.fields}


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
