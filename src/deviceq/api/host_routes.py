"""The host protocol over HTTP (session, heartbeat, claim, renew, report, control messages):
each call carries the host's own token (``Authorization: Bearer``) and acts as that host and
no other (the Lua scripts check the token's digest)."""

from __future__ import annotations

from starlette.routing import BaseRoute

from .context import ApiContext


def host_routes(ctx: ApiContext) -> list[BaseRoute]:
    """The routes of the host protocol, relative to ``/api/v1``."""
    return []
