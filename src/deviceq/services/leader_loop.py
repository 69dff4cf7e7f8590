"""A background look that only the leading scheduler takes: `LeaderLoop` runs ``tick()``
every ``every`` seconds in a daemon thread while ``epoch()`` (the scheduler's leader epoch;
None while this process does not lead) says so. A Redis outage or one bad item is logged and
the next tick tries again: the loop itself never dies; ``stop()`` ends it at its next wait."""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import redis


class LeaderLoop(ABC):
    """The loop of a leader-only service; a subclass sets `NAME` (its thread's and its log
    lines' name) and `LOG`, and defines ``tick()`` and the attributes ``epoch``, ``every``
    and ``stopping`` (dataclass fields in the services that use it)."""

    NAME: ClassVar[str]
    LOG: ClassVar[logging.Logger]
    epoch: Callable[[], int | None]
    every: float
    stopping: threading.Event

    @abstractmethod
    def tick(self) -> Any:
        """One look (the service's work while this scheduler leads)."""

    def thread_name(self) -> str:
        return self.NAME

    def start(self) -> threading.Thread:
        th = threading.Thread(target=self.run, name=self.thread_name(), daemon=True)
        th.start()
        return th

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                if self.epoch() is not None:
                    self.tick()
            except redis.RedisError as exc:
                self.LOG.warning("%s: redis unreachable: %s", self.NAME, exc)
            except Exception:  # noqa: BLE001 - the loop never dies of one bad item
                self.LOG.exception("%s: look failed", self.NAME)
            self.stopping.wait(self.every)
