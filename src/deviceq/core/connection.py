"""One pool on one Redis connection: the base every client (producer, host, admin,
scheduler) builds on, and `connect`, the one way deviceq opens a Redis client (its URLs are
checked in `redis_urls`, its TLS in `tls`)."""

from __future__ import annotations

import inspect
import os
import ssl
from typing import TYPE_CHECKING, Any

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from .errors import ConfigError, NotFound
from .keys import Keys
from .redirects import FollowingRedis
from .redis_urls import (
    check_redis_url,
    redact_url,
    redis_password,
    url_has_password,
)
from .scripts import Scripts
from .sentinel import connect_sentinel, is_sentinel_url, parse_sentinel_url
from .validation import validate_id

if TYPE_CHECKING:  # (the settings import pydantic_settings: read only when needed)
    from .config import PoolConfig
    from .models import WorkflowDefinition
from .tls import (
    TLSConnection,
    TLSError,
    scheme_is_tls,
    tls_options,
)


class _Retry(Retry):
    """redis-py's ``Retry`` that does not retry a :class:`TLSError` or a refused or missing
    password (``AuthenticationError``) within one call: a certificate or password that was
    not accepted will not be on the next try, and retrying it made a CLI take 3-15 s to say
    so (a daemon's own loop still tries again later)."""

    def call_with_retry(
        self, do: Any, fail: Any, is_retryable: Any = None, with_failure_count: bool = False
    ) -> Any:
        def retryable(exc: Exception) -> bool:
            return not isinstance(exc, (TLSError, redis.AuthenticationError)) and (
                is_retryable is None or bool(is_retryable(exc))
            )

        return super().call_with_retry(do, fail, retryable, with_failure_count)


# redis-py before 6 has no ``is_retryable``: there a TLS failure is retried like the others
_RETRY = _Retry if "is_retryable" in inspect.signature(Retry.call_with_retry).parameters else Retry


def connect(
    url: str,
    *,
    socket_timeout: float = 30.0,
    connect_timeout: float = 5.0,
    retries: int = 3,
    backoff_cap: float = 1.0,
    health_check_interval: int = 30,
    ssl_ca_certs: str | os.PathLike[str] | None = None,
    ssl_certfile: str | os.PathLike[str] | None = None,
    ssl_keyfile: str | os.PathLike[str] | None = None,
    ssl_cert_reqs: str | ssl.VerifyMode | None = None,
    max_connections: int | None = None,
) -> redis.Redis:
    """THE way deviceq opens a Redis client: decoded responses, keepalive, health checks and a
    short retry on a dropped connection. ``socket_timeout`` must exceed the longest blocking
    read made on the client (XREAD/BLPOP wait a few seconds; redis-py's default is 5 s): the
    host daemon uses short ones per purpose. A malformed ``url`` raises ConfigError (see
    :func:`check_redis_url`).

    Redis Cluster: ``url`` may name any node; the client follows ``MOVED`` redirects to the
    node serving the pool (every key of a pool is in one slot), see
    `deviceq.core.redirects`. Redis Sentinel: a
    ``redis+sentinel://HOST:PORT[,HOST:PORT]/SERVICE`` URL follows the service's primary
    across failovers, see `deviceq.core.sentinel`.

    TLS: a ``rediss://`` URL. The server's certificate is verified against ``ssl_ca_certs`` (a
    PEM CA bundle; default: the system's CAs) and must name the URL's host; ``ssl_certfile``
    and ``ssl_keyfile`` (PEM, the key unencrypted) are the client certificate for servers that
    require one (``tls-auth-clients yes``); ``ssl_cert_reqs`` is ``required`` (the default),
    ``optional`` or ``none`` (no verification: tests only), or an ``ssl.VerifyMode``. Each
    may be a keyword argument (paths: ``str`` or ``os.PathLike``), a query option of the URL
    (``rediss://h:6380/0?ssl_ca_certs=/etc/deviceq/ca.pem``) or, for the three files, the
    environment (``DEVICEQ_REDIS_CA``, ``DEVICEQ_REDIS_CERT``, ``DEVICEQ_REDIS_KEY``) when
    neither says: see :func:`tls_options`. The password, when the URL gives none, may come
    from the environment (:func:`redis_password`). ``max_connections``: the most
    connections the client's pool opens (redis-py's default: 100). A missing or unreadable
    file, or one that is not what it should be, raises ConfigError here; a failed handshake
    (a certificate not accepted either way) raises :class:`TLSError` on first use."""
    given = {
        "ssl_ca_certs": ssl_ca_certs,
        "ssl_certfile": ssl_certfile,
        "ssl_keyfile": ssl_keyfile,
        "ssl_cert_reqs": ssl_cert_reqs,
    }
    options: dict[str, Any] = {
        "decode_responses": True,
        "health_check_interval": health_check_interval,
        "socket_keepalive": True,
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "retry": _RETRY(ExponentialBackoff(cap=backoff_cap, base=0.05), retries),
        "retry_on_error": [redis.ConnectionError, redis.TimeoutError],
    }
    if max_connections is not None:
        options["max_connections"] = max_connections
    if is_sentinel_url(check_redis_url(url)):
        if any(v is not None for v in given.values()) or "?" in url:
            raise ConfigError("TLS options are not supported with redis+sentinel:// URLs yet")
        return connect_sentinel(parse_sentinel_url(url, redact_url(url)), **options)
    bare, tls = tls_options(url, given)
    extra: dict[str, Any] = {}
    if scheme_is_tls(bare):
        extra = {"connection_class": TLSConnection, **tls}
    password = None if url_has_password(bare) else redis_password()
    if password is not None:
        extra["password"] = password
    return FollowingRedis.from_url(bare, **options, **extra)


