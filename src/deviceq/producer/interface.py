"""What a producer calls, over either transport: `Producer`, with `deviceq.producer.client.Client`
straight to Redis and `deviceq.producer.http_client.ApiClient` through ``deviceq api`` as its
two implementations (the same answers, the same typed errors). A transport may offer more
(``Client.find``, ``ApiClient.logs``...); what both offer is declared here, and the checks
both make before a call (`task_specs`) are written here once."""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ..core.errors import InvalidInput
from ..core.events import Event
from ..core.models import ScheduledTask, TaskSpec


def task_specs(
    specs: Iterable[TaskSpec | Mapping[str, Any]],
) -> builtins.list[TaskSpec | Mapping[str, Any]]:
    """``specs`` as a list; InvalidInput for one spec (or a str) given where a list of them
    belongs."""
    if isinstance(specs, str | bytes | Mapping | TaskSpec):
        raise InvalidInput(
            f"submit_many takes a list of task specs, not one {type(specs).__name__}"
        )
    return builtins.list(specs)


class Producer(ABC):
    """Submit, inspect, cancel and wait for the tasks of one pool (see the module
    docstring)."""

    @abstractmethod
    def submit(self, goal: str | None = None) -> str:
        """Enqueue one task and return its id at once (the keywords: `Client.submit`)."""

    @abstractmethod
    def submit_many(self, specs: Iterable[TaskSpec | Mapping[str, Any]]) -> builtins.list[str]:
        """Enqueue many tasks (all checked before any is written); their ids in order."""

    @abstractmethod
    def get(self, task_id: str) -> ScheduledTask:
        """The task with its attempt history. Raises NotFound."""

    @abstractmethod
    def list(self, status: str | None = None, *, limit: int = 100) -> builtins.list[ScheduledTask]:
        """Tasks of one status (every status when None), at most ``limit``."""

    @abstractmethod
    def cancel(self, task_id: str, reason: str = "cancelled by user") -> str:
        """Cancel a task: ``cancelled``, ``requested`` or ``already:STATUS``."""

    @abstractmethod
    def retry(self, task_id: str) -> str:
        """Submit a failed or cancelled task again; returns the new id."""

    @abstractmethod
    def wait(self, task_id: str, timeout: float | None = None) -> ScheduledTask:
        """Block until the task is terminal and return it; TimeoutError after ``timeout``."""

    @abstractmethod
    def events(
        self, since: str = "0-0", *, task: str | None = None, follow: bool = False
    ) -> Iterator[Event]:
        """Transitions from the pool's event stream, oldest first; ``follow`` keeps on."""
