"""The ASGI app of ``deviceq api``: the producer and host protocols under ``/api/v1``, their
OpenAPI description at ``GET /api/v1/openapi.json``, and the `Guard` in front of them."""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import anyio.to_thread
import redis
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from ..core import VERSION
from ..core.errors import DeviceqError
from .auth import API_PREFIX, HOST_PREFIX, OPEN_PATHS, FailureLimiter, Guard
from .context import ApiContext
from .errors import error, from_exception
from .host_call import host_token_ok
from .host_routes import host_routes
from .producer_routes import producer_routes
from .suite_routes import suite_routes
from .tokens import TokenStore

log = logging.getLogger("deviceq.api")

WORKER_THREADS = 512  # requests served at once (long polls included): about 250 hosts
SHORT_CALL_THREADS = 128  # threads kept for the short calls beyond the most long polls held
HTTP_CODES = {400: "INVALID", 401: "AUTH", 403: "FORBIDDEN", 404: "NOT_FOUND", 413: "TOO_LARGE"}


def worker_threads(long_polls: int) -> int:
    """Threads the service runs its Redis calls on, ``long_polls`` of them at most blocked:
    its main Redis client needs as many connections (one per thread), so that a burst of
    short calls never finds its pool exhausted."""
    return max(WORKER_THREADS, long_polls + SHORT_CALL_THREADS)


def _operations(routes: list[BaseRoute], prefix: str) -> list[tuple[str, str, Any]]:
    """(method, full path, endpoint) of every route, mounts included."""
    out: list[tuple[str, str, Any]] = []
    for route in routes:
        if isinstance(route, Mount):
            out += _operations(list(route.routes), prefix + route.path)
        elif isinstance(route, Route):
            for method in sorted((route.methods or {"GET"}) - {"HEAD"}):
                path = re.sub(r"\{(\w+):\w+\}", r"{\1}", prefix + route.path)  # {name:path}
                out.append((method.lower(), path, route.endpoint))
    return out


def openapi(routes: list[BaseRoute]) -> dict[str, Any]:
    """The OpenAPI 3.1 description of ``routes``: one operation per route and method, its
    summary and description from the endpoint's docstring, its path parameters, and the
    token it needs (an API token; a host's token for ``/api/v1/hosts/...``)."""
    paths: dict[str, dict[str, Any]] = {}
    for method, path, endpoint in _operations(routes, ""):
        doc = inspect.cleandoc(endpoint.__doc__ or "")
        summary, _, description = doc.partition("\n")
        host = path == HOST_PREFIX or path.startswith(HOST_PREFIX + "/")
        params = [
            {"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
            for p in _path_params(path)
        ]
        op: dict[str, Any] = {
            "operationId": f"{method}_{path}".replace("/", "_").replace("{", "").replace("}", ""),
            "summary": summary.strip(),
            "description": description.strip(),
            "security": [] if path in OPEN_PATHS else [{"hostToken" if host else "apiToken": []}],
            "responses": {
                "200": {"description": "success (201 for a creation)"},
                "default": {
                    "description": "an error",
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Error"}}
                    },
                },
            },
        }
        if params:
            op["parameters"] = params
        if method == "post":
            op["requestBody"] = {"content": {"application/json": {"schema": {"type": "object"}}}}
        paths.setdefault(path, {})[method] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "deviceq", "version": _version()},
        "paths": paths,
        "components": {
            "securitySchemes": {
                "apiToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "an API token (deviceq api token add)",
                },
                "hostToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "the host's own token (deviceq host add)",
                },
            },  # fmt: skip
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": {
                        "error": {
                            "type": "object",
                            "properties": {
                                "code": {"type": "string"},
                                "message": {"type": "string"},
                            },
                        }
                    },
                }
            },
        },
    }


def _path_params(path: str) -> list[str]:
    return [part[1:-1].split(":")[0] for part in path.split("/") if part.startswith("{")]


def _version() -> str:
    return VERSION


async def _on_deviceq_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, DeviceqError)
    return from_exception(exc)


async def _on_redis_error(request: Request, exc: Exception) -> Response:
    log.warning("redis error on %s %s: %s", request.method, request.url.path, type(exc).__name__)
    return error("UNAVAILABLE", "the pool's Redis is unavailable; try again")


async def _on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = HTTP_CODES.get(exc.status_code, "INVALID")
    return error(code, str(exc.detail), exc.status_code)


async def _on_crash(request: Request, exc: Exception) -> Response:
    log.error("internal error on %s %s: %s", request.method, request.url.path, type(exc).__name__)
    return error("INTERNAL", "internal error", 500)


def _prefixed(route: BaseRoute) -> BaseRoute:
    assert isinstance(route, Route)
    return Route(API_PREFIX + route.path, route.endpoint, methods=route.methods,
                 name=route.name)  # fmt: skip


def create_app(ctx: ApiContext, *, limiter: FailureLimiter | None = None) -> Starlette:
    """The HTTP service of ``ctx``'s pool. ``limiter``: the rate limit of failed
    authentications (default: `FailureLimiter`'s limits)."""

    async def openapi_json(request: Request) -> Response:
        """The OpenAPI description of every route of this service (no token needed)."""
        return JSONResponse(schema)

    # the producer routes at their full paths (a Mount's ``.*`` would not match an id with a
    # newline: such an id is refused by validate_id, 400, not 404); the host routes mounted
    ours = [Route("/openapi.json", openapi_json), *producer_routes(ctx), *suite_routes(ctx)]
    everything: list[BaseRoute] = [_prefixed(r) for r in ours]
    everything.append(Mount(API_PREFIX, routes=host_routes(ctx)))
    schema = openapi(everything)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # every long poll (a host's claim and control waits, a producer's wait) holds one
        # worker thread: anyio's default of 40 would cap a service at about 20 hosts
        # (and the blocking calls, bounded by ctx.long_polls, leave threads to the others)
        limiter = anyio.to_thread.current_default_thread_limiter()
        limiter.total_tokens = worker_threads(ctx.long_polls.total)
        yield

    app = Starlette(
        lifespan=lifespan,
        routes=everything,
        exception_handlers={
            DeviceqError: _on_deviceq_error,
            redis.RedisError: _on_redis_error,
            HTTPException: _on_http_error,
            Exception: _on_crash,
        },
    )
    tokens = TokenStore(ctx.redis, ctx.keys)
    app.add_middleware(
        Guard,
        lookup=tokens.lookup,
        max_body=ctx.max_body,
        limiter=limiter or FailureLimiter(),
        host_auth=partial(host_token_ok, ctx),
    )
    return app
