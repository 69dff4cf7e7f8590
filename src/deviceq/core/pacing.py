"""`Pacer`: sizes the chunks of a batched script call by time, not by a fixed count, for the
scripts whose callers split the work (``report.lua``, ``assign.lua``): each call's duration,
measured by the caller, sets the next chunk's size toward ``target_ms`` per call, so that no
call holds Redis for long whatever the batch (a Lua script blocks every other client while it
runs). (``submit.lua`` is all or nothing per call: `Client.submit_many` sizes each call before
sending it, by the tasks' declared cost, `deviceq.core.bounds`, paced in declared microseconds:
`deviceq.producer.submission.submit_pacer`.)

The measured time is the caller's wall time of the call (the round trip and the client's own
encoding included), so it over-states the Redis time: the chunks it settles on are, if
anything, too small. A chunk grows by at most 2x a call; after a call over the target it
shrinks to what the last three calls measured, their median time an item (one call slowed by
a stall elsewhere on the machine shrinks nothing; the first two calls go by their own time if
they were full; a call within the target shrinks nothing: a small call's time is mostly the
round trip); it stays within ``least`` and the caller's most per call."""

from __future__ import annotations

import threading
import time
from collections import deque
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
        self._rates: deque[float] = deque(maxlen=3)  # ms an item, of the last calls
        self._lock = threading.Lock()

    def next_size(self, remaining: int, most: int) -> int:
        """How many of ``remaining`` items the next call takes (at most ``most``)."""
        return max(1, min(remaining, most, max(self.size, min(self.least, most))))

    def record(self, items: int, seconds: float, full: bool | None = None) -> None:
        """A call of ``items`` items took ``seconds``: size the next one toward the target.
        ``full``: did the call carry all the size allowed (default: at least 3/4 of it; a
        caller whose items differ in size says it, as one whose next item did not fit)."""
        if items < 1:
            return
        ms = max(seconds * 1000.0, 1e-3)
        ideal = int(items * self.target_ms / ms)
        with self._lock:
            self._rates.append(ms / items)
            is_full = full if full is not None else 4 * items >= 3 * self.size
            if ms > self.target_ms:
                # too long: shrink to what the last three calls measured, their median (one
                # call slowed by a stall elsewhere on the machine shrinks nothing); until
                # there are three, by a full call's own time (a short one, a lone task whose
                # call loaded the script, proves little)
                rates = sorted(self._rates)
                typical = rates[1] if len(rates) == 3 else ms / items if is_full else None
                if typical is not None:
                    self.size = max(self.least, min(self.size, int(self.target_ms / typical)))
            elif is_full:
                # grow only past a full call (a short last chunk, or one the caller capped,
                # proves nothing bigger), by at most 2x a call
                self.size = max(self.size, min(ideal, 2 * max(items, self.size)))

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
