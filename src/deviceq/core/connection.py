"""One pool on one Redis connection: the base every client (producer, host, admin,
scheduler) builds on."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import redis

from .config import PoolConfig, Settings
from .errors import ConfigError, NotFound
from .keys import Keys
from .models import WorkflowDefinition, validate_id
from .scripts import Scripts

URL_SCHEMES = ("redis://", "rediss://", "unix://")


def redact_url(url: str) -> str:
    """``url`` with the password (everything of the user info but the user name) replaced by
    ``***``, for messages and logs. Works on malformed URLs too (no scheme, bad port)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    userinfo, at, hostpart = rest.rpartition("@")
    if not at:
        return url
    user, colon, _ = userinfo.partition(":")
    shown = f"{user}:***" if colon else "***"
    return f"{scheme}{sep}{shown}@{hostpart}"


def check_redis_url(url: object) -> str:
    """Return ``url`` if redis-py can use it (``redis://``, ``rediss://`` or ``unix://``, a
    valid port, a numeric database); raise ConfigError with a one-line reason (the password
    redacted) otherwise. Nothing is contacted."""
    from redis.connection import parse_url

    if not isinstance(url, str) or not url.strip():
        raise ConfigError("the Redis URL is empty: give --redis-url or DEVICEQ_REDIS_URL")
    shown = redact_url(url)
    if not url.lower().startswith(URL_SCHEMES):
        hostport = url.rpartition("@")[2].partition("/")[0] or "localhost:6379"
        raise ConfigError(
            f"invalid Redis URL {shown!r}: it must start with redis://, rediss:// or unix:// "
            f"(e.g. {'redis://' + hostport + '/0'!r})"
        )
    try:
        parse_url(url)
    except ValueError as exc:
        raise ConfigError(f"invalid Redis URL {shown!r}: {exc}") from None
    if not url.lower().startswith("unix://"):
        path = url.partition("://")[2].partition("?")[0].partition("#")[0]
        db = unquote(path.partition("/")[2]) if "/" in path else ""
        if db not in ("", "/") and not db.strip("/").isdigit():
            raise ConfigError(
                f"invalid Redis URL {shown!r}: the database after the host must be a number "
                f"(e.g. /0), not {db!r}"
            )
    return url


def connect(
    url: str,
    *,
    socket_timeout: float = 30.0,
    connect_timeout: float = 5.0,
    retries: int = 3,
    backoff_cap: float = 1.0,
    health_check_interval: int = 30,
) -> redis.Redis:
    """THE way deviceq opens a Redis client: decoded responses, keepalive, health checks and a
    short retry on a dropped connection. ``socket_timeout`` must exceed the longest blocking
    read made on the client (XREAD/BLPOP wait a few seconds; redis-py's default is 5 s): the
    host daemon uses short ones per purpose. A malformed ``url`` raises ConfigError (see
    :func:`check_redis_url`)."""
    from redis.backoff import ExponentialBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(
        check_redis_url(url),
        decode_responses=True,
        health_check_interval=health_check_interval,
        socket_keepalive=True,
        socket_timeout=socket_timeout,
        socket_connect_timeout=connect_timeout,
        retry=Retry(ExponentialBackoff(cap=backoff_cap, base=0.05), retries),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )


class PoolConnection:
    """A validated pool name, its key layout and its scripts on one Redis client."""

    def __init__(self, redis_or_url: redis.Redis | str | None = None, pool: str | None = None):
        settings = Settings() if redis_or_url is None or pool is None else None
        if redis_or_url is None:
            redis_or_url = settings.redis_url  # type: ignore[union-attr]
        self.pool = validate_id(pool if pool is not None else settings.pool, "pool name")  # type: ignore[union-attr]
        self.redis: redis.Redis = (
            connect(redis_or_url) if isinstance(redis_or_url, str) else redis_or_url
        )
        self.keys = Keys(self.pool)
        self.scripts = Scripts(self.redis)

    def _run(self, name: str, args: list[Any]) -> Any:
        return self.scripts.run(name, self.keys.prefix, args)

    def server_time_ms(self) -> int:
        sec, usec = self.redis.time()
        return int(sec) * 1000 + int(usec) // 1000

    def get_workflow(self, name: str) -> WorkflowDefinition:
        """A stored `WorkflowDefinition` (producers store them; hosts load them to run a
        workflow task). Raises NotFound."""
        validate_id(name, "workflow name")
        raw = self.redis.get(self.keys.workflow(name))
        if raw is None:
            raise NotFound(f"no workflow {name} in pool {self.pool}")
        return WorkflowDefinition.model_validate_json(raw)

    def config(self) -> PoolConfig:
        """The pool's settings: stored values over the defaults."""
        stored = self.redis.hgetall(self.keys.config)
        return PoolConfig.model_validate(
            {k: v for k, v in stored.items() if k in PoolConfig.model_fields}
        )

    def close(self) -> None:
        self.redis.close()

    def __enter__(self) -> PoolConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
