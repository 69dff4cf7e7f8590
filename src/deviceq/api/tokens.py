"""API tokens of the HTTP service (``deviceq api token``): stored only as digests.

``api_tokens`` maps the sha256 digest (hex) of a token to ``{name, role, created_at}``;
``api_token_names`` maps a name to its digest (to refuse a taken name and to remove one).
A token is shown once, when it is made; nothing in Redis lets anyone read it back."""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass

import redis

from ..core.errors import AlreadyExists, InvalidInput, NotFound
from ..core.keys import Keys
from ..core.validation import validate_id

ROLES = ("producer", "operator")
"""``producer``: the producer protocol; ``operator``: that too, and the operator routes."""

TOKEN_PREFIX = "dqa_"
MAX_TOKEN_CHARS = 200  # a longer Authorization value is refused before it is hashed


def digest(token: str) -> str:
    """The stored form of a token: its sha256, hex."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class TokenInfo:
    """What is known of a token: its name, its role and when it was made (ms, Redis time)."""

    name: str
    role: str
    created_at: int

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "role": self.role, "created_at": self.created_at}


def _check_role(role: str) -> str:
    if role not in ROLES:
        raise InvalidInput(f"unknown role {role!r}; one of: {', '.join(ROLES)}")
    return role


class TokenStore:
    """The API tokens of one pool."""

    def __init__(self, r: redis.Redis, keys: Keys) -> None:
        self.r = r
        self.keys = keys

    def add(self, name: str, role: str) -> str:
        """Make a token for ``name`` with ``role`` and return it (the only time it is seen).
        Raises AlreadyExists for a taken name, InvalidInput for a bad name or role."""
        validate_id(name, "token name")
        _check_role(role)
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        dig = digest(token)
        sec, usec = self.r.time()
        info = TokenInfo(name, role, int(sec) * 1000 + int(usec) // 1000)
        with self.r.pipeline(transaction=True) as pipe:
            pipe.watch(self.keys.api_token_names)
            if pipe.hexists(self.keys.api_token_names, name):
                raise AlreadyExists(f"an API token named {name} exists (remove it first)")
            pipe.multi()
            pipe.hset(self.keys.api_token_names, name, dig)
            pipe.hset(self.keys.api_tokens, dig, json.dumps(info.as_dict(), sort_keys=True))
            try:
                pipe.execute()
            except redis.WatchError:
                raise AlreadyExists(f"an API token named {name} was just added") from None
        return token

    def list(self) -> list[TokenInfo]:
        """Every token's name, role and creation time, by name (never a token or digest)."""
        out = [_parse(raw) for raw in self.r.hvals(self.keys.api_tokens)]
        return sorted((t for t in out if t is not None), key=lambda t: t.name)

    def remove(self, name: str) -> None:
        """Revoke the token ``name`` (NotFound if there is none)."""
        validate_id(name, "token name")
        dig = self.r.hget(self.keys.api_token_names, name)
        if dig is None:
            raise NotFound(f"no API token named {name}")
        pipe = self.r.pipeline(transaction=True)
        pipe.hdel(self.keys.api_token_names, name)
        pipe.hdel(self.keys.api_tokens, str(dig))
        pipe.execute()

    def lookup(self, token: str) -> TokenInfo | None:
        """The token's info, or None when it is not a current token."""
        if not token or len(token) > MAX_TOKEN_CHARS:
            return None
        dig = digest(token)
        info = _parse(self.r.hget(self.keys.api_tokens, dig))
        if info is None:
            return None
        current = self.r.hget(self.keys.api_token_names, info.name)
        if current is None or not hmac.compare_digest(str(current), dig):
            return None
        return info


def _parse(raw: object) -> TokenInfo | None:
    if not isinstance(raw, str):
        return None
    try:
        d = json.loads(raw)
        return TokenInfo(str(d["name"]), _check_role(str(d["role"])), int(d["created_at"]))
    except (ValueError, KeyError, TypeError, InvalidInput):
        return None