class PoolConnection:
    """A validated pool name, its key layout and its scripts on one Redis client.
    ``priority_warnings``: a priority set while the strategy in force ignores it warns
    (`PriorityIgnored`); a server that reports it its own way
    (the HTTP API) turns it off."""

    priority_warnings: bool = True

    def __init__(self, redis_or_url: redis.Redis | str | None = None, pool: str | None = None):
        settings = None
        if redis_or_url is None or pool is None:  # from the environment
            from .config import Settings

            settings = Settings()
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

    def _server_time_s(self) -> float:
        """The Redis server's clock in seconds (what a delay counts from)."""
        sec, usec = self.redis.time()
        return int(sec) + int(usec) / 1_000_000

    def get_workflow(self, name: str) -> WorkflowDefinition:
        """A stored `WorkflowDefinition` (producers store them; hosts load them to run a
        workflow task). Raises NotFound."""
        from .models import WorkflowDefinition

        validate_id(name, "workflow name")
        raw = self.redis.get(self.keys.workflow(name))
        if raw is None:
            raise NotFound(f"no workflow {name} in pool {self.pool}")
        return WorkflowDefinition.model_validate_json(raw)

    def pin(self) -> None:
        """Send one keyed read, so that a client made from a Redis Cluster node's URL points
        at the node serving this pool (see `deviceq.core.redirects`) before keyless reads
        such as ``SCAN``. Nothing changes on a standalone server."""
        self.redis.exists(self.keys.config)

    def config(self) -> PoolConfig:
        """The pool's settings: stored values over the defaults."""
        from .config import PoolConfig

        stored = self.redis.hgetall(self.keys.config)
        return PoolConfig.model_validate(
            {k: v for k, v in stored.items() if k in PoolConfig.model_fields}
        )

    def close(self) -> None:
        lane = getattr(self.redis, "_dq_lane", None)
        if lane is not None:  # (deviceq.core.lane: its kept connections too)
            lane.close()
        self.redis.close()

    def __enter__(self) -> PoolConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the strategy in force ---------------------------------------------------------------------
# The strategy in force on a pool, as its scheduler leader records it (``leader:strategy``:
# ``NAME:1`` when it orders tasks by priority, ``NAME:0`` when it ignores priority), and the
# notice given when a priority set will not change the order: one line naming the strategy in
# force and how to change it. Before any scheduler recorded one, the default is in force.

DEFAULT_STRATEGY = "fifo_match"  # (deviceq.scheduler.strategies.DEFAULT_STRATEGY)
PRIORITY_STRATEGY = "priority_match"
HOW_TO_CHANGE = f"deviceq scheduler run --strategy {PRIORITY_STRATEGY}"


class PriorityIgnored(UserWarning):
    """A priority was set, but the strategy in force does not order tasks by priority (the
    `Client`'s ``submit``, ``submit_many`` and ``set_priority`` warn with it)."""


def record_strategy(r: redis.Redis, keys: Keys, name: str, honors_priority: bool) -> None:
    """Record the strategy a newly elected leader runs."""
    r.set(keys.leader_strategy, f"{name}:{1 if honors_priority else 0}")


def in_force(r: redis.Redis, keys: Keys) -> tuple[str, bool, bool]:
    """``(name, orders_by_priority, recorded)``: the strategy the last elected leader runs,
    or the default (``recorded`` False) when none was recorded or it cannot be read."""
    try:
        raw = r.get(keys.leader_strategy)
    except redis.ResponseError:  # (a user not allowed to read it)
        raw = None
    if raw:
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        name, _, flag = text.rpartition(":")
        if name:
            return name, flag == "1", True
    return DEFAULT_STRATEGY, False, False


def describe(name: str, honors: bool, recorded: bool) -> str:
    """How ``status`` names the strategy in force."""
    how = "orders by priority" if honors else "ignores priority"
    if not recorded:
        return f"{name} (the default; no scheduler has led yet) {how}"
    return f"{name} {how}"


def priority_ignored(r: redis.Redis, keys: Keys) -> str | None:
    """The one line to give when a priority is set while the strategy in force ignores it;
    None when it orders by priority."""
    name, honors, recorded = in_force(r, keys)
    if honors:
        return None
    which = f"the scheduler runs {name}" if recorded else f"the default strategy {name} is in force"
    return (
        f"priority has no effect: {which}, which runs tasks in submission order; "
        f"to order by priority run `{HOW_TO_CHANGE}`"
    )


def warn_if_ignored(r: redis.Redis, keys: Keys, stacklevel: int = 3) -> str | None:
    """Warn (`PriorityIgnored`) when the strategy in force ignores priority; the line, or
    None."""
    import warnings

    line = priority_ignored(r, keys)
    if line is not None:
        warnings.warn(PriorityIgnored(line), stacklevel=stacklevel)
    return line
