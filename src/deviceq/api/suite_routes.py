"""The suite routes of the producer protocol (``/api/v1/suites``): submit a suite, list,
show, wait for and cancel suites, with an API token (`deviceq.suites`)."""

from __future__ import annotations

from functools import partial
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ..core import json_bounded
from ..core.errors import AuthError, InvalidInput
from ..core.validation import validate_id
from ..producer.client import Client
from ..suites.model import MAX_TESTS, check_test_id
from ..suites.submission import plan, submit
from .context import ApiContext
from .tokens import ROLES, TokenInfo

FIELDS = frozenset({
    "name", "tests", "goal", "command", "driver_type", "tags", "shards", "max_devices",
    "deadline", "each_device", "include_joining", "retry_failed", "priority", "tenant", "timeout",
    "max_attempts", "junit",
})  # fmt: skip
"""What a ``POST /suites`` body may hold."""
LIST_MAX = 1000


def _role(request: Request) -> TokenInfo:
    info = request.scope.get("state", {}).get("api_token")
    if not isinstance(info, TokenInfo):
        raise AuthError("unauthenticated")
    if info.role not in ROLES:
        raise AuthError(f"a {info.role} token may not do this")
    return info


def _tests(value: Any) -> list[str]:
    if not isinstance(value, list) or not value or len(value) > MAX_TESTS:
        raise InvalidInput(f"tests must be a list of 1 to {MAX_TESTS} test ids")
    out = [check_test_id(t) if isinstance(t, str) else "" for t in value]
    if "" in out:
        raise InvalidInput("every test id must be a string")
    if len(set(out)) != len(out):
        raise InvalidInput("a test id is listed twice")
    return out


class SuiteApi:
    """The suite routes of one pool (``ctx``)."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.client = Client(ctx.redis, ctx.pool)
        self.client.priority_warnings = False
        self.waiter = Client(ctx.blocker, ctx.pool)

    async def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await anyio.to_thread.run_sync(partial(fn, *args, **kwargs))

    async def submit(self, request: Request) -> Response:
        """Submit a suite: its tests sharded over the matching devices.

        The body is a JSON object: ``name``, ``tests`` (a list of test ids), ``goal`` or
        ``command`` (a template, ``{tests}`` where a shard's tests go; the run also finds them
        in ``$DEVICEQ_TESTS_FILE``), ``driver_type``, ``tags``, one of ``shards``,
        ``deadline`` (seconds, with ``max_devices``) or ``each_device`` (with
        ``include_joining``: seconds during which registering devices join), and
        ``retry_failed``, ``priority``, ``tenant``, ``timeout``, ``max_attempts``, ``junit``.
        Answers 201 ``{"id", "shards": [{"task_id", "tests"}], "eta_s"}``; a deadline that
        cannot be met is 400 ``unsatisfiable: needs N devices, M match``, nothing submitted."""
        _role(request)
        body = json_bounded.loads(await request.body() or b"null", "the request body")
        if not isinstance(body, dict) or set(body) - FIELDS or "name" not in body:
            raise InvalidInput(
                "the request body must be a JSON object with name, tests and a template; "
                f"fields: {', '.join(sorted(FIELDS))}"
            )
        options = {k: v for k, v in body.items() if k not in ("name", "tests")}
        name = body["name"]
        if not isinstance(name, str):
            raise InvalidInput("name must be a string")
        p = await self.call(plan, self.client, name, _tests(body.get("tests")), **options)
        ids = await self.call(submit, self.client, self.client, p)
        return JSONResponse(
            {
                "id": p.suite_id,
                "shards": [{"task_id": t, "tests": s} for t, s in zip(ids, p.shards, strict=True)],
                "eta_s": None if p.eta_s is None else round(p.eta_s, 1),
            },
            status_code=201,
        )

    async def list(self, request: Request) -> Response:
        """The newest suites (``limit``, default 50, at most 1000): ``{"suites": [...]}``."""
        _role(request)
        text = request.query_params.get("limit", "50")
        if not text.isdigit() or not 1 <= int(text) <= LIST_MAX:
            raise InvalidInput(f"limit must be an integer from 1 to {LIST_MAX}")
        return JSONResponse({"suites": await self.call(self.client.suites, int(text))})

    async def get(self, request: Request) -> Response:
        """One suite: the JSON of ``deviceq suite show --json``."""
        _role(request)
        suite_id = validate_id(request.path_params["suite_id"], "suite id")
        return JSONResponse((await self.call(self.client.suite, suite_id)).to_dict())

    async def cancel(self, request: Request) -> Response:
        """Cancel a suite and every shard's task: ``{"id", "tasks": {TASK: ANSWER}}``."""
        token = _role(request)
        suite_id = validate_id(request.path_params["suite_id"], "suite id")
        answers = await self.call(self.client.cancel_suite, suite_id, token.name)
        return JSONResponse({"id": suite_id, "tasks": answers})

    async def wait(self, request: Request) -> Response:
        """Wait for a suite to end (a long poll).

        ``timeout`` seconds (default and at most the service's ``max_wait``). Answers
        ``{"suite": SUITE, "terminal": bool}``."""
        token = _role(request)
        suite_id = validate_id(request.path_params["suite_id"], "suite id")
        text = request.query_params.get("timeout")
        timeout = self.ctx.max_wait
        if text is not None:
            try:
                timeout = min(float(text), self.ctx.max_wait)
            except ValueError:
                raise InvalidInput("timeout must be a number of seconds") from None
            if not timeout > 0:
                raise InvalidInput("timeout must be > 0 seconds")
        try:
            with self.ctx.long_polls.hold("token", token.name):
                s = await self.call(self.waiter.wait_suite, suite_id, timeout)
        except TimeoutError:
            s = await self.call(self.client.suite, suite_id)
        return JSONResponse({"suite": s.to_dict(), "terminal": s.terminal})


def suite_routes(ctx: ApiContext) -> list[BaseRoute]:
    """The suite routes, relative to ``/api/v1``."""
    api = SuiteApi(ctx)
    return [
        Route("/suites", api.submit, methods=["POST"]),
        Route("/suites", api.list, methods=["GET"]),
        Route("/suites/{suite_id}", api.get, methods=["GET"]),
        Route("/suites/{suite_id}/cancel", api.cancel, methods=["POST"]),
        Route("/suites/{suite_id}/wait", api.wait, methods=["GET"]),
    ]
