"""Named dashboard users (``deviceq dashboard user``): a role each (``viewer`` reads,
``operator`` acts too) and a password stored only as an argon2id hash.

The pool's ``dashboard:users`` hash maps a user name (an id) to JSON ``{role, hash}``. Nothing
here returns a hash to a caller outside this module; `User` holds the name and role only."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

import redis
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from ..core.errors import AlreadyExists, InvalidInput, NotFound
from ..core.keys import Keys
from ..core.validation import validate_id

ROLES = ("viewer", "operator")
"""``viewer``: every page, no action; ``operator``: the actions too."""
MAX_PASSWORD_BYTES = 1024
"""A longer password is refused before it is hashed (hashing cost does not grow with it, but
a form field need not be unbounded)."""
MIN_PASSWORD_CHARS = 10
"""A shorter password is refused when a user is added (a login of a short one just fails)."""
CONFIGURED_TTL = 2.0
"""Seconds `UserStore.configured` trusts its last answer (it is asked on every page)."""

_hasher = PasswordHasher()
_DUMMY = _hasher.hash("not a password: verified against when the name is unknown")


@dataclass(frozen=True)
class User:
    name: str
    role: str

    @property
    def can_act(self) -> bool:
        return self.role == "operator"

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "role": self.role}


def check_role(role: str) -> str:
    if role not in ROLES:
        raise InvalidInput(f"unknown role {role!r}; one of: {', '.join(ROLES)}")
    return role


def check_password(password: str) -> str:
    """``password`` if it is acceptable: at least `MIN_PASSWORD_CHARS` characters, at most
    `MAX_PASSWORD_BYTES`."""
    if not isinstance(password, str) or not password:
        raise InvalidInput("the password is empty")
    if len(password) < MIN_PASSWORD_CHARS:
        raise InvalidInput(
            f"the password is shorter than {MIN_PASSWORD_CHARS} characters (a passphrase of a "
            "few words is easy to type and hard to guess)"
        )
    if len(password.encode()) > MAX_PASSWORD_BYTES:
        raise InvalidInput(f"the password is longer than {MAX_PASSWORD_BYTES} bytes")
    return password


def _parse(raw: object) -> tuple[str, str] | None:
    """(role, hash) of a stored entry, or None for a malformed one."""
    try:
        entry = json.loads(str(raw))
    except ValueError:
        return None
    if not isinstance(entry, dict):
        return None
    role, hashed = entry.get("role"), entry.get("hash")
    if role not in ROLES or not isinstance(hashed, str):
        return None
    return role, hashed


class UserStore:
    """The dashboard users of one pool."""

    def __init__(self, r: redis.Redis, keys: Keys) -> None:
        self.r = r
        self.keys = keys
        self._lock = threading.Lock()
        self._configured: tuple[float, bool] | None = None

    def add(self, name: str, role: str, password: str) -> User:
        """Add user ``name``. AlreadyExists for a taken name; InvalidInput for a bad name,
        role or password (empty, too long)."""
        validate_id(name, "user name")
        check_role(role)
        check_password(password)
        entry = json.dumps({"role": role, "hash": _hasher.hash(password)}, sort_keys=True)
        if not self.r.hsetnx(self.keys.dashboard_users, name, entry):
            raise AlreadyExists(f"a dashboard user named {name} exists (remove it first)")
        self._configured = None
        return User(name, role)

    def remove(self, name: str) -> None:
        """Remove user ``name`` (NotFound if there is none); its sessions can act no more
        (the dashboard reads the role again at every action)."""
        validate_id(name, "user name")
        if not self.r.hdel(self.keys.dashboard_users, name):
            raise NotFound(f"no dashboard user named {name}")
        self._configured = None

    def list(self) -> list[User]:
        """Every user's name and role, by name (never a hash)."""
        out = []
        for name, raw in (self.r.hgetall(self.keys.dashboard_users) or {}).items():
            parsed = _parse(raw)
            if parsed is not None:
                out.append(User(str(name), parsed[0]))
        return sorted(out, key=lambda u: u.name)

    def get(self, name: str) -> User | None:
        """The user ``name`` as stored now (None when removed or malformed)."""
        parsed = _parse(self.r.hget(self.keys.dashboard_users, name))
        return User(name, parsed[0]) if parsed else None

    def configured(self) -> bool:
        """Whether the pool has any user (then the dashboard logs in by name and password).
        Cached for `CONFIGURED_TTL` seconds."""
        now = time.monotonic()
        with self._lock:
            cached = self._configured
        if cached is not None and now - cached[0] < CONFIGURED_TTL:
            return cached[1]
        answer = bool(self.r.hlen(self.keys.dashboard_users))
        with self._lock:
            self._configured = (now, answer)
        return answer

    def verify(self, name: str, password: str) -> User | None:
        """The user when ``password`` is theirs, else None. An unknown or malformed name
        costs one argon2 verification as a known one does (no timing hint of which names
        exist)."""
        known = None
        try:
            validate_id(name, "user name")
            known = _parse(self.r.hget(self.keys.dashboard_users, name))
        except InvalidInput:
            pass
        if not password or len(password.encode()) > MAX_PASSWORD_BYTES:
            return None
        try:
            _hasher.verify(known[1] if known else _DUMMY, password)
        except (VerificationError, InvalidHashError):
            return None
        return User(name, known[0]) if known else None
