"""A small ASGI app serving the host protocol routes for the end-to-end tests of
``tests/test_api_host.py`` (the API's own app mounts the same routes): ``python -m uvicorn
--factory api_host_app:make_app``, with the pool's Redis in ``DQ_API_REDIS_URL`` and its name
in ``DQ_API_POOL``."""

from __future__ import annotations

import os

import redis
from starlette.applications import Starlette
from starlette.routing import Mount

from deviceq.api.context import MAX_WAIT, ApiContext
from deviceq.api.host_routes import host_routes


def make_app() -> Starlette:
    # a blocking read (a long poll) must not outlast the socket timeout
    r = redis.Redis.from_url(
        os.environ["DQ_API_REDIS_URL"], decode_responses=True, socket_timeout=MAX_WAIT + 5
    )
    ctx = ApiContext(r, os.environ["DQ_API_POOL"], max_body=64 * 1024)
    return Starlette(routes=[Mount("/api/v1", routes=host_routes(ctx))])
