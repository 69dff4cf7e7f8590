"""One host protocol call as the routes see it (`Call`: the host of the path, its token and
session, the body), and the readers of a request's parts: its bearer token, session header,
size-bounded JSON body and typed body fields; `host_token_ok`, the guard's check of a host's
token. The routes themselves are in `deviceq.api.host_routes`."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from ..core import json_bounded
from ..core.errors import AuthError, DeviceqError, InvalidInput, SessionSuperseded
from ..core.validation import validate_id
from ..host.redis_link import HostClient, token_digest
from .context import ApiContext

LOG = logging.getLogger("deviceq.api")

SESSION_HEADER = "X-Deviceq-Session"
MAX_ITEMS = 1000  # devices of a heartbeat, leases of a renewal, reports of a call, at most
CTL_MAX = 16  # control messages kept per host (lua/lib/notify.lua ``ctl``): one poll drains them
SESSION_MODES = ("start", "dead", "takeover")
MAX_TOKEN = 256  # the longest token the scripts accept


@dataclass
class Call:
    """One authenticated-to-be host call: the host of the path, the request's token and
    session, its JSON body (``{}`` for a GET) and the other path parameters."""

    ctx: ApiContext
    host_id: str
    token: str
    session: str
    body: dict[str, Any]
    params: dict[str, str]

    def client(self) -> HostClient:
        """The host's client on the pool's Redis: the scripts authenticate each call."""
        return HostClient(self.ctx.redis, self.ctx.pool, self.host_id, self.token, self.session)

    def authenticate(self, *, session: bool) -> None:
        """For a call that runs no script: the token must be this host's (compared with the
        stored digest in constant time) and, with ``session``, the request's session the
        host's current one (as the scripts require). AuthError / SessionSuperseded."""
        digest, current = self.ctx.redis.hmget(
            self.ctx.keys.host(self.host_id), "token_digest", "session"
        )
        if not digest:
            raise AuthError(f"unknown host {self.host_id}: not registered in this pool (removed?)")
        if not hmac.compare_digest(str(digest), token_digest(self.token)):
            raise AuthError(f"wrong token for host {self.host_id} (rotated?)")
        if session and str(current or "") != self.session:
            if not self.session:
                raise SessionSuperseded(
                    f"host {self.host_id} has a daemon session; this call carries none"
                )
            raise SessionSuperseded(
                f"session {self.session} of host {self.host_id} was superseded by a newer "
                "daemon (takeover, restart or token rotation)"
            )

    def block_seconds(self, name: str) -> float:
        """A long poll's ``name`` seconds from the body, bounded by the service's
        ``max_wait`` and kept below the Redis socket timeout (a blocking read must not
        outlast it)."""
        wanted = _number(self.body, name, 0.0, 0.0, 3600.0)
        limit = self.ctx.max_wait
        sock = self.ctx.blocker.connection_pool.connection_kwargs.get("socket_timeout")
        if sock:
            limit = min(limit, max(0.0, float(sock) - 1.0))
        return min(wanted, limit)

    def blpop(self, key: str, seconds: float) -> str | None:
        """Pop the head of one of this host's lists, blocking up to ``seconds`` (0: no wait)
        on the service's blocking client, within the host's bound of blocking calls
        (TooManyWaits past it)."""
        if seconds <= 0:
            got = self.ctx.redis.lpop(key)
            return None if got is None else str(got)
        with self.ctx.long_polls.hold("host", self.host_id):
            popped = self.ctx.blocker.blpop([key], timeout=seconds)
        return str(popped[1]) if popped else None


Handler = Callable[[Call], dict[str, Any]]


# -- request parsing ------------------------------------------------------------------------
def _bearer(request: Request) -> str:
    """The token of ``Authorization: Bearer TOKEN`` (never echoed in an error)."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise AuthError("missing host token: send Authorization: Bearer TOKEN")
    if len(token) > MAX_TOKEN or not token.isascii() or not token.isprintable():
        raise AuthError("malformed host token")
    return token


def _session(request: Request) -> str:
    raw = request.headers.get(SESSION_HEADER, "").strip()
    return validate_id(raw, "session id") if raw else ""


class TooLarge(DeviceqError):
    code = "TOO_LARGE"


async def _json_body(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object (``{}`` for an empty body): INVALID when it is not a JSON
    object, TOO_LARGE past ``limit`` bytes (read no further)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"request body over {limit} bytes")
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > limit:
            raise TooLarge(f"request body over {limit} bytes")
    if not data.strip():
        return {}
    body = json_bounded.loads(bytes(data), "request body")
    if not isinstance(body, dict):
        raise InvalidInput("request body must be a JSON object")
    return body


def _number(body: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    v = body.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
        raise InvalidInput(f"{name} must be a number from {lo:g} to {hi:g}")
    return float(v)


def _int(body: dict[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    v = body.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise InvalidInput(f"{name} must be an integer from {lo} to {hi}")
    return v


def _str(body: dict[str, Any], name: str, default: str | None = None) -> str:
    v = body.get(name, default)
    if not isinstance(v, str):
        raise InvalidInput(
            f"{name} must be a string" + ("" if default is not None else " (required)")
        )
    return v


def _bool(body: dict[str, Any], name: str, default: bool | None = None) -> bool:
    v = body.get(name, default)
    if not isinstance(v, bool):
        raise InvalidInput(f"{name} must be true or false")
    return v


def _items(body: dict[str, Any], name: str) -> list[Any]:
    v = body.get(name)
    if not isinstance(v, list) or len(v) > MAX_ITEMS:
        raise InvalidInput(f"{name} must be a list of at most {MAX_ITEMS} items")
    return v


def _objects(body: dict[str, Any], name: str) -> list[dict[str, Any]]:
    items = _items(body, name)
    if not all(isinstance(x, dict) for x in items):
        raise InvalidInput(f"each item of {name} must be a JSON object")
    return items


def host_token_ok(ctx: ApiContext, host_id: str, token: str) -> bool:
    """True when ``token`` is host ``host_id``'s (its stored digest, compared in constant
    time); False for a malformed id, an unknown host or another token."""
    try:
        validate_id(host_id, "host id")
    except InvalidInput:
        return False
    digest = ctx.redis.hget(ctx.keys.host(host_id), "token_digest")
    return bool(digest) and hmac.compare_digest(str(digest), token_digest(token))
