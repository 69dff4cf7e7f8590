"""The scheduler leader lease: several schedulers may run on one pool; the one holding the
lease (``lua/leader.lua``, TTL = pool setting ``leader_ttl``) works, its fencing epoch goes
with every commit, and a deposed leader's commits are refused (``Fenced``)."""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Callable

import redis

from ..core.logs import log
from .client import SchedulerClient

logger = logging.getLogger("deviceq.scheduler")


def default_owner() -> str:
    """A scheduler identity unique per process: ``HOSTNAME-PID-RANDOM`` (id characters only)."""
    host = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname())
    return f"{host.strip('.-_') or 'sched'}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Leadership:
    """One scheduler's view of the leader lease: ``epoch`` (the fencing token) while it
    leads, None otherwise. ``on_elected`` runs whenever this scheduler starts a leadership
    (a new epoch): another scheduler may have worked meanwhile, so caches built while
    leading before are stale."""

    def __init__(
        self,
        store: SchedulerClient,
        owner: str | None = None,
        on_elected: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.owner = owner or default_owner()
        self.epoch: int | None = None
        self.on_elected = on_elected

    @property
    def leads(self) -> bool:
        return self.epoch is not None

    def ttl_ms(self) -> int:
        return max(100, int(self.store.config().leader_ttl * 1000))

    def try_lead(self, ttl_ms: int | None = None) -> bool:
        """Acquire or renew the lease; sets ``epoch`` when this scheduler leads."""
        ans = self.store.lead(self.owner, ttl_ms if ttl_ms is not None else self.ttl_ms())
        fields = {"pool": self.store.pool, "owner": self.owner}
        if ans.leads:
            if self.epoch != ans.epoch:
                log(logger, logging.INFO, "leader elected", epoch=ans.epoch, **fields)
                if self.on_elected is not None:
                    self.on_elected()
            self.epoch = ans.epoch
            return True
        if self.epoch is not None:
            log(
                logger,
                logging.WARNING,
                "lost leadership",
                epoch=self.epoch,
                leader=ans.owner,
                **fields,
            )
        self.epoch = None
        return False

    def deposed(self) -> None:
        """A commit was fenced: another scheduler leads now."""
        log(
            logger,
            logging.WARNING,
            "fenced: another scheduler leads",
            pool=self.store.pool,
            owner=self.owner,
            epoch=self.epoch,
        )
        self.epoch = None

    def release(self) -> bool:
        """Step down if leading (a standby takes over at its next attempt)."""
        was = self.epoch is not None
        self.epoch = None
        try:
            return self.store.step_down(self.owner) and was
        except redis.RedisError:
            return False
