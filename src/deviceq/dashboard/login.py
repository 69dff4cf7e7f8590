"""The dashboard's login pages: by user name and password when the pool has dashboard users
(`deviceq.dashboard.users`), else by the operator token the dashboard was started with.

Every attempt is first charged to the shared `LoginLimiter` (per client address and per user
name): past the limit it is refused at once with HTTP 429 and ``Retry-After``, before any
password is checked. Password checks (argon2: memory-hard on purpose) run at most
`VERIFY_CONCURRENCY` at a time, in worker threads."""

from __future__ import annotations

import asyncio
import logging
import secrets

import anyio
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from .auth import LOGIN_COOKIE, SESSION_COOKIE, SESSION_TTL, TOKEN_USER
from .site import Site

log = logging.getLogger("deviceq.dashboard")

VERIFY_CONCURRENCY = 2
FAILED_DELAY_S = 1.0


def _safe_next(target: str) -> str:
    if target.startswith("/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/fleet"


def _peer(request: Request) -> str:
    return request.client.host if request.client else "?"


class Login:
    """``GET /login`` and ``POST /login`` of one dashboard."""

    def __init__(self, d: Site) -> None:
        self.d = d
        self.verify_limiter = anyio.CapacityLimiter(VERIFY_CONCURRENCY)

    def _form_page(self, request: Request, users: bool, failed: bool, status: int) -> Response:
        nonce = secrets.token_urlsafe(24)
        nxt = request.query_params.get("next") or "" if request.method == "GET" else ""
        page = self.d.render(
            request, "login.html", status, nonce=nonce, failed=failed, users_mode=users,
            next_url=_safe_next(nxt or getattr(request.state, "login_next", "")),
        )  # fmt: skip
        page.set_cookie(LOGIN_COOKIE, nonce, max_age=3600, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")  # fmt: skip
        return page

    async def form(self, request: Request) -> Response:
        users = await self.d.call(self.d.users.configured)
        if not users and not self.d.auth.enabled:
            return self.d.error_page(
                request, 403, "This dashboard is read-only: it was started without "
                "--operator-token-file and the pool has no dashboard users."
            )  # fmt: skip
        return self._form_page(request, users, False, 200)

    async def submit(self, request: Request) -> Response:
        users = await self.d.call(self.d.users.configured)
        if not users and not self.d.auth.enabled:
            return self.d.error_page(request, 403, "This dashboard is read-only.")
        self.d.check_origin(request)
        form = await request.form()
        request.state.login_next = str(form.get("next") or "")
        nonce = str(form.get("nonce") or "")
        cookie = request.cookies.get(LOGIN_COOKIE) or ""
        if not nonce or not secrets.compare_digest(nonce.encode(), cookie.encode()):
            return self.d.error_page(request, 403, "The login form expired: load it again.")
        name = str(form.get("user") or "")[:128] if users else ""
        verdict = await self.d.call(self.d.limiter.charge, _peer(request), name or None)
        if not verdict.allowed:
            log.warning("dashboard login refused (too many attempts) from %s", _peer(request))
            page = self.d.error_page(
                request, 429, f"Too many login attempts: try again in {verdict.retry_after} s."
            )
            page.headers["retry-after"] = str(verdict.retry_after)
            return page
        if users:
            user = await anyio.to_thread.run_sync(
                self.d.users.verify, name, str(form.get("password") or ""),
                limiter=self.verify_limiter,
            )  # fmt: skip
            who, role = (user.name, user.role) if user else ("", "")
        else:
            ok = self.d.auth.check_token(str(form.get("token") or ""))
            who, role = (TOKEN_USER, "operator") if ok else ("", "")
        if not who:
            await asyncio.sleep(FAILED_DELAY_S)  # slows one client's sequential guessing
            log.warning("dashboard login refused (wrong %s) from %s",
                        "name or password" if users else "token", _peer(request))  # fmt: skip
            return self._form_page(request, users, True, 403)
        await self.d.call(self.d.limiter.refund, verdict)
        sid = self.d.auth.login(who, role, by_token=not users)
        log.info("dashboard %s %s logged in from %s", role, who, _peer(request))
        resp = RedirectResponse(_safe_next(request.state.login_next), status_code=303)
        resp.set_cookie(SESSION_COOKIE, sid, max_age=int(SESSION_TTL), httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")  # fmt: skip
        resp.delete_cookie(LOGIN_COOKIE)
        return resp
