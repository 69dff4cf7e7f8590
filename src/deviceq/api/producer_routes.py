"""The producer protocol over HTTP: submit, inspect, list, cancel, retry and wait for tasks,
follow the pool's event stream and an attempt's live log (Server-Sent Events), and list and
download an attempt's artifacts. Every route runs the same
`deviceq.producer.Client` call a Python producer would, on the service's own connection."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any
from urllib.parse import quote

import anyio.to_thread
import redis
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from ..artifacts.records import Recorded, recorded, store_for
from ..artifacts.store import CHUNK, StoredFileRefused
from ..core import json_bounded
from ..core.connection import priority_ignored
from ..core.errors import AuthError, DeviceqError, InvalidInput, NotFound
from ..core.events import Event, last_event_id, read_events
from ..core.live_logs import LogEntry, LogReader
from ..core.models import ScheduledTask
from ..core.validation import validate_id
from ..core.vocabulary import TaskStatus
from ..producer.client import Client
from ..producer.task_filter import TaskFilter
from .auth import bearer
from .context import ApiContext
from .tokens import ROLES, TokenInfo, TokenStore


def task_json(t: ScheduledTask) -> dict[str, Any]:
    """A task as the API answers it (what ``deviceq task show --json`` prints)."""
    return t.model_dump(mode="json")


LIST_MAX = 1000
"""Most tasks one ``GET /tasks`` answers."""
BATCH_MAX = 10_000
"""Most tasks one ``POST /tasks/batch`` submits."""
EVENTS_MAX = 10_000
"""Most events one ``GET /events`` stream sends."""
EVENTS_MAX_SECONDS = 300.0
"""Longest one ``GET /events`` stream stays open."""
LOGS_MAX = 10_000
"""Most log chunks one ``GET /tasks/{id}/logs`` stream sends."""
MAX_ATTEMPT = 9999
SSE_BLOCK_MS = 1000
TOKEN_RECHECK_S = 5.0
"""How often an open event or log stream checks that its token is still current (a removed
token's stream then ends with ``event: error``)."""

EVENT_ID_CHARS = frozenset("0123456789-")


def _role(request: Request, allowed: tuple[str, ...] = ROLES) -> TokenInfo:
    info = request.scope.get("state", {}).get("api_token")
    if not isinstance(info, TokenInfo):
        raise AuthError("unauthenticated")
    if info.role not in allowed:
        raise AuthError(f"a {info.role} token may not do this")
    return info


SERVER_SET = ("by", "retry_of")
"""Submit fields the API sets itself: who (the token's name) and the retry link."""


def _signed(task: dict[str, Any], token: TokenInfo) -> dict[str, Any]:
    """A submitted task's fields with ``by``, the token's name (a body may not set it)."""
    if set(task) & set(SERVER_SET):
        raise InvalidInput(
            f"{', '.join(sorted(set(task) & set(SERVER_SET)))}: set by the API, not by a request"
        )
    return {**task, "by": token.name}


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    return json_bounded.loads(raw or b"null", "the request body")


def _query_float(request: Request, name: str, default: float, maximum: float) -> float:
    text = request.query_params.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        raise InvalidInput(f"{name} must be a number of seconds, got {text[:40]!r}") from None
    if not value > 0 or value == float("inf"):
        raise InvalidInput(f"{name} must be > 0 seconds, got {text[:40]!r}")
    return min(value, maximum)


def _query_int(request: Request, name: str, default: int, maximum: int) -> int:
    text = request.query_params.get(name)
    if text is None:
        return default
    if not text.isdigit() or not 1 <= int(text) <= maximum:
        raise InvalidInput(f"{name} must be an integer from 1 to {maximum}, got {text[:40]!r}")
    return int(text)


def _follow(request: Request) -> bool:
    follow = request.query_params.get("follow", "1")
    if follow not in ("0", "1"):
        raise InvalidInput(f"follow must be 0 or 1, got {follow[:40]!r}")
    return follow == "1"


def _since(request: Request) -> str | None:
    """``since`` (else the ``Last-Event-ID`` header): a stream id MS-SEQ, or None."""
    since = request.query_params.get("since") or request.headers.get("last-event-id")
    if since is not None and (
        len(since) > 41 or not set(since) <= EVENT_ID_CHARS or since.count("-") != 1
    ):
        raise InvalidInput(f"bad event id {since[:41]!r} (expected MS-SEQ, e.g. 0-0)")
    return since


class _HeldStream(StreamingResponse):
    """A stream that gives back its slot of the token's blocking calls when it ends, however
    it ends (sent, client gone, error)."""

    def __init__(self, stream: AsyncIterator[str], release: Callable[[], None]) -> None:
        super().__init__(
            stream,
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()


def _log_event(e: LogEntry) -> str:
    return f"id: {e.id}\nevent: log\ndata: {json.dumps(e.json(), sort_keys=True)}\n\n"


def _query_id(request: Request, name: str, what: str) -> str | None:
    value = request.query_params.get(name)
    return None if value is None else validate_id(value, what)


class _TokenWatch:
    """An open stream's check of its own token, at most every `TOKEN_RECHECK_S` seconds."""

    def __init__(self, tokens: TokenStore, request: Request) -> None:
        self.tokens = tokens
        self.token = bearer(request.scope) or ""
        self.checked = time.monotonic()

    async def revoked(self) -> bool:
        """True once the token is no longer current (removed, or replaced by a new one of
        the same name); a Redis error is left to the stream's own read."""
        if time.monotonic() - self.checked < TOKEN_RECHECK_S:
            return False
        self.checked = time.monotonic()
        try:
            info = await anyio.to_thread.run_sync(self.tokens.lookup, self.token)
        except redis.RedisError:
            return False
        return info is None


REVOKED_EVENT = (
    "event: error\ndata: "
    + json.dumps({"code": "AUTH", "message": "the API token was removed: the stream ends"})
    + "\n\n"
)


class ProducerApi:
    """The producer routes of one pool (``ctx``)."""

    def __init__(self, ctx: ApiContext) -> None:
        self.ctx = ctx
        self.tokens = TokenStore(ctx.redis, ctx.keys)
        self.client = Client(ctx.redis, ctx.pool)
        self.client.priority_warnings = False  # (answered as ``warnings``: see `_warnings`)
        self.waiter = Client(ctx.blocker, ctx.pool)  # blocking reads: their own connections

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await anyio.to_thread.run_sync(partial(fn, *args, **kwargs))

    async def submit(self, request: Request) -> Response:
        """Submit one task.

        The body is a JSON object of the submit fields: ``goal`` or ``workflow``,
        ``driver_type``, ``tags`` (a list), ``priority``, ``max_attempts``,
        ``idempotency_key``, ``queue_timeout``, ``reject_unmatched``, ``tenant``,
        ``retry_on``, ``retry_backoff``, ``timeout``, ``roles``, ``not_before``, ``where`` (a list
        of expressions over the device's attributes: ``["sdk>=33"]``). The task's
        ``submitted_by`` is the token's name. Answers 201 ``{"id": ID}``."""
        token = _role(request)
        body = await _json_body(request)
        if not isinstance(body, dict):
            raise InvalidInput("the request body must be a JSON object of task fields")
        ids = await self.call(self.client.submit_many, [_signed(body, token)])
        return JSONResponse({"id": ids[0], **await self._warnings([body])}, status_code=201)

    async def submit_batch(self, request: Request) -> Response:
        """Submit many tasks at once.

        The body is ``{"tasks": [TASK, ...]}`` (each as for ``POST /tasks``; all validated
        before any is written; idempotency keys honoured). Answers 201 ``{"ids": [...]}`` in
        order."""
        token = _role(request)
        body = await _json_body(request)
        tasks = body.get("tasks") if isinstance(body, dict) else None
        if not isinstance(body, dict) or set(body) != {"tasks"} or not isinstance(tasks, list):
            raise InvalidInput('the request body must be {"tasks": [TASK, ...]}')
        if not 1 <= len(tasks) <= BATCH_MAX:
            raise InvalidInput(f"a batch holds 1 to {BATCH_MAX} tasks, not {len(tasks)}")
        if not all(isinstance(t, dict) for t in tasks):
            raise InvalidInput("every task of a batch must be a JSON object of task fields")
        ids = await self.call(self.client.submit_many, [_signed(t, token) for t in tasks])
        return JSONResponse({"ids": ids, **await self._warnings(tasks)}, status_code=201)

    async def _warnings(self, tasks: list[Any]) -> dict[str, list[str]]:
        """``{"warnings": [LINE]}`` when a task was given a priority the strategy in force
        ignores (`deviceq.core.connection.priority_ignored`) or a ``where`` naming an attribute
        no device has (likely a typo: `deviceq.core.fleet.unknown_attributes`), else
        nothing."""
        from ..core.fleet import unknown_attributes, where_keys
        from ..core.models import spec_where_texts

        lines: list[str] = []
        if any(t.get("priority") for t in tasks):
            line = await self.call(priority_ignored, self.client.redis, self.client.keys)
            lines += [line] if line else []
        names = where_keys(w for t in tasks for w in spec_where_texts(t))
        if names:
            lines += await self.call(unknown_attributes, self.client.redis, self.client.keys, names)
        return {"warnings": lines} if lines else {}

    async def get(self, request: Request) -> Response:
        """One task with its attempt history: the JSON of ``deviceq task show --json``."""
        _role(request)
        task_id = validate_id(request.path_params["task_id"], "task id")
        return JSONResponse(task_json(await self.call(self.client.get, task_id)))

    async def list(self, request: Request) -> Response:
        """List tasks (queued and active oldest first, finished newest first).

        Query filters as ``deviceq task list``: ``status`` (repeatable), ``driver_type``,
        ``tag`` (repeatable, all required), ``host``, ``device``, ``tenant``; ``limit``
        (default 50, at most 1000). Answers ``{"tasks": [TASK, ...], "truncated": bool}``
        (``truncated``: the bounded scan stopped before every candidate was read)."""
        _role(request)
        flt = self._filter(request)
        limit = _query_int(request, "limit", 50, LIST_MAX)
        if flt == TaskFilter():
            tasks, truncated = await self.call(self.client.list, None, limit=limit), False
        else:
            res = await self.call(self.client.find, flt, limit=limit)
            tasks, truncated = res.tasks, res.truncated
        return JSONResponse({"tasks": [task_json(t) for t in tasks], "truncated": truncated})

    @staticmethod
    def _filter(request: Request) -> TaskFilter:
        q = request.query_params
        statuses = []
        for s in dict.fromkeys(q.getlist("status")):
            try:
                statuses.append(TaskStatus(s))
            except ValueError:
                raise InvalidInput(
                    f"unknown status {s[:40]!r}; one of: {', '.join(TaskStatus)}"
                ) from None
        driver = q.get("driver_type")
        return TaskFilter(
            statuses=tuple(statuses),
            driver_type=validate_id(driver, "driver type") if driver else None,
            tags=frozenset(validate_id(t, "tag") for t in q.getlist("tag")),
            host_id=_query_id(request, "host", "host id"),
            device_id=_query_id(request, "device", "device id"),
            tenant=_query_id(request, "tenant", "tenant"),
        )

    async def cancel(self, request: Request) -> Response:
        """Cancel a task.

        Optional body ``{"reason": TEXT}``. Answers ``{"id": ID, "answer": A}``, A being
        ``cancelled`` (ended now), ``requested`` (running: its host stops it) or
        ``already:STATUS``. The event's ``by`` is the token's name."""
        token = _role(request)
        task_id = validate_id(request.path_params["task_id"], "task id")
        body = await _json_body(request)
        if body is None:
            body = {}
        if not isinstance(body, dict) or set(body) - {"reason"}:
            raise InvalidInput('the request body must be empty or {"reason": TEXT}')
        reason = body.get("reason", "cancelled by user")
        if not isinstance(reason, str):
            raise InvalidInput("reason must be a string")
        answer = await self.call(self.client.cancel_many, [task_id], reason, token.name)
        return JSONResponse({"id": task_id, "answer": answer[task_id]})

    async def retry(self, request: Request) -> Response:
        """Submit a failed or cancelled task again as a new task.

        The new task's ``submitted_by`` is the token's name. Answers 201 ``{"id": NEW_ID,
        "retry_of": ID}``."""
        token = _role(request)
        task_id = validate_id(request.path_params["task_id"], "task id")
        new_id = await self.call(self.client.retry, task_id, by=token.name)
        return JSONResponse({"id": new_id, "retry_of": task_id}, status_code=201)

    async def wait(self, request: Request) -> Response:
        """Wait for a task to finish (a long poll).

        ``timeout`` seconds (default and at most the service's ``max_wait``). Answers
        ``{"task": TASK, "terminal": bool}`` as soon as the task is terminal, or with
        ``terminal: false`` and the task as it is when the time is up."""
        token = _role(request)
        task_id = validate_id(request.path_params["task_id"], "task id")
        timeout = _query_float(request, "timeout", self.ctx.max_wait, self.ctx.max_wait)
        try:
            with self.ctx.long_polls.hold("token", token.name):
                task = await self.call(self.waiter.wait, task_id, timeout=timeout)
        except TimeoutError:
            task = await self.call(self.client.get, task_id)
        return JSONResponse({"task": task_json(task), "terminal": task.status.terminal})

    async def events(self, request: Request) -> Response:
        """Follow the pool's transitions as Server-Sent Events.

        Filters: ``task``, ``device``, ``host``, ``type`` (repeatable). ``since``: start
        after this event id (``0-0``: the whole capped stream; default: from now, or the
        ``Last-Event-ID`` header). The stream ends after ``limit`` events (default 1000, at
        most 10000), after ``timeout`` seconds (default the service's ``max_wait``, at most
        300), or, with ``follow=0``, once the events so far are sent. Each event is
        ``id: ID``, ``event: TYPE`` and ``data: JSON`` (the object of ``deviceq events
        --json``)."""
        token = _role(request)
        wanted = _event_filter(request)
        since = _since(request)
        limit = _query_int(request, "limit", 1000, EVENTS_MAX)
        duration = _query_float(request, "timeout", self.ctx.max_wait, EVENTS_MAX_SECONDS)
        follow = _follow(request)
        r, keys = self.ctx.blocker, self.client.keys
        cursor = since or await self.call(last_event_id, self.client.redis, keys)
        watch = _TokenWatch(self.tokens, request)

        async def stream() -> AsyncIterator[str]:
            nonlocal cursor
            deadline = time.monotonic() + duration
            sent = 0
            yield ": connected\n\n"
            while sent < limit and not await request.is_disconnected():
                if await watch.revoked():
                    yield REVOKED_EVENT
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    cursor, batch = await self.call(
                        read_events, r, keys, cursor, count=min(500, limit - sent),
                        block_ms=max(1, min(SSE_BLOCK_MS, int(left * 1000))),
                    )  # fmt: skip
                except redis.RedisError:
                    yield ": redis unavailable\n\n"
                    return
                for e in batch:
                    if wanted(e) and sent < limit:
                        sent += 1
                        yield f"id: {e.id}\nevent: {e.type}\ndata: {json.dumps(e.as_dict())}\n\n"
                if not batch:
                    if not follow:
                        return
                    yield ": keepalive\n\n"

        return self._held(token, stream())

    def _held(self, token: TokenInfo, stream: AsyncIterator[str]) -> Response:
        """``stream`` as Server-Sent Events, within the token's bound of blocking calls
        (TooManyWaits past it: 429 before anything is sent)."""
        self.ctx.long_polls.acquire("token", token.name)
        return _HeldStream(stream, partial(self.ctx.long_polls.release, "token", token.name))

    async def logs(self, request: Request) -> Response:
        """Follow an attempt's live log as Server-Sent Events.

        ``attempt``: which attempt (default the task's latest). Each chunk is ``id: ID``,
        ``event: log`` and ``data: {"time_ms", "stream": "stdout"|"stderr"|"log", "text"}``
        (an entry of ``deviceq task logs --json``). Once the attempt has ended and all its
        chunks are sent, an ``event: end`` with ``data: {"attempt", "status",
        "succeeded"}`` closes the stream. ``since``: start after this chunk id (or the
        ``Last-Event-ID`` header). The stream also ends after ``limit`` chunks (default and
        at most 10000), after ``timeout`` seconds (default the service's ``max_wait``, at
        most 300), or, with ``follow=0``, once the chunks so far are sent."""
        token = _role(request)
        task_id = validate_id(request.path_params["task_id"], "task id")
        wanted = _query_int(request, "attempt", 0, MAX_ATTEMPT) or None
        follow = _follow(request)
        after = _since(request) or "0-0"
        limit = _query_int(request, "limit", LOGS_MAX, LOGS_MAX)
        duration = _query_float(request, "timeout", self.ctx.max_wait, EVENTS_MAX_SECONDS)
        reader = LogReader(self.client.redis, self.client.keys)
        attempt = await self.call(reader.attempt_for, task_id, wanted)
        watch = _TokenWatch(self.tokens, request)

        async def stream() -> AsyncIterator[str]:
            nonlocal after
            deadline = time.monotonic() + duration
            sent = 0
            yield ": connected\n\n"
            while sent < limit and not await request.is_disconnected():
                if await watch.revoked():
                    yield REVOKED_EVENT
                    return
                try:
                    state = await self.call(reader.state, task_id)  # before the read
                    page = await self.call(reader.read, task_id, attempt, after,
                                           min(500, limit - sent))  # fmt: skip
                except (redis.RedisError, NotFound):
                    yield ": unavailable\n\n"
                    return
                for e in page:
                    sent += 1
                    after = e.id
                    yield _log_event(e)
                if page:
                    continue
                if state.ended(attempt):
                    end = {"attempt": attempt, "status": state.status,
                           "succeeded": state.succeeded(attempt)}  # fmt: skip
                    yield f"event: end\ndata: {json.dumps(end, sort_keys=True)}\n\n"
                    return
                left = deadline - time.monotonic()
                if not follow or left <= 0:
                    return
                try:
                    await self.call(self._wait_log, task_id, attempt, after,
                                    max(1, min(SSE_BLOCK_MS, int(left * 1000))))  # fmt: skip
                except redis.RedisError:
                    yield ": redis unavailable\n\n"
                    return
                yield ": keepalive\n\n"

        return self._held(token, stream())

    def _wait_log(self, task_id: str, attempt: int, after: str, block_ms: int) -> None:
        """Block up to ``block_ms`` for a chunk after ``after`` (then the stream looks at
        the task again)."""
        key = self.client.keys.log(task_id, attempt)
        self.ctx.blocker.xread({key: after}, count=1, block=block_ms)

    def _recorded(self, request: Request, attempt: int | None) -> Recorded:
        _role(request)
        task_id = validate_id(request.path_params["task_id"], "task id")
        return recorded(self.client, task_id, attempt)

    async def artifacts(self, request: Request) -> Response:
        """The files an attempt kept in the artifact store.

        ``attempt``: which attempt (default the task's latest). Answers ``{"task_id",
        "attempt", "artifacts": [{"name", "size", "sha256"}], "artifacts_error"}`` (as
        ``deviceq task artifacts --json``; ``artifacts_error``: why an upload failed, or
        null). 404 without the task or the attempt."""
        wanted = _query_int(request, "attempt", 0, MAX_ATTEMPT) or None
        rec = await self.call(self._recorded, request, wanted)
        return JSONResponse({"task_id": request.path_params["task_id"], "attempt": rec.attempt,
                             "artifacts": rec.files, "artifacts_error": rec.error})  # fmt: skip

    async def artifact(self, request: Request) -> Response:
        """Download one file an attempt kept (from the pool's ``artifact_store``).

        Only a name the attempt's record lists is served (else 404). The file is read whole
        from the store and checked against its recorded size and sha256 before the first
        byte is sent: the answer (``application/octet-stream``, its ``Content-Length``) is
        then exactly the bytes checked, with that sha256 in the ``X-Deviceq-Sha256`` header.
        409 ``CORRUPT`` when the store's file differs from the record, is a link (never
        followed) or a folder; 404 when it is gone; 503 when the store cannot be read now."""
        text = str(request.path_params["attempt"])
        if not text.isdigit() or not 1 <= int(text) <= MAX_ATTEMPT:
            raise InvalidInput(f"attempt must be an integer from 1 to {MAX_ATTEMPT}")
        name = str(request.path_params["name"])
        rec = await self.call(self._recorded, request, int(text))
        entry = next((f for f in rec.files if f.get("name") == name), None)
        if entry is None:
            raise NotFound(f"attempt {rec.attempt} recorded no artifact {name[:80]!r}")
        size, sha256 = _int_or(entry.get("size"), -1), str(entry.get("sha256") or "")
        if size < 0 or len(sha256) != 64:
            raise StoredFileRefused(f"artifact {name[:80]!r} has no size and sha256 recorded")
        task_id = str(request.path_params["task_id"])
        try:
            src = await self.call(self._open_artifact, task_id, rec.attempt, name, size, sha256)
        except FileNotFoundError:
            raise NotFound(f"artifact {name[:80]!r} is no longer in the store") from None
        except StoredFileRefused:
            raise
        except (DeviceqError, OSError, ImportError, ValueError) as exc:
            raise StoreUnavailable(exc) from None

        async def body() -> AsyncIterator[bytes]:
            try:
                while chunk := await self.call(src.read, CHUNK):
                    yield chunk
            finally:
                await self.call(src.close)

        leaf = name.rsplit("/", 1)[-1]
        return StreamingResponse(body(), media_type="application/octet-stream", headers={
            "x-deviceq-sha256": sha256,
            "content-length": str(size),
            "content-disposition": f"attachment; filename*=UTF-8''{quote(leaf, safe='')}",
            "cache-control": "no-store",
        })  # fmt: skip

    def _open_artifact(self, task_id: str, attempt: int, name: str, size: int,
                       sha256: str) -> Any:  # fmt: skip
        store = store_for(self.client, None)
        return store.open_verified(self.client.pool, task_id, attempt, name, size, sha256)


def _int_or(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


class StoreUnavailable(DeviceqError):
    """The artifact store could not be opened or read (the message names no URL or path)."""

    code = "UNAVAILABLE"

    def __init__(self, exc: BaseException) -> None:
        super().__init__(f"the artifact store cannot be read now ({type(exc).__name__})")


def _event_filter(request: Request) -> Callable[[Event], bool]:
    task = _query_id(request, "task", "task id")
    device = _query_id(request, "device", "device id")
    host = _query_id(request, "host", "host id")
    types = frozenset(validate_id(t, "event type") for t in request.query_params.getlist("type"))

    def wanted(e: Event) -> bool:
        return (
            (task is None or e.task == task)
            and (device is None or e.fields.get("device") == device)
            and (host is None or e.fields.get("host") == host)
            and (not types or e.type in types)
        )

    return wanted


def producer_routes(ctx: ApiContext) -> list[BaseRoute]:
    """The routes of the producer protocol, relative to ``/api/v1``."""
    api = ProducerApi(ctx)
    return [
        Route("/tasks", api.submit, methods=["POST"]),
        Route("/tasks", api.list, methods=["GET"]),
        Route("/tasks/batch", api.submit_batch, methods=["POST"]),
        Route("/tasks/{task_id}", api.get, methods=["GET"]),
        Route("/tasks/{task_id}/cancel", api.cancel, methods=["POST"]),
        Route("/tasks/{task_id}/retry", api.retry, methods=["POST"]),
        Route("/tasks/{task_id}/wait", api.wait, methods=["GET"]),
        Route("/tasks/{task_id}/logs", api.logs, methods=["GET"]),
        Route("/tasks/{task_id}/artifacts", api.artifacts, methods=["GET"]),
        Route("/tasks/{task_id}/artifacts/{attempt}/{name:path}", api.artifact, methods=["GET"]),
        Route("/events", api.events, methods=["GET"]),
    ]
