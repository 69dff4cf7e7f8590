"""The HTTP service's guard: request size limit, bearer tokens, and a rate limit on failed
authentications per client address. A pure ASGI middleware in front of every route."""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import anyio.to_thread
import redis
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .tokens import TokenInfo

API_PREFIX = "/api/v1"
OPEN_PATHS = frozenset({f"{API_PREFIX}/openapi.json"})
"""Paths served without a token."""
HOST_PREFIX = f"{API_PREFIX}/hosts"
"""The host protocol: its routes check the host's own token themselves."""

MAX_AUTH_FAILURES = 10
AUTH_WINDOW = 60.0
MAX_TRACKED_ADDRESSES = 10_000


@dataclass
class _Window:
    start: float
    failures: int


class FailureLimiter:
    """At most ``limit`` failed authentications per client address per ``window`` seconds
    (a fixed window per address): one lock makes the check and the count one step, so
    concurrent bad requests cannot slip past the limit. Memory is bounded: at most
    ``max_addresses`` windows. When the table is full, an ended window goes first, then the
    oldest address still under its limit; an address at its limit is dropped only when every
    tracked one is (so pushing a locked-out address out of the table takes ``max_addresses``
    other locked-out ones, ``limit`` failures each, not one failure from each of
    ``max_addresses`` new addresses)."""

    def __init__(
        self,
        limit: int = MAX_AUTH_FAILURES,
        window: float = AUTH_WINDOW,
        max_addresses: int = MAX_TRACKED_ADDRESSES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.window = window
        self.max_addresses = max_addresses
        self.clock = clock
        self._lock = threading.Lock()
        # windows under the limit (oldest start first) and at it (in the order they got
        # there): an ended window not at a table's head is dropped when next looked up
        self._counting: OrderedDict[str, _Window] = OrderedDict()
        self._limited: OrderedDict[str, _Window] = OrderedDict()

    def tracked(self) -> int:
        """Addresses in the table now."""
        return len(self._counting) + len(self._limited)

    def _current(self, addr: str, now: float) -> _Window | None:
        for table in (self._limited, self._counting):
            w = table.get(addr)
            if w is not None:
                if now - w.start >= self.window:
                    del table[addr]
                    return None
                return w
        return None

    def _make_room(self, now: float) -> None:
        for table in (self._counting, self._limited):  # ended windows first
            while table and now - next(iter(table.values())).start >= self.window:
                table.popitem(last=False)
        while self.tracked() >= self.max_addresses:
            (self._counting or self._limited).popitem(last=False)

    def blocked_for(self, addr: str) -> float:
        """Seconds until ``addr`` may try again (0: it may now)."""
        with self._lock:
            now = self.clock()
            w = self._current(addr, now)
            if w is None or w.failures < self.limit:
                return 0.0
            return max(0.0, w.start + self.window - now)

    def judge(self, addr: str, ok: bool) -> float:
        """Record one authentication of ``addr``: 0 if it may be answered (a success, or a
        failure within the limit, now counted), else the seconds to wait (a blocked address
        is refused even with a good token: no oracle for guesses)."""
        with self._lock:
            now = self.clock()
            w = self._current(addr, now)
            if w is not None and w.failures >= self.limit:
                return max(0.001, w.start + self.window - now)
            if ok:
                return 0.0
            if w is None:
                self._make_room(now)
                w = self._counting[addr] = _Window(now, 0)
            w.failures += 1
            if w.failures >= self.limit:
                del self._counting[addr]
                self._limited[addr] = w
            return 0.0


def bearer(scope: Scope) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header, or None."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


async def send_error(
    send: Send, status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> None:
    """An error answer in the API's one JSON shape (as `deviceq.api.errors.error`)."""
    body = json.dumps({"error": {"code": code, "message": message}}, separators=(",", ":")).encode()
    extra = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Guard:
    """In front of the app: refuses a body over ``max_body`` bytes (413, by Content-Length
    and while reading), then, except for `OPEN_PATHS`, requires a current API token, or on
    the host protocol (``/api/v1/hosts/HOST/...``) that host's own token (``host_auth``; the
    routes and scripts check it again): 401, and 429 with Retry-After past the failure limit,
    one limit per address for both kinds. The token's `TokenInfo` is left in
    ``scope["state"]["api_token"]`` for the routes."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        lookup: Callable[[str], TokenInfo | None],
        max_body: int,
        limiter: FailureLimiter,
        host_auth: Callable[[str, str], bool] | None = None,
    ) -> None:
        self.app = app
        self.lookup = lookup
        self.max_body = max_body
        self.limiter = limiter
        self.host_auth = host_auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _declared_length(scope) > self.max_body:
            await send_error(send, 413, "TOO_LARGE", f"request body over {self.max_body} bytes")
            return
        body = await _read_body(receive, self.max_body)
        if body is None:
            await send_error(send, 413, "TOO_LARGE", f"request body over {self.max_body} bytes")
            return
        replay = _replaying(body, receive)
        path: str = scope.get("path", "")
        if path in OPEN_PATHS:
            await self.app(scope, replay, send)
            return
        addr = (scope.get("client") or ("?", 0))[0]
        if path == HOST_PREFIX or path.startswith(HOST_PREFIX + "/"):
            await self._host_call(scope, replay, send, addr)
            return
        if wait := self.limiter.blocked_for(addr):
            await _too_many(send, wait)
            return
        token = bearer(scope)
        try:
            info = await anyio.to_thread.run_sync(partial(self.lookup, token)) if token else None
        except redis.RedisError as exc:
            await _unavailable(send, exc)
            return
        if wait := self.limiter.judge(addr, info is not None):
            await _too_many(send, wait)
            return
        if info is None:
            why = "a wrong API token" if token else "no API token (Authorization: Bearer TOKEN)"
            await send_error(send, 401, "AUTH", f"unauthenticated: {why}",
                             {"www-authenticate": "Bearer"})  # fmt: skip
            return
        scope.setdefault("state", {})["api_token"] = info
        await self.app(scope, replay, send)

    async def _host_call(self, scope: Scope, receive: Receive, send: Send, addr: str) -> None:
        """A host protocol call: the host's token is judged here, counted toward the same
        per-address limit as the API tokens' (checked and counted under one lock, so
        concurrent guesses cannot race past it); the route then acts as that host only."""
        if self.host_auth is None:
            await self.app(scope, receive, send)
            return
        if wait := self.limiter.blocked_for(addr):
            await _too_many(send, wait)
            return
        host_id = scope.get("path", "")[len(HOST_PREFIX) + 1 :].split("/", 1)[0]
        token = bearer(scope)
        try:
            ok = bool(token and host_id) and await anyio.to_thread.run_sync(
                partial(self.host_auth, host_id, token or "")
            )
        except redis.RedisError as exc:
            await _unavailable(send, exc)
            return
        if wait := self.limiter.judge(addr, ok):
            await _too_many(send, wait)
            return
        await self.app(scope, receive, send)  # (a refusal is the route's: its 401 and why)


async def _unavailable(send: Send, exc: redis.RedisError) -> None:
    """The pool's Redis failed while a token was checked: 503 when unreachable (clients
    retry), else 500; one line, nothing of the request in it."""
    if isinstance(exc, redis.ConnectionError | redis.TimeoutError):
        await send_error(send, 503, "UNAVAILABLE", "the pool's Redis is unreachable: try again")
    else:
        await send_error(send, 500, "INTERNAL", "internal error")


async def _too_many(send: Send, wait: float) -> None:
    secs = max(1, int(wait + 0.999))
    await send_error(send, 429, "RATE_LIMITED",
                     f"too many failed authentications from this address: retry in {secs}s",
                     {"retry-after": str(secs)})  # fmt: skip


def _declared_length(scope: Scope) -> int:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 1 << 62  # not a number: refused as too large
    return 0


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or None once it grows past ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replaying(body: bytes, receive: Receive) -> Receive:
    """A receive that hands the app the body already read, then the real messages
    (a disconnect, which long polls and event streams watch for)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
