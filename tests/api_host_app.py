"""The API service (`deviceq.api.app.create_app`) for the end-to-end tests of
``tests/api/test_api_host.py``, with a small body limit: ``python -m uvicorn --factory
api_host_app:make_app``, with the pool's Redis in ``DQ_API_REDIS_URL`` and its name in
``DQ_API_POOL``."""

from __future__ import annotations

import os

import redis
from starlette.applications import Starlette

from deviceq.api.app import create_app
from deviceq.api.auth import FailureLimiter
from deviceq.api.context import MAX_WAIT, ApiContext


def make_app() -> Starlette:
    # a blocking read (a long poll) must not outlast the socket timeout
    r = redis.Redis.from_url(
        os.environ["DQ_API_REDIS_URL"], decode_responses=True, socket_timeout=MAX_WAIT + 5
    )
    ctx = ApiContext(r, os.environ["DQ_API_POOL"], max_body=64 * 1024)
    # the tests try many wrong tokens on purpose: the failure limit far above them
    return create_app(ctx, limiter=FailureLimiter(10_000, 60))
