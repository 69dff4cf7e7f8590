"""The dashboard's ASGI application (Starlette): server-rendered pages, live updates over
Server-Sent Events from the pool's event stream, and — only with an operator token — actions
that go through the same Lua transitions as the command line.

>>> app = create_app(Client("redis://localhost:6379/0", "default"), operator_token=None)
>>> uvicorn.run(app, host="127.0.0.1", port=8180)
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
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
from ..core.models import TaskStatus, validate_id
from ..ops.admin import PoolAdmin
from ..producer import Client
from . import data
from .auth import LOGIN_COOKIE, SESSION_COOKIE, SESSION_TTL, Auth, Session
from .display import bars, fmt_age, fmt_clock, fmt_ms, fmt_time
from .headers import SecurityHeaders

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
        return self.auth.session(request.cookies.get(SESSION_COOKIE))

    def render(
        self, request: Request, name: str, status_code: int = 200, **ctx: Any
    ) -> HTMLResponse:
        session = self.session_of(request)
        flash: list[str] = []
        if session is not None and session.flash:
            flash, session.flash = session.flash, []
        html = self.env.get_template(name).render(
            request=request,
            path=request.url.path,
            partial=request.headers.get(PARTIAL_HEADER) == "1",
            operator=self.auth.enabled,
            session=session,
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
        q = dict(request.query_params)
        flt = data.TaskFilter.parse(q)
        after = q.get("after") or None
        page = await self.call(data.list_tasks, self.client, flt, after)
        now = await self.call(self.admin.server_time_ms)
        next_url = "/tasks?" + urlencode(flt.query(page.next_cursor)) if page.next_cursor else None
        first_url = "/tasks?" + urlencode(flt.query()) if after else None
        return self.render(
            request, "tasks.html", page=page, flt=flt, now=now, next_url=next_url,
            first_url=first_url, max_scan=data.MAX_SCAN, page_sizes=data.PAGE_SIZES,
        )  # fmt: skip

    async def task(self, request: Request) -> Response:
        if request.query_params:
            raise InvalidInput("the task page takes no query parameters")
        task_id = validate_id(request.path_params["task_id"], "task id")
        view = await self.call(data.task_detail, self.admin, task_id)
        return self.render(request, "task.html", view=view, t=view["t"])

    async def artifact(self, request: Request) -> Response:
        """One file an attempt recorded, streamed from the pool's artifact store (never a
        store URL handed out; a name the attempt record does not list is a 404)."""
        from ..artifacts.records import recorded, store_for
        from ..artifacts.store import iter_chunks

        task_id = validate_id(request.path_params["task_id"], "task id")
        attempt, name = int(request.path_params["attempt"]), request.path_params["name"]
        rec = await self.call(recorded, self.admin, task_id, attempt)
        f = next((f for f in rec.files if f.get("name") == name), None)
        if f is None:
            raise NotFound(f"attempt {attempt} of task {task_id} recorded no file {name!r}")
        store = await self.call(store_for, self.admin, None)
        src = await self.call(store.open, self.admin.pool, task_id, attempt, name)

        async def body() -> AsyncIterator[bytes]:
            chunks = iter_chunks(src)
            try:
                while chunk := await self.call(next, chunks, b""):
                    yield chunk
            finally:
                await self.call(src.close)

        leaf = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_"
                       for c in name.rsplit("/", 1)[-1])  # fmt: skip
        return StreamingResponse(body(), media_type="application/octet-stream", headers={
            "content-disposition": f'attachment; filename="{leaf}"'})  # fmt: skip

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
    async def login_form(self, request: Request) -> Response:
        if not self.auth.enabled:
            return self.error_page(
                request, 403, "This dashboard is read-only: it was started without "
                "--operator-token-file."
            )  # fmt: skip
        nonce = secrets.token_urlsafe(24)
        resp = self.render(
            request, "login.html", nonce=nonce, failed=False,
            next_url=_safe_next(request.query_params.get("next") or ""),
        )  # fmt: skip
        resp.set_cookie(LOGIN_COOKIE, nonce, max_age=3600, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")  # fmt: skip
        return resp

    async def login(self, request: Request) -> Response:
        if not self.auth.enabled:
            return self.error_page(request, 403, "This dashboard is read-only.")
        self.check_origin(request)
        form = await request.form()
        nonce = str(form.get("nonce") or "")
        cookie = request.cookies.get(LOGIN_COOKIE) or ""
        if not nonce or not secrets.compare_digest(nonce.encode(), cookie.encode()):
            return self.error_page(request, 403, "The login form expired: load it again.")
        if not self.auth.check_token(str(form.get("token") or "")):
            await asyncio.sleep(1.0)  # slows guessing
            log.warning("dashboard login refused (wrong token) from %s", _peer(request))
            nonce = secrets.token_urlsafe(24)
            page = self.render(
                request, "login.html", 403, nonce=nonce, failed=True,
                next_url=_safe_next(str(form.get("next") or "")),
            )  # fmt: skip
            page.set_cookie(LOGIN_COOKIE, nonce, max_age=3600, httponly=True,
                            samesite="strict", secure=request.url.scheme == "https")  # fmt: skip
            return page
        sid = self.auth.login()
        log.info("dashboard operator logged in from %s", _peer(request))
        resp = RedirectResponse(_safe_next(str(form.get("next") or "")), status_code=303)
        resp.set_cookie(SESSION_COOKIE, sid, max_age=int(SESSION_TTL), httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")  # fmt: skip
        resp.delete_cookie(LOGIN_COOKIE)
        return resp

    async def logout(self, request: Request) -> Response:
        session = await self.operator(request)
        del session
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

    async def operator(self, request: Request) -> Session:
        """The logged-in operator's session, with the CSRF token of the form checked;
        HTTP 403 otherwise."""
        if not self.auth.enabled:
            raise HTTPException(
                403, "read-only dashboard: start it with --operator-token-file for actions"
            )
        self.check_origin(request)
        session = self.session_of(request)
        if session is None:
            raise HTTPException(403, "log in with the operator token first")
        form = await request.form()
        if not self.auth.csrf_ok(session, str(form.get("csrf") or "")):
            raise HTTPException(403, "bad or missing CSRF token: reload the page")
        return session

    async def action(self, request: Request) -> Response:
        session = await self.operator(request)
        kind = request.path_params["kind"]
        what = request.path_params["what"]
        ident = request.path_params["ident"]
        actions: dict[tuple[str, str], tuple[Callable[[], Any], str]] = {
            ("tasks", "cancel"): (lambda: self.client.cancel(ident, "cancelled from the "
                                                             "dashboard"), "/tasks/"),
            ("tasks", "retry"): (lambda: self.client.retry(ident), "/tasks/"),
            ("hosts", "drain"): (lambda: self.admin.drain(ident, True), "/fleet?host="),
            ("hosts", "undrain"): (lambda: self.admin.drain(ident, False), "/fleet?host="),
            ("devices", "quarantine"): (lambda: self.admin.quarantine(ident, True), ""),
            ("devices", "unquarantine"): (lambda: self.admin.quarantine(ident, False), ""),
        }  # fmt: skip
        if (kind, what) not in actions:
            raise HTTPException(404, "no such action")
        validate_id(ident, {"tasks": "task id", "hosts": "host id"}.get(kind, "device id"))
        fn, back = actions[(kind, what)]
        result = await self.call(fn)
        log.info("dashboard action %s %s %s: %s", kind, what, ident, result)
        if (kind, what) == ("tasks", "retry"):
            session.flash.append(f"Submitted {result} (retry of {ident}).")
            return RedirectResponse(f"/tasks/{result}", status_code=303)
        session.flash.append(f"{what} {ident}: {result}")
        if kind == "devices":
            dev = await self.call(self.admin.device, ident)
            back, ident = "/fleet?host=", dev.host_id
        return RedirectResponse(back + ident, status_code=303)

    # -- errors ----------------------------------------------------------------------------
    async def on_error(self, request: Request, exc: Exception) -> Response:
        if isinstance(exc, HTTPException):
            return self.error_page(request, exc.status_code, str(exc.detail))
        if isinstance(exc, InvalidInput):
            return self.error_page(request, 400, str(exc))
        if isinstance(exc, NotFound):
            return self.error_page(request, 404, str(exc))
        if isinstance(exc, DeviceqError):
            return self.error_page(request, 409, f"{type(exc).__name__}: {exc}")
        if isinstance(exc, redis.RedisError):
            log.warning("redis error: %s", exc)
            return self.error_page(request, 503, "Redis is unavailable or refused the request.")
        log.exception("dashboard error on %s", request.url.path)
        return PlainTextResponse("internal error (see the dashboard's log)\n", status_code=500)


def _peer(request: Request) -> str:
    return request.client.host if request.client else "?"


def _safe_next(target: str) -> str:
    if target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/fleet"


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
        Route("/events", d.events),
        Route("/healthz", d.healthz),
        Route("/api/stream", d.stream),
        Route("/api/tasks/{task_id}/log", d.log_stream),
        Route("/login", d.login_form, methods=["GET"]),
        Route("/login", d.login, methods=["POST"]),
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
