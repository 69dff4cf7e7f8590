"""Reading an attempt's live log (``log:ID:ATTEMPT``, written by its host through
``lua/log_append.lua``): what ``deviceq task logs`` and the dashboard's task page show."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis

from .errors import InvalidInput, NotFound
from .keys import Keys
from .validation import validate_id
from .vocabulary import LEASED_STATUSES, TERMINAL_STATUSES

ACTIVE = LEASED_STATUSES
PAGE = 1000  # entries read per call
BLOCK_MS = 1000  # a follower's XREAD BLOCK, at most (then it looks at the task again)


@dataclass(frozen=True)
class LogEntry:
    """One chunk of an attempt's output: ``stream`` is stdout, stderr or log."""

    id: str
    time_ms: int
    stream: str
    text: str

    def json(self) -> dict[str, object]:
        return {"time_ms": self.time_ms, "stream": self.stream, "text": self.text}


@dataclass(frozen=True)
class AttemptState:
    """Where a task stands relative to one of its attempts."""

    status: str
    attempt: int  # the task's current attempt

    def ended(self, attempt: int) -> bool:
        """Attempt ``attempt`` ran and is over (or never will run: the task ended first)."""
        if self.attempt > attempt:
            return True
        if self.attempt == attempt:
            return self.status not in ACTIVE
        return self.status in TERMINAL_STATUSES

    def succeeded(self, attempt: int) -> bool:
        return self.attempt == attempt and self.status == "done"


def _entry(raw_id: str, fields: dict[str, str]) -> LogEntry:
    return LogEntry(raw_id, int(raw_id.split("-", 1)[0]), fields.get("s", "log"),
                    fields.get("t", ""))  # fmt: skip


class LogReader:
    """Reads the live logs of one pool's tasks."""

    def __init__(self, r: redis.Redis, keys: Keys) -> None:
        self.r = r
        self.keys = keys

    def state(self, task_id: str) -> AttemptState:
        validate_id(task_id, "task id")
        status, attempt = self.r.hmget(self.keys.task(task_id), "status", "attempt")
        if status is None:
            raise NotFound(f"no task {task_id} in pool {self.keys.pool}")
        return AttemptState(str(status), int(attempt or 0))

    def attempt_for(self, task_id: str, attempt: int | None) -> int:
        """The attempt asked for, else the task's latest (1 before its first starts)."""
        st = self.state(task_id)
        if attempt is None:
            return max(1, st.attempt)
        if attempt < 1:
            raise InvalidInput("--attempt must be 1 or more")
        return attempt

    def read(self, task_id: str, attempt: int, after: str = "0-0", count: int = PAGE
             ) -> list[LogEntry]:  # fmt: skip
        """Entries after stream id ``after``, oldest first, at most ``count``."""
        key = self.keys.log(validate_id(task_id, "task id"), attempt)
        rows: Any = self.r.xrange(key, min=f"({after}" if after != "0-0" else "-", count=count)
        return [_entry(str(i), {str(a): str(b) for a, b in (f or {}).items()}) for i, f in rows]

    def all(self, task_id: str, attempt: int) -> Iterator[LogEntry]:
        """Every entry of the attempt's log, in pages."""
        after = "0-0"
        while True:
            page = self.read(task_id, attempt, after)
            yield from page
            if len(page) < PAGE:
                return
            after = page[-1].id

    def next(self, task_id: str, attempt: int, after: str, block_ms: int | None
             ) -> list[LogEntry]:  # fmt: skip
        """Entries after ``after``; when there are none yet, block up to ``block_ms`` for
        them (None: do not block)."""
        page = self.read(task_id, attempt, after)
        if page or block_ms is None:
            return page
        self.r.xread({self.keys.log(task_id, attempt): after}, count=1, block=max(1, block_ms))
        return self.read(task_id, attempt, after)

    def follow(self, task_id: str, attempt: int, timeout: float | None = None
               ) -> Iterator[LogEntry]:  # fmt: skip
        """Every entry, then the new ones as they come (XREAD BLOCK), until the attempt
        ends; raises TimeoutError after ``timeout`` seconds."""
        key = self.keys.log(validate_id(task_id, "task id"), attempt)
        deadline = None if timeout is None else time.monotonic() + timeout
        after = "0-0"
        while True:
            ended = self.state(task_id).ended(attempt)  # before the read: nothing is missed
            page = self.read(task_id, attempt, after)
            if page:
                yield from page
                after = page[-1].id
                continue
            if ended:
                return
            left = BLOCK_MS / 1000 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"attempt {attempt} of task {task_id} is still running")
            self.r.xread(
                {key: after}, count=1, block=max(1, int(min(left, BLOCK_MS / 1000) * 1000))
            )
