"""deviceq: a Redis-backed distributed work queue that schedules tasks onto device fleets."""

from .client import Client
from .config import PoolConfig, Settings
from .errors import (
    AlreadyExists,
    AuthError,
    Busy,
    ConfigError,
    DeviceOwned,
    DeviceqError,
    Fenced,
    InvalidInput,
    LeaseLost,
    NotFound,
    QueueFull,
    SessionActive,
    SessionSuperseded,
    Unmatchable,
)
from .host import DeviceReport, HostClient, Renewal, Report
from .models import (
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
from .pool import PoolAdmin

__version__ = "0.1.0"

__all__ = [
    "AlreadyExists",
    "Assignment",
    "Attempt",
    "AuthError",
    "Busy",
    "Client",
    "ConfigError",
    "Constraints",
    "DeviceOwned",
    "DeviceReport",
    "DeviceState",
    "DeviceqError",
    "FailureKind",
    "Fenced",
    "HostClient",
    "InvalidInput",
    "LeaseLost",
    "NotFound",
    "PoolAdmin",
    "PoolConfig",
    "PooledDevice",
    "QueueFull",
    "Renewal",
    "Report",
    "ScheduledTask",
    "SessionActive",
    "SessionSuperseded",
    "Settings",
    "TaskSpec",
    "TaskStatus",
    "Unmatchable",
    "WorkflowDefinition",
    "WorkflowStep",
]
