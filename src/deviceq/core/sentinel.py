"""``redis+sentinel://`` URLs: a client that follows the primary Redis Sentinel names.

``redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]`` names the
sentinels (at least one) and the service they monitor. The password (and user), if any, is
the data nodes' (the sentinels are contacted without one). The client asks the sentinels for
the service's primary and, when a connection to it fails or it answers ``READONLY`` (it was
demoted), asks again: after a failover the same client writes to the new primary (redis-py's
``SentinelConnectionPool``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from .errors import ConfigError
from .redirects import FollowingRedis

SCHEME = "redis+sentinel://"


@dataclass(frozen=True)
class SentinelURL:
    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None


def is_sentinel_url(url: str) -> bool:
    return url.lower().startswith(SCHEME)


def parse_sentinel_url(url: str, shown: str) -> SentinelURL:
    """Parse ``url`` (``shown``: the same, password redacted, for messages); ConfigError
    says what is wrong."""
    rest = url[len(SCHEME) :].partition("?")[0].partition("#")[0]
    userinfo, at, hostpart = rest.rpartition("@")
    username = password = None
    if at:
        user, colon, pw = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if colon else unquote(user)
        if not colon:
            username = None
    hosts, _, path = hostpart.partition("/")
    sentinels = []
    for part in hosts.split(","):
        host, colon, port = part.strip().rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(
                f"invalid Redis URL {shown!r}: each sentinel must be HOST:PORT "
                f"(e.g. redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster)"
            )
        sentinels.append((host, int(port)))
    service, _, db = path.partition("/")
    if not service:
        raise ConfigError(
            f"invalid Redis URL {shown!r}: name the monitored service after the sentinels "
            f"(e.g. redis+sentinel://10.0.0.1:26379/mymaster)"
        )
    if db.strip("/") and not db.strip("/").isdigit():
        raise ConfigError(f"invalid Redis URL {shown!r}: the database must be a number")
    return SentinelURL(
        tuple(sentinels), unquote(service), int(db.strip("/") or 0), username, password
    )


def connect_sentinel(parsed: SentinelURL, **client_kwargs: Any) -> FollowingRedis:
    """A client of the service's current primary; ``client_kwargs`` as for a plain client
    (timeouts, retries, decoding)."""
    sentinel_kwargs: dict[str, Any] = {
        k: client_kwargs[k] for k in ("socket_timeout", "socket_connect_timeout")
        if k in client_kwargs
    }  # fmt: skip
    # one quick retry per sentinel (redis-py's default backs off for seconds): the client asks
    # the next sentinel, and waits out a failover itself (deviceq.core.redirects)
    sentinel_kwargs["retry"] = Retry(ExponentialBackoff(cap=0.2, base=0.05), 1)
    sentinel = Sentinel(list(parsed.sentinels), sentinel_kwargs=sentinel_kwargs)
    client: FollowingRedis = sentinel.master_for(
        parsed.service,
        redis_class=FollowingRedis,
        db=parsed.db,
        username=parsed.username,
        password=parsed.password,
        **client_kwargs,
    )
    return client
