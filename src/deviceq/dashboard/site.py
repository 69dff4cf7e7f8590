"""What a page of the dashboard gets from the app (`app.Dashboard`) to do its work: `Site`,
the pool's clients, the sessions and users, and the app's rendering, origin check and
thread calls. The pages (`task_views`, `device_page`, `bulk`, `login`) are written against
it; the app implements it and routes to them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import HTMLResponse

from ..ops.admin import PoolAdmin
from ..producer.client import Client
from .auth import Auth, Session
from .limits import LoginLimiter
from .users import UserStore


class Site(Protocol):
    """The dashboard as its pages use it (see the module docstring)."""

    client: Client
    admin: PoolAdmin
    auth: Auth
    users: UserStore
    limiter: LoginLimiter

    def render(
        self, request: Request, name: str, status_code: int = 200, **ctx: Any
    ) -> HTMLResponse: ...
    def error_page(self, request: Request, status_code: int, message: str) -> HTMLResponse: ...
    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any: ...
    def check_origin(self, request: Request) -> None: ...
    async def operator(self, request: Request) -> Session: ...
