"""Riding out an unreachable server (Redis, or ``deviceq api`` for a host that talks to it).

`Backoff`: the delays between retries, bounded, jittered and exponential (0.2 s doubling to
10 s by default), reset on success. `Outage`: what a daemon says meanwhile, shared by all of
its loops: one WARNING when the server goes away (``redis unreachable at HOST:PORT: ERROR;
retrying``), at most one a minute while it stays away (how long it has been away), one INFO
when it answers again (``redis reachable again after 12.3 s``); `Outage.pause` waits out a
loop's backoff but ends as soon as any loop got through, so every loop resumes at once.
Nothing said ever holds a password: `endpoint` keeps only the host and port of a URL, and the
secrets given are masked out of every line (a server's error message included)."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

import redis

from .redirects import UNAVAILABLE

T = TypeVar("T")

REMIND_EVERY = 60.0  # seconds between two "still unreachable" lines of one outage
PAUSE_SLICE = 0.1  # how often a pause looks whether it should end early


class Backoff:
    """Delays between retries: ``base``, then doubling up to ``cap``, each spread by
    ``±jitter`` of itself (so that loops and processes that failed together do not retry in
    step) and never above ``cap``. `reset` after a success starts again from ``base``.

    >>> b = Backoff(0.2, 10.0)
    >>> b.next()  # about 0.2, then about 0.4, 0.8, ... 10
    """

    def __init__(self, base: float = 0.2, cap: float = 10.0, jitter: float = 0.25) -> None:
        if not 0 < base <= cap:
            raise ValueError("backoff: need 0 < base <= cap")
        if not 0 <= jitter < 1:
            raise ValueError("backoff: jitter is a fraction in [0, 1)")
        self.base, self.cap, self.jitter = base, cap, jitter
        self._delay = base
        self.failures = 0  # retries since the last reset

    def next(self) -> float:
        """The delay before the next retry (and the one after that doubles, up to ``cap``)."""
        delay = self._delay
        self._delay = min(self.cap, delay * 2)
        self.failures += 1
        spread = delay * self.jitter
        # drawn below the cap, not cut at it: at the cap, half the draws would be the cap
        # itself and the hosts of an outage would retry in lock step
        return random.uniform(delay - spread, min(self.cap, delay + spread))

    def reset(self) -> None:
        self._delay = self.base
        self.failures = 0


def endpoint(url: str) -> str:
    """Where ``url`` points, for messages: ``HOST:PORT`` (the default port filled in for
    ``redis://`` and ``rediss://``), a unix socket's path, a Sentinel URL's sentinels and
    service. The user name, the password, the database and the query are left out."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    scheme = scheme.lower()
    hostpart = rest.rpartition("@")[2]  # (user info ends at the last @, as redact_url says)
    if scheme == "unix":
        return hostpart.partition("?")[0].partition("#")[0] or "unix socket"
    hostpart = hostpart.partition("?")[0].partition("#")[0]
    netloc, _, path = hostpart.partition("/")
    if scheme == "redis+sentinel":
        service = path.partition("/")[0]
        return f"{netloc}/{service}" if service else netloc
    if scheme in ("redis", "rediss") and netloc and ":" not in netloc.rpartition("]")[2]:
        netloc += ":6379"  # (an IPv6 address is bracketed: its colons are not a port's)
    return netloc or "localhost:6379"


def url_secrets(url: str) -> list[str]:
    """The password ``url`` carries (raw and decoded), to mask out of messages."""
    from urllib.parse import unquote

    rest = url.partition("://")[2] or url
    userinfo, at, _ = rest.rpartition("@")
    if not at:
        return []
    user, colon, password = userinfo.partition(":")
    raw = password if colon else user
    return [s for s in {raw, unquote(raw)} if s]


def describe(exc: BaseException) -> str:
    """One line for an error: its message, else its type's name."""
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def how_long(seconds: float) -> str:
    """``12.3 s``, ``4 min 5 s``, ``2 h 3 min``."""
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes = int(seconds // 60)
    if minutes < 120:
        return f"{minutes} min {int(seconds % 60)} s"
    return f"{minutes // 60} h {minutes % 60} min"


class Outage:
    """The reachability of one server as a daemon's loops see it (thread safe). A loop calls
    `failed` when a call met a transient error (`deviceq.core.redirects.UNAVAILABLE`), `ok`
    when one got through, and waits its backoff with `pause`; `call` does all three around
    one call. ``log(level, message)`` writes the daemon's line (its own fields added)."""

    def __init__(
        self,
        where: str,
        log: Callable[[int, str], None],
        *,
        what: str = "redis",
        secrets: Iterable[str] = (),
        remind_every: float = REMIND_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.where = where
        self._log = log
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
        self.remind_every = remind_every
        self._clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None  # when the current outage began (None: reachable)
        self._said = 0.0  # when its last line was written
        self.recoveries = 0  # outages ended so far (a pause ends when this changes)

    @property
    def down(self) -> bool:
        return self._since is not None

    def _say(self, level: int, msg: str) -> None:
        for s in self._secrets:
            msg = msg.replace(s, "***")
        self._log(level, msg)

    def failed(self, exc: BaseException) -> None:
        """A call could not reach the server: the first failure of an outage is said at once,
        then at most one line per ``remind_every`` seconds."""
        now = self._clock()
        with self._lock:
            if self._since is None:
                self._since = self._said = now
                msg = f"{self.what} unreachable at {self.where}: {describe(exc)}; retrying"
            elif now - self._said >= self.remind_every:
                self._said = now
                away = how_long(now - self._since)
                msg = (
                    f"{self.what} still unreachable at {self.where} after {away}: "
                    f"{describe(exc)}; retrying"
                )
            else:
                return
        self._say(logging.WARNING, msg)

    def ok(self, sent: float | None = None) -> None:
        """A call got through: ends the outage (if there was one), in one line. ``sent``
        (this outage's clock): when the call was sent; the answer to a call sent before the
        outage began (a long poll answered as the server went away) proves nothing and ends
        nothing."""
        if self._since is None:  # the common case: no lock taken
            return
        with self._lock:
            if self._since is None or (sent is not None and sent < self._since):
                return
            away = self._clock() - self._since
            self._since = None
            self.recoveries += 1
        self._say(logging.INFO, f"{self.what} reachable again after {how_long(away)}")

    def answers(
        self, fn: Callable[[], list[str]], n: int, transient: tuple[type[BaseException], ...]
    ) -> list[str]:
        """``fn()``'s per-item answers for a best-effort call of ``n`` items; through an
        outage (``transient``) every item is answered ``ok`` (dropped: the caller goes on) and
        the outage is said once, not once per call."""
        try:
            out = fn()
        except transient as exc:
            self.failed(exc)
            return ["ok"] * n
        self.ok()
        return out

    def pause(self, seconds: float, until: Callable[[], bool]) -> None:
        """Sleep ``seconds``, less if ``until()`` becomes true or the outage ends meanwhile
        (another loop got through: retry at once)."""
        seen = self.recoveries
        end = time.monotonic() + seconds
        while not until() and self.recoveries == seen:
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, PAUSE_SLICE))

    def call(
        self,
        fn: Callable[[], T],
        until: Callable[[], bool],
        *,
        backoff: Backoff | None = None,
        never: tuple[type[BaseException], ...] = (),
    ) -> T | None:
        """``fn()``, retried with ``backoff`` while the server is unreachable, until it answers
        or ``until()`` says give up (None then). A refused password is never transient, nor is
        an error of ``never``: raised at once, as is every other error."""
        b = backoff or Backoff()
        fatal: tuple[type[BaseException], ...] = (redis.AuthenticationError, *never)
        while True:
            try:
                result = fn()
            except fatal:
                raise
            except UNAVAILABLE as exc:
                self.failed(exc)
                if until():
                    return None
                self.pause(b.next(), until)
                continue
            self.ok()
            return result
