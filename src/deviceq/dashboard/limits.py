"""A limit on dashboard login attempts, shared by every request and every dashboard process
of a pool: at most ``per_addr`` attempts per client address and ``per_user`` per user name in a
window of ``window_s`` seconds, counted in Redis (``lua/login_attempt.lua``).

An attempt is charged *before* its password is checked, in one atomic step that refuses it
(counting nothing) when a counter is at its limit, and refunded when it succeeds; so
concurrent guesses cannot all pass the check before any failure is counted: of 40 guesses
sent at once, ``per_addr`` are checked and the rest are refused at once (HTTP 429,
``Retry-After`` the rest of the window). The address and the name are hashed (sha256) into
the key, so neither needs to be a valid id. Behind a reverse proxy every client has the
proxy's address (no forwarding header is trusted)."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

import redis

from ..core.keys import Keys
from ..core.scripts import Scripts

PER_ADDR = 10
PER_USER = 20
WINDOW_S = 60.0


@dataclass(frozen=True)
class Verdict:
    """``allowed`` False: refused, try again after ``retry_after`` seconds. ``digests``: the
    counters charged (refund them on success)."""

    allowed: bool
    retry_after: int
    digests: tuple[str, ...]


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


class LoginLimiter:
    """Login attempts of one pool's dashboards."""

    def __init__(
        self,
        r: redis.Redis,
        keys: Keys,
        per_addr: int = PER_ADDR,
        per_user: int = PER_USER,
        window_s: float = WINDOW_S,
    ) -> None:
        if not 1 <= per_addr <= 1_000_000 or not 1 <= per_user <= 1_000_000:
            raise ValueError("a login limit is 1 to 1,000,000 attempts")
        if not 0.001 <= window_s <= 86400:
            raise ValueError("the login limit's window is 1 ms to 1 day")
        self.scripts = Scripts(r)
        self.keys = keys
        self.per_addr, self.per_user = per_addr, per_user
        self.window_ms = int(window_s * 1000)

    def charge(self, addr: str, user: str | None) -> Verdict:
        """Count one attempt of ``addr`` (and of ``user``, when a name is given), or refuse
        it when either is at its limit (then nothing is counted)."""
        digests = (_digest(addr),) + ((_digest(user),) if user else ())
        args = ["charge", str(self.window_ms), digests[0], str(self.per_addr)]
        if user:
            args += [digests[1], str(self.per_user)]
        wait_ms = int(self.scripts.run("login_attempt", self.keys.prefix, args))
        return Verdict(wait_ms == 0, math.ceil(wait_ms / 1000), digests if not wait_ms else ())

    def refund(self, verdict: Verdict) -> None:
        """A successful login does not count against its address or name."""
        if verdict.digests:
            self.scripts.run("login_attempt", self.keys.prefix, ["refund", *verdict.digests])
