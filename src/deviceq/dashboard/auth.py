"""The login of the dashboard: one secret operator token (from ``--operator-token-file``) or
named users (`deviceq.dashboard.users`), server-side sessions in memory (each with its user
name and role), a CSRF token per session.

The token is compared in constant time and never stored anywhere but in this process; a
session cookie is a random id (``HttpOnly``, ``SameSite=Strict``) that maps to the session's
CSRF token, which every action form carries and every action checks."""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass, field

SESSION_COOKIE = "dq_session"
LOGIN_COOKIE = "dq_login"
SESSION_TTL = 12 * 3600.0
MAX_SESSIONS = 1000
MIN_TOKEN_CHARS = 16


TOKEN_USER = "operator"
"""The user name of a session opened with the operator token (the ``by`` of its actions)."""


@dataclass
class Session:
    csrf: str
    expires: float
    flash: list[str] = field(default_factory=list)
    user: str = TOKEN_USER
    role: str = "operator"
    by_token: bool = True

    @property
    def can_act(self) -> bool:
        return self.role == "operator"


class Auth:
    """Sessions of one dashboard process. ``token`` None: read-only, nobody can log in."""

    def __init__(self, token: str | None) -> None:
        self._token = token
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def check_token(self, given: str) -> bool:
        if self._token is None:
            return False
        return hmac.compare_digest(given.encode(), self._token.encode())

    def login(self, user: str = TOKEN_USER, role: str = "operator", by_token: bool = True) -> str:
        """A new session of ``user`` with ``role``; returns its id (the cookie value)."""
        sid = secrets.token_urlsafe(32)
        now = time.monotonic()
        with self._lock:
            for k in [k for k, s in self._sessions.items() if s.expires < now]:
                del self._sessions[k]
            while len(self._sessions) >= MAX_SESSIONS:  # the oldest go first
                del self._sessions[min(self._sessions, key=lambda k: self._sessions[k].expires)]
            self._sessions[sid] = Session(
                secrets.token_urlsafe(32), now + SESSION_TTL, [], user, role, by_token
            )
        return sid

    def session(self, sid: str | None) -> Session | None:
        if not sid:
            return None
        with self._lock:
            s = self._sessions.get(sid)
            if s is None:
                return None
            if s.expires < time.monotonic():
                del self._sessions[sid]
                return None
            return s

    def logout(self, sid: str | None) -> None:
        if sid:
            with self._lock:
                self._sessions.pop(sid, None)

    @staticmethod
    def csrf_ok(session: Session, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(str(given).encode(), session.csrf.encode())


def read_token_file(path: str) -> str:
    """The operator token from its file (surrounding whitespace stripped). ValueError when
    it is empty or shorter than ``MIN_TOKEN_CHARS``; the message never contains the token."""
    with open(path, encoding="utf-8") as f:
        token = f.read().strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(
            f"the operator token in {path} is empty or shorter than {MIN_TOKEN_CHARS} "
            "characters (make one with: python -c 'import secrets; "
            "print(secrets.token_urlsafe(32))' > FILE)"
        )
    if any(c.isspace() for c in token):
        raise ValueError(f"the operator token in {path} contains whitespace")
    return token
