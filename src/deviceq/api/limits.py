"""Bounds on the service's blocking calls (a host's long polls, a producer's task wait, event
and log streams): each holds a Redis connection of its own while Redis blocks, so one host or
one token could otherwise take every connection and thread and leave the others 503.

`LongPolls` counts the blocking calls held at once per host, per API token and in all; one
past a bound is refused at once (429 ``RATE_LIMITED`` with Retry-After), never queued. The
service runs them on a Redis client of their own (`ApiContext.blocker`), whose connection
pool is sized to the total bound, so short calls always find a connection."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from ..core.errors import DeviceqError

PER_HOST = 8
"""Blocking calls one host holds at once (its daemon makes 2: the inbox and control waits;
a restarted daemon's old ones last until their timeout)."""
PER_TOKEN = 32
"""Blocking calls (task waits, event and log streams) one API token holds at once."""
TOTAL = 512
"""Blocking calls the service holds at once (below its worker threads: short calls always
have one)."""
RETRY_AFTER = 1
"""Seconds a refused blocking call is told to wait."""


class TooManyWaits(DeviceqError):
    """A blocking call over one of `LongPolls`'s bounds: 429 with Retry-After."""

    code = "RATE_LIMITED"
    retry_after = RETRY_AFTER


class LongPolls:
    """Counts of the blocking calls held now, per owner (``host:ID``, ``token:NAME``) and in
    all; one lock makes each check and count one step (threads and the event loop both
    take and give back slots)."""

    def __init__(self, per_host: int = PER_HOST, per_token: int = PER_TOKEN,
                 total: int = TOTAL) -> None:  # fmt: skip
        self.per_host = per_host
        self.per_token = per_token
        self.total = total
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}
        self._all = 0

    def acquire(self, kind: str, owner: str) -> None:
        """Take one slot for ``owner`` (``kind`` is ``host`` or ``token``), or raise
        TooManyWaits naming the bound that was reached."""
        bound = self.per_host if kind == "host" else self.per_token
        key = f"{kind}:{owner}"
        with self._lock:
            held = self._held.get(key, 0)
            if held >= bound:
                what = f"host {owner}" if kind == "host" else f"API token {owner}"
                raise TooManyWaits(
                    f"too many long polls or streams of {what} at once (at most {bound}): "
                    f"retry in {RETRY_AFTER}s"
                )
            if self._all >= self.total:
                raise TooManyWaits(
                    f"the service holds {self.total} long polls and streams at once: "
                    f"retry in {RETRY_AFTER}s"
                )
            self._held[key] = held + 1
            self._all += 1

    def release(self, kind: str, owner: str) -> None:
        key = f"{kind}:{owner}"
        with self._lock:
            held = self._held.get(key, 0)
            if held <= 1:
                self._held.pop(key, None)
            else:
                self._held[key] = held - 1
            if held:
                self._all -= 1

    @contextlib.contextmanager
    def hold(self, kind: str, owner: str) -> Iterator[None]:
        """One slot for the block's duration."""
        self.acquire(kind, owner)
        try:
            yield
        finally:
            self.release(kind, owner)

    def held(self) -> int:
        """Blocking calls held now (all owners)."""
        with self._lock:
            return self._all
