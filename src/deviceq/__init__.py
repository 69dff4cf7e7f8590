"""deviceq: a Redis-backed distributed work queue that schedules tasks onto device fleets.

The three roles a user knows, over one shared core (`deviceq.core`):

- producers: `Client` (submit, inspect, cancel, wait; store workflows), or, without Redis
  credentials, `ApiClient` (the same producer methods over the HTTP API of ``deviceq api``;
  ``Client("https://...", token=...)`` makes one);
- the scheduler: `TaskScheduler` with a named `AssignmentStrategy` (`register_strategy`);
- hosts: `HostWorker` (the daemon), `HostClient` (its Redis API), `TaskDispatcher` and the
  runners (`Task`, `Outcome`, `RunnerSpec`; a runner is a function or an ``async def``);

and the operator's `PoolAdmin`. Errors are typed (`DeviceqError` and its subclasses).

The names are imported on first use (``deviceq.Client`` imports the producer, not the
scheduler or the host): ``import deviceq`` stays cheap for the command line."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .core import VERSION

__version__ = VERSION

_EXPORTS: dict[str, str] = {
    "AlreadyExists": ".core.errors",
    "ApiClient": ".producer.http_client",
    "ApiError": ".core.http",
    "Assignment": ".core.models",
    "AssignmentStrategy": ".scheduler",
    "Attempt": ".core.models",
    "AuthError": ".core.errors",
    "Busy": ".core.errors",
    "Client": ".producer.client",
    "ConfigError": ".core.errors",
    "Constraints": ".core.models",
    "DeviceConfig": ".host",
    "DeviceOwned": ".core.errors",
    "DeviceReport": ".host",
    "DeviceState": ".core.models",
    "DeviceqError": ".core.errors",
    "FailureKind": ".core.vocabulary",
    "Fenced": ".core.errors",
    "FindResult": ".producer.task_filter",
    "HostClient": ".host",
    "HostWorker": ".host",
    "InvalidInput": ".core.errors",
    "LeaseClock": ".host.runners",
    "NotConfirmed": ".core.errors",
    "NotFound": ".core.errors",
    "Outcome": ".host.runners",
    "PoolAdmin": ".ops.admin",
    "PoolConfig": ".core.config",
    "PooledDevice": ".core.models",
    "QueueFull": ".core.errors",
    "Renewal": ".host",
    "Report": ".host",
    "RunnerSpec": ".host.runners",
    "ScheduledTask": ".core.models",
    "Suite": ".suites.model",
    "SchedulerClient": ".scheduler",
    "SessionActive": ".core.errors",
    "SessionSuperseded": ".core.errors",
    "Settings": ".core.config",
    "Snapshot": ".scheduler",
    "TLSError": ".core.tls",
    "Task": ".host.runners",
    "TaskDispatcher": ".host",
    "TaskFilter": ".producer.task_filter",
    "TaskScheduler": ".scheduler",
    "TaskSpec": ".core.models",
    "TaskStatus": ".core.vocabulary",
    "TenantInfo": ".core.tenants",
    "TenantShare": ".scheduler.strategies",
    "Unmatchable": ".core.errors",
    "WorkerSettings": ".host",
    "WorkflowDefinition": ".core.models",
    "WorkflowStep": ".core.models",
    "register_strategy": ".scheduler",
    "verify": ".ops.verify",
}
"""Each public name -> the module it is defined in (relative to this package)."""

_SUBPACKAGES = frozenset(
    {"api", "artifacts", "cli", "core", "dashboard", "host", "ops", "producer", "scheduler",
     "services"}
)  # fmt: skip

if TYPE_CHECKING:
    from .core.config import PoolConfig, Settings
    from .core.errors import (
        AlreadyExists,
        AuthError,
        Busy,
        ConfigError,
        DeviceOwned,
        DeviceqError,
        Fenced,
        InvalidInput,
        NotConfirmed,
        NotFound,
        QueueFull,
        SessionActive,
        SessionSuperseded,
        Unmatchable,
    )
    from .core.http import ApiError
    from .core.models import (
        Assignment,
        Attempt,
        Constraints,
        DeviceState,
        PooledDevice,
        ScheduledTask,
        TaskSpec,
        WorkflowDefinition,
        WorkflowStep,
    )
    from .core.tenants import TenantInfo
    from .core.tls import TLSError
    from .core.vocabulary import FailureKind, TaskStatus
    from .host import (
        DeviceConfig,
        DeviceReport,
        HostClient,
        HostWorker,
        Renewal,
        Report,
        TaskDispatcher,
        WorkerSettings,
    )
    from .host.runners import LeaseClock, Outcome, RunnerSpec, Task
    from .ops.admin import PoolAdmin
    from .ops.verify import verify
    from .producer.client import Client
    from .producer.http_client import ApiClient
    from .producer.task_filter import FindResult, TaskFilter
    from .scheduler import (
        AssignmentStrategy,
        SchedulerClient,
        Snapshot,
        TaskScheduler,
        register_strategy,
    )
    from .scheduler.strategies import TenantShare
    from .suites.model import Suite


def __getattr__(name: str) -> Any:
    """A public name (or a subpackage) imported on first use, then kept."""
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "AlreadyExists",
    "ApiClient",
    "ApiError",
    "Assignment",
    "AssignmentStrategy",
    "Attempt",
    "AuthError",
    "Busy",
    "Client",
    "ConfigError",
    "TLSError",
    "Constraints",
    "DeviceConfig",
    "DeviceOwned",
    "DeviceReport",
    "DeviceState",
    "DeviceqError",
    "FailureKind",
    "FindResult",
    "Fenced",
    "HostClient",
    "HostWorker",
    "InvalidInput",
    "LeaseClock",
    "NotConfirmed",
    "NotFound",
    "Outcome",
    "PoolAdmin",
    "PoolConfig",
    "PooledDevice",
    "QueueFull",
    "Renewal",
    "Report",
    "RunnerSpec",
    "ScheduledTask",
    "Suite",
    "SchedulerClient",
    "SessionActive",
    "SessionSuperseded",
    "Settings",
    "Snapshot",
    "Task",
    "TaskDispatcher",
    "TaskFilter",
    "TenantInfo",
    "TenantShare",
    "TaskScheduler",
    "TaskSpec",
    "TaskStatus",
    "Unmatchable",
    "WorkerSettings",
    "WorkflowDefinition",
    "WorkflowStep",
    "register_strategy",
    "verify",
]
