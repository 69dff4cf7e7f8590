"""The dashboard's ASGI application (Starlette): server-rendered pages, live updates over
Server-Sent Events from the pool's event stream, and — for operators logged in with the
operator token or as a dashboard user of role operator — actions that go through the same Lua
transitions as the command line (each recorded with who did it, the events' ``by``).

>>> app = create_app(Client("redis://localhost:6379/0", "default"), operator_token=None)
>>> uvicorn.run(app, host="127.0.0.1", port=8180)
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import anyio
import redis
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..core.errors import DeviceqError, InvalidInput, NotFound
from ..core.events import last_event_id, read_events
from ..core.fleet import DEVICE_STATES
from ..core.live_logs import LogReader
from ..core.validation import validate_id
from ..core.vocabulary import TaskStatus
from ..ops.admin import PoolAdmin
from ..producer.client import Client
from . import bulk, data, device_page, suite_page, task_list, task_views
from .auth import SESSION_COOKIE, Auth, Session
from .display import bars, fmt_age, fmt_clock, fmt_ms, fmt_time
from .headers import SecurityHeaders
from .limits import LoginLimiter
from .login import Login
from .users import UserStore

HERE = Path(__file__).resolve().parent
log = logging.getLogger("deviceq.dashboard")

PARTIAL_HEADER = "x-dashboard-partial"
SSE_BLOCK_MS = 3000


# -- the app -----------------------------------------------------------------------------------
class Dashboard:
    """The routes of one pool's dashboard."""

    def __init__(self, client: Client, operator_token: str | None) -> None:
        self.client = client
        self.admin = PoolAdmin(client.redis, client.pool)
        self.auth = Auth(operator_token)
        self.users = UserStore(client.redis, client.keys)
        self.limiter = LoginLimiter(client.redis, client.keys)
        self.login = Login(self)
        self.sse_limiter = anyio.CapacityLimiter(64)
        self.rates = data.RateWindow()
        self.env = Environment(
            loader=FileSystemLoader(str(HERE / "templates")),
            autoescape=select_autoescape(("html",), default=True),
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(time=fmt_time, clock=fmt_clock, age=fmt_age, ms=fmt_ms)
        self.env.globals.update(
            pool=client.pool,
            device_states=DEVICE_STATES,
            statuses=[s.value for s in TaskStatus],
            urlencode=urlencode,
        )

    # -- rendering -------------------------------------------------------------------------
    def session_of(self, request: Request) -> Session | None:
        """The request's session; a token session ends once the pool has dashboard users."""
        s = self.auth.session(request.cookies.get(SESSION_COOKIE))
        return None if s is not None and s.by_token and self.users.configured() else s

    def render(
        self, request: Request, name: str, status_code: int = 200, **ctx: Any
    ) -> HTMLResponse:
        session = self.session_of(request)
        flash: list[str] = []
        partial = request.headers.get(PARTIAL_HEADER) == "1"
        if session is not None and session.flash and not partial:  # (a live refresh has none)
            flash, session.flash = session.flash, []
        html = self.env.get_template(name).render(
            request=request,
            path=request.url.path,
            partial=partial,
            operator=self.auth.enabled or self.users.configured(),
            session=session if session is not None and session.can_act else None,
            me=session,
            csrf=session.csrf if session else "",
            flash=flash,
            **ctx,
        )
        return HTMLResponse(html, status_code=status_code)

    def error_page(self, request: Request, status_code: int, message: str) -> HTMLResponse:
        return self.render(request, "error.html", status_code, code=status_code, message=message)

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await anyio.to_thread.run_sync(partial(fn, *args, **kwargs))

    # -- pages -----------------------------------------------------------------------------
    async def index(self, request: Request) -> Response:
        return RedirectResponse("/fleet", status_code=303)

    async def fleet(self, request: Request) -> Response:
        q = dict(request.query_params)
        if set(q) - {"host", "page"}:
            raise InvalidInput(f"unknown query parameter {sorted(set(q) - {'host', 'page'})[0]!r}")
        host = q.get("host") or None
        if host:
            validate_id(host, "host id")
        page_s = q.get("page") or "0"
        if not page_s.isdigit() or len(page_s) > 6:
            raise InvalidInput("page must be a number >= 0")
        view = await self.call(data.fleet, self.admin, int(page_s), host)
        return self.render(request, "fleet.html", view=view, host_filter=host or "")

    async def queue(self, request: Request) -> Response:
        if request.query_params:
            raise InvalidInput("the queue page takes no query parameters")
        view = await self.call(data.queue, self.admin, self.rates)
        rows = view["rates"]["rows"]
        view["chart_tp"] = bars([r["finished"] for r in rows])
        view["chart_sub"] = bars([r["submitted"] for r in rows])
        view["chart_lat"] = bars([r["lat_mean"] for r in rows])
        return self.render(request, "queue.html", view=view)

    async def tasks(self, request: Request) -> Response:
        return await task_views.tasks_page(self, request)

    async def task(self, request: Request) -> Response:
        return await task_views.task_page(self, request)

    async def artifact(self, request: Request) -> Response:
        """One file an attempt recorded, from the pool's artifact store (never a store URL
        handed out; a name the attempt record does not list is a 404): read whole and
        checked against its recorded size and sha256 before the first byte is sent (409 when
        the store's file differs, is a link or a folder; 404 when it is gone)."""
        from ..artifacts.records import recorded, store_for
        from ..artifacts.store import CHUNK

        task_id = validate_id(request.path_params["task_id"], "task id")
        attempt, name = int(request.path_params["attempt"]), request.path_params["name"]
        rec = await self.call(recorded, self.admin, task_id, attempt)
        f = next((f for f in rec.files if f.get("name") == name), None)
        if f is None:
            raise NotFound(f"attempt {attempt} of task {task_id} recorded no file {name!r}")
        size, sha256 = f.get("size"), str(f.get("sha256") or "")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise NotFound(f"attempt {attempt} of task {task_id} recorded no size for {name!r}")
        store = await self.call(store_for, self.admin, None)
        try:
            src = await self.call(store.open_verified, self.admin.pool, task_id, attempt,
                                  name, size, sha256)  # fmt: skip
        except FileNotFoundError:
            raise NotFound(f"{name!r} is no longer in the artifact store") from None

        async def body() -> AsyncIterator[bytes]:
            try:
                while chunk := await self.call(src.read, CHUNK):
                    yield chunk
            finally:
                await self.call(src.close)

        leaf = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_"
                       for c in name.rsplit("/", 1)[-1])  # fmt: skip
        return StreamingResponse(body(), media_type="application/octet-stream", headers={
            "content-disposition": f'attachment; filename="{leaf}"',
            "content-length": str(size), "x-deviceq-sha256": sha256})  # fmt: skip

    async def events(self, request: Request) -> Response:
        q = dict(request.query_params)
        flt = data.EventFilter.parse(q)
        events = await self.call(data.recent_events, self.client, flt)
        since = events[-1].id if events else await self.call(
            last_event_id, self.client.redis, self.client.keys
        )  # fmt: skip
        stream_q = {"type": " ".join(flt.types), "task": flt.task or "", "host": flt.host or "",
                    "device": flt.device or "", "since": since}  # fmt: skip
        return self.render(
            request, "events.html", events=events, flt=flt,
            stream_url="/api/stream?" + urlencode({k: v for k, v in stream_q.items() if v}),
        )  # fmt: skip

    async def healthz(self, request: Request) -> Response:
        await self.call(self.client.redis.ping)
        return PlainTextResponse("ok\n")

    # -- live updates ----------------------------------------------------------------------
    async def stream(self, request: Request) -> Response:
        """Server-Sent Events: every new event of the pool (matching the filter) as JSON."""
        q = dict(request.query_params)
        flt = data.EventFilter.parse(q, allowed={"since"})
        since = q.get("since") or request.headers.get("last-event-id") or None
        if since is not None:
            parts = since.split("-")
            if len(parts) != 2 or not all(p.isdigit() and len(p) <= 20 for p in parts):
                raise InvalidInput(f"bad event id {since[:40]!r}")
        r, keys = self.client.redis, self.client.keys

        async def gen() -> AsyncIterator[str]:
            cursor = since or await self.call(last_event_id, r, keys)
            yield "retry: 3000\n: connected\n\n"
            while not await request.is_disconnected():
                try:
                    cursor, batch = await anyio.to_thread.run_sync(
                        partial(read_events, r, keys, cursor, block_ms=SSE_BLOCK_MS, count=500),
                        limiter=self.sse_limiter,
                    )
                except redis.RedisError as exc:
                    log.warning("event stream read failed: %s", exc)
                    yield ": redis unavailable\n\n"
                    await asyncio.sleep(2)
                    continue
                sent = False
                for e in batch:
                    if flt.matches(e):
                        payload = json.dumps({"time_ms": e.ms, **e.as_dict()})
                        yield f"id: {e.id}\ndata: {payload}\n\n"
                        sent = True
                if not sent:
                    yield f"id: {cursor}\n: keepalive\n\n"

        return StreamingResponse(
            gen(),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    async def log_stream(self, request: Request) -> Response:
        """Server-Sent Events: an attempt's live log (``?attempt=N``), every chunk from the
        start (or after ``Last-Event-ID``) as JSON ``{time_ms, stream, text}``, then an
        ``end`` event once the attempt has ended."""
        task_id = validate_id(request.path_params["task_id"], "task id")
        q = dict(request.query_params)
        if set(q) - {"attempt"}:
            raise InvalidInput("the log stream takes only ?attempt=N")
        raw = q.get("attempt", "")
        if not raw.isdigit() or not 1 <= int(raw) <= 1_000_000:
            raise InvalidInput("attempt must be a number from 1")
        attempt = int(raw)
        after = request.headers.get("last-event-id") or "0-0"
        parts = after.split("-")
        if len(parts) != 2 or not all(p.isdigit() and len(p) <= 20 for p in parts):
            raise InvalidInput(f"bad log entry id {after[:40]!r}")
        reader = LogReader(self.client.redis, self.client.keys)
        await self.call(reader.state, task_id)  # NotFound before the stream starts

        async def gen() -> AsyncIterator[str]:
            cursor = after
            yield "retry: 3000\n: connected\n\n"
            while not await request.is_disconnected():
                try:
                    ended = (await self.call(reader.state, task_id)).ended(attempt)
                    page = await anyio.to_thread.run_sync(
                        partial(reader.next, task_id, attempt, cursor,
                                None if ended else SSE_BLOCK_MS),
                        limiter=self.sse_limiter,
                    )  # fmt: skip
                except redis.RedisError as exc:
                    log.warning("log stream read failed: %s", exc)
                    yield ": redis unavailable\n\n"
                    await asyncio.sleep(2)
                    continue
                for e in page:
                    yield f"id: {e.id}\ndata: {json.dumps(e.json())}\n\n"
                    cursor = e.id
                if ended and not page:
                    yield "event: end\ndata: {}\n\n"
                    return
                if not page:
                    yield ": keepalive\n\n"

        return StreamingResponse(
            gen(),
            media_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    # -- login -----------------------------------------------------------------------------
    async def logout(self, request: Request) -> Response:
        await self.logged_in(request)
        self.auth.logout(request.cookies.get(SESSION_COOKIE))
        resp = RedirectResponse("/fleet", status_code=303)
        resp.delete_cookie(SESSION_COOKIE)
        return resp

    # -- actions ---------------------------------------------------------------------------
    def check_origin(self, request: Request) -> None:
        origin = request.headers.get("origin")
        if origin and origin != "null":
            host = request.headers.get("host", "")
            if urlsplit(origin).netloc != host:
                raise HTTPException(403, "cross-origin request refused")

    async def logged_in(self, request: Request) -> Session:
        """The request's session, with the CSRF token of the form checked; HTTP 403
        otherwise."""
        if not self.auth.enabled and not await self.call(self.users.configured):
            raise HTTPException(
                403, "read-only dashboard: start it with --operator-token-file (or add "
                "dashboard users) for actions"
            )  # fmt: skip
        self.check_origin(request)
        session = self.session_of(request)
        if session is None:
            raise HTTPException(403, "log in first")
        form = await request.form()
        if not self.auth.csrf_ok(session, str(form.get("csrf") or "")):
            raise HTTPException(403, "bad or missing CSRF token: reload the page")
        return session

    async def operator(self, request: Request) -> Session:
        """`logged_in`, and an operator: a user's role is read again from Redis (a removed or
        changed user's session acts no more); HTTP 403 otherwise."""
        session = await self.logged_in(request)
        if not session.by_token:
            user = await self.call(self.users.get, session.user)
            session.role = user.role if user is not None else "viewer"
        if not session.can_act:
            raise HTTPException(403, f"user {session.user} is a viewer: actions need an operator")
        return session

    async def action(self, request: Request) -> Response:
        session = await self.operator(request)
        by = session.user
        kind = request.path_params["kind"]
        what = request.path_params["what"]
        ident = request.path_params["ident"]
        actions: dict[tuple[str, str], tuple[Callable[[], Any], str]] = {
            ("tasks", "cancel"): (lambda: self.client.cancel(
                ident, f"cancelled from the dashboard by {by}", by), "/tasks/"),
            ("tasks", "retry"): (lambda: self.client.retry(ident, by=by), "/tasks/"),
            ("hosts", "drain"): (lambda: self.admin.drain(ident, True, by), "/fleet?host="),
            ("hosts", "undrain"): (lambda: self.admin.drain(ident, False, by), "/fleet?host="),
            ("devices", "quarantine"): (lambda: self.admin.quarantine(ident, True, "", by), ""),
            ("devices", "unquarantine"): (lambda: self.admin.quarantine(ident, False, "", by),
                                          ""),
        }  # fmt: skip
        if (kind, what) not in actions:
            raise HTTPException(404, "no such action")
        validate_id(ident, {"tasks": "task id", "hosts": "host id"}.get(kind, "device id"))
        fn, back = actions[(kind, what)]
        result = await self.call(fn)
        log.info("dashboard action %s %s %s by %s: %s", kind, what, ident, by, result)
        # a form's "back": the page it came from, with the task list's filters it carried
        came, _, list_q = str((await request.form()).get("back") or "").partition("?")
        list_q = task_list.carried_query(list_q)
        if (kind, what) == ("tasks", "retry"):
            session.flash.append(f"Submitted {result} (retry of {ident}).")
            return RedirectResponse(f"/tasks/{result}" + (f"?{list_q}" if list_q else ""),
                                    status_code=303)  # fmt: skip
        session.flash.append(f"{what} {ident}: {result}")
        if came == f"/{kind}/{ident}":
            return RedirectResponse(came + (f"?{list_q}" if list_q else ""), status_code=303)
        if kind == "devices":
            dev = await self.call(self.admin.device, ident)
            back, ident = "/fleet?host=", dev.host_id
        return RedirectResponse(back + ident, status_code=303)

    # -- errors ----------------------------------------------------------------------------
    def redis_address(self) -> str:
        """Where the dashboard's Redis is, for the outage page: ``HOST:PORT`` (a socket's
        path), never a password."""
        kw = getattr(getattr(self.client.redis, "connection_pool", None), "connection_kwargs", {})
        if kw.get("path"):
            return str(kw["path"])
        if kw.get("host"):
            return f"{kw['host']}:{kw.get('port', 6379)}"
        return "its configured address"

    def unavailable(self, exc: BaseException) -> Response:
        """The page every route answers while Redis cannot be used: 503, a short human page
        that reloads itself, rendered without Redis (no session, no users)."""
        if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
            what = f"Redis at {self.redis_address()} is unreachable; retrying"
        else:
            what = f"Redis at {self.redis_address()} refused the request; retrying"
        log.warning("%s: %s", what, " ".join(str(exc).split())[:200] or type(exc).__name__)
        html = self.env.get_template("unavailable.html").render(message=what, pool=self.client.pool)
        return HTMLResponse(html, status_code=503, headers={"Retry-After": "5"})

    async def on_error(self, request: Request, exc: Exception) -> Response:
        cause = _redis_cause(exc)
        if cause is not None:
            return self.unavailable(cause)
        if isinstance(exc, HTTPException):
            return self.error_page(request, exc.status_code, str(exc.detail))
        if isinstance(exc, InvalidInput):
            return self.error_page(request, 400, str(exc))
        if isinstance(exc, NotFound):
            return self.error_page(request, 404, str(exc))
        if isinstance(exc, DeviceqError):
            return self.error_page(request, 409, f"{type(exc).__name__}: {exc}")
        log.exception("dashboard error on %s", request.url.path)
        return PlainTextResponse("internal error (see the dashboard's log)\n", status_code=500)


def _redis_cause(exc: BaseException) -> redis.RedisError | None:
    """The Redis error ``exc`` is or was raised from (its cause or context chain), if any."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, redis.RedisError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def create_app(client: Client, operator_token: str | None = None) -> Starlette:
    """The dashboard of ``client``'s pool; actions only with ``operator_token``."""
    d = Dashboard(client, operator_token)
    routes = [
        Route("/", d.index),
        Route("/fleet", d.fleet),
        Route("/queue", d.queue),
        Route("/tasks", d.tasks),
        Route("/tasks/{task_id}", d.task),
        Route("/tasks/{task_id}/artifacts/{attempt:int}/{name:path}", d.artifact),
        Route("/devices/{device_id}", partial(device_page.device_page, d), methods=["GET"]),
        Route("/suites", partial(suite_page.suites_page, d), methods=["GET"]),
        Route("/suites/{suite_id}", partial(suite_page.suite_page, d), methods=["GET"]),
        Route("/bulk/confirm", partial(bulk.confirm, d), methods=["POST"]),
        Route("/bulk/apply", partial(bulk.apply, d), methods=["POST"]),
        Route("/events", d.events),
        Route("/healthz", d.healthz),
        Route("/api/stream", d.stream),
        Route("/api/tasks/{task_id}/log", d.log_stream),
        Route("/login", d.login.form, methods=["GET"]),
        Route("/login", d.login.submit, methods=["POST"]),
        Route("/logout", d.logout, methods=["POST"]),
        Route("/{kind:str}/{ident:str}/{what:str}", d.action, methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    handlers: dict[Any, Any] = {
        HTTPException: d.on_error,
        DeviceqError: d.on_error,
        redis.RedisError: d.on_error,
        Exception: d.on_error,
    }
    app = Starlette(
        routes=routes, exception_handlers=handlers, middleware=[Middleware(SecurityHeaders)]
    )
    app.state.dashboard = d
    return app
