"""What every API route gets: the pool's Redis connection and the service's limits."""

from __future__ import annotations

from dataclasses import dataclass

import redis

from ..core.keys import Keys

MAX_BODY = 1024 * 1024  # bytes of a request body at most (a submit of many tasks fits)
MAX_WAIT = 30.0  # seconds a long poll (wait, claim) holds a request at most


@dataclass
class ApiContext:
    """One pool served over HTTP: ``redis`` (decode_responses=True) reaches it; ``max_body``
    and ``max_wait`` bound every request."""

    redis: redis.Redis
    pool: str
    max_body: int = MAX_BODY
    max_wait: float = MAX_WAIT

    @property
    def keys(self) -> Keys:
        return Keys(self.pool)
