"""The host role: the worker daemon a host runs (`daemon.HostWorker`) and what it is made of —
the host's Redis API (`client.HostClient`), its session identity (`session`), settings
(`settings`), shared state (`state`), upkeep threads (`upkeep`), attempt execution
(`execution`), the `TaskDispatcher` (`dispatcher`) and the runners (`runners`); one process
serving several pools runs a `MultiPoolHost` (`multipool`): a `HostWorker` per pool."""

from .daemon import HostWorker
from .device_config import DeviceConfig
from .dispatcher import DispatchOutcome, TaskDispatcher
from .heartbeat_sync import Heartbeat
from .link import DeviceReport, Renewal, Report, SessionInfo
from .multipool import MultiPoolHost
from .redis_link import HostClient
from .settings import WorkerSettings

__all__ = [
    "DeviceConfig",
    "DeviceReport",
    "DispatchOutcome",
    "Heartbeat",
    "HostClient",
    "HostWorker",
    "MultiPoolHost",
    "Renewal",
    "Report",
    "SessionInfo",
    "TaskDispatcher",
    "WorkerSettings",
]
