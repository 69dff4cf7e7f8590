"""deviceq: a Redis-backed distributed work queue that schedules tasks onto device fleets.

The three roles a user knows, over one shared core (`deviceq.core`):

- producers: `Client` (submit, inspect, cancel, wait; store workflows), or, without Redis
  credentials, `ApiClient` (the same producer methods over the HTTP API of ``deviceq api``;
  ``Client("https://...", token=...)`` makes one);
- the scheduler: `TaskScheduler` with a named `AssignmentStrategy` (`register_strategy`);
- hosts: `HostWorker` (the daemon), `HostClient` (its Redis API), `TaskDispatcher` and the
  runners (`Task`, `Outcome`, `RunnerSpec`);

and the operator's `PoolAdmin`. Errors are typed (`DeviceqError` and its subclasses)."""

from .api_client import ApiClient, ApiError
from .core.config import PoolConfig, Settings
from .core.connection import TLSError
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
from .core.models import (
    Assignment,
    Attempt,
    Constraints,
    DeviceState,
    FailureKind,
    PooledDevice,
    ScheduledTask,
    TaskSpec,
    TaskStatus,
    WorkflowDefinition,
    WorkflowStep,
)
from .core.tenants import TenantInfo
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
from .producer import Client, FindResult, TaskFilter
from .scheduler import (
    AssignmentStrategy,
    SchedulerClient,
    Snapshot,
    TaskScheduler,
    register_strategy,
)
from .scheduler.strategies import TenantShare

__version__ = "0.1.0"

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
