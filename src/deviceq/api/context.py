"""What every API route gets: the pool's Redis connection and the service's limits."""

from __future__ import annotations

from dataclasses import dataclass, field

import redis
from redis import Redis

from ..core.keys import Keys
from .limits import LongPolls

MAX_BODY = 1024 * 1024  # bytes of a request body at most (a submit of many tasks fits)
MAX_WAIT = 30.0  # seconds a long poll (wait, claim) holds a request at most


@dataclass
class ApiContext:
    """One pool served over HTTP: ``redis`` (decode_responses=True) reaches it; ``max_body``
    and ``max_wait`` bound every request. ``blocking_redis``: a client of the same server on a
    connection pool of its own for the blocking calls (default: ``redis``); ``long_polls``:
    the bounds on those calls (`deviceq.api.limits`)."""

    redis: redis.Redis
    pool: str
    max_body: int = MAX_BODY
    max_wait: float = MAX_WAIT
    blocking_redis: Redis | None = None
    long_polls: LongPolls = field(default_factory=LongPolls)

    @property
    def blocker(self) -> Redis:
        """The client blocking reads (BLPOP, XREAD BLOCK) run on."""
        return self.blocking_redis if self.blocking_redis is not None else self.redis

    @property
    def keys(self) -> Keys:
        return Keys(self.pool)
