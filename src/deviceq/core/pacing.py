"""`Pacer`: sizes the chunks of a batched script call by time, not by a fixed count, for the
scripts whose callers split the work (``report.lua``, ``assign.lua``): each call's duration,
measured by the caller, sets the next chunk's size toward ``target_ms`` per call, so that no
call holds Redis for long whatever the batch (a Lua script blocks every other client while it
runs). (``submit.lua`` is all or nothing per call: `Client.submit_many` sizes its calls before
sending them, by the tasks' declared cost, `deviceq.core.bounds`.)

The measured time is the caller's wall time of the call (the round trip and the client's own
encoding included), so it over-states the Redis time: the chunks it settles on are, if
anything, too small. A chunk grows by at most 2x a call and shrinks at once to what the last
call measured; it stays within ``least`` and the caller's most per call."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")

TARGET_MS = 2.5
"""The wall time per call the chunks are sized toward (the Redis time is less)."""


class Pacer:
    """The size of the next chunk, learned from the calls so far (thread-safe: one pacer may
    serve a client shared by threads)."""

    def __init__(self, first: int, target_ms: float = TARGET_MS, least: int = 1) -> None:
        if first < 1 or least < 1 or not target_ms > 0:
            raise ValueError("first and least must be >= 1 and target_ms > 0")
        self.size = max(first, least)
        self.least = least
        self.target_ms = target_ms
        self._lock = threading.Lock()

    def next_size(self, remaining: int, most: int) -> int:
        """How many of ``remaining`` items the next call takes (at most ``most``)."""
        return max(1, min(remaining, most, max(self.size, min(self.least, most))))

    def record(self, items: int, seconds: float) -> None:
        """A call of ``items`` items took ``seconds``: size the next one toward the target."""
        if items < 1:
            return
        ms = max(seconds * 1000.0, 1e-3)
        ideal = int(items * self.target_ms / ms)
        with self._lock:
            # grow only past a full-size call (a short last chunk proves nothing bigger)
            grow = 2 * items if items >= self.size else self.size
            self.size = max(self.least, min(ideal, grow))

    def chunks(self, items: Sequence[T], most: int) -> Iterator[Sequence[T]]:
        """``items`` in consecutive chunks sized as the calls go; the caller times each call
        with `timed` (or `record`) before asking for the next chunk."""
        start = 0
        while start < len(items):
            n = self.next_size(len(items) - start, most)
            yield items[start : start + n]
            start += n

    def timed(self, items: int, call: Callable[[], T]) -> T:
        """Run ``call`` (a script call of ``items`` items) and record how long it took; a
        call that raises records nothing."""
        t = time.perf_counter()
        out = call()
        self.record(items, time.perf_counter() - t)
        return out


_PACERS_LOCK = threading.Lock()


def pacer_for(owner: object, name: str, first: int, least: int = 1) -> Pacer:
    """The pacer of script ``name`` kept on ``owner`` (a client), made on first use: the
    chunk sizes a client learned carry over from one batched call to the next."""
    with _PACERS_LOCK:
        pacers: dict[str, Pacer] = owner.__dict__.setdefault("_pacers", {})
        if name not in pacers:
            pacers[name] = Pacer(first, least=least)
        return pacers[name]
