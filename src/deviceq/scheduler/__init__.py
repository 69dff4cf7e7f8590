"""The scheduler role: `TaskScheduler` (one pass, and the daemon), the strategies it plans with
(`strategies`), the bounded snapshot it reads (`snapshot`), planning (`plan`), leadership
(`leadership`), the daemon loop (`daemon`) and the scheduler's Redis API (`client`).
``explain`` is `deviceq.ops.explain`."""

from .client import SchedulerClient
from .strategies import (
    AssignmentStrategy,
    Bucket,
    IdleDevice,
    QueuedTask,
    Snapshot,
    register_strategy,
    registered_strategies,
)
from .task_scheduler import AssignResult, TaskScheduler

__all__ = [
    "AssignResult",
    "AssignmentStrategy",
    "Bucket",
    "IdleDevice",
    "QueuedTask",
    "SchedulerClient",
    "Snapshot",
    "TaskScheduler",
    "register_strategy",
    "registered_strategies",
]
