"""How a host daemon is configured: the devices it serves (`DeviceConfig`, ``ID:DRIVER[:TAGS]``
on the command line) and its behaviour (`WorkerSettings`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.errors import ConfigError, InvalidInput
from ..core.models import DeviceState, validate_id, validate_tags
from .client import DeviceReport
from .runners import CommandTemplate, RunnerSpec


@dataclass(frozen=True)
class DeviceConfig:
    """A device this host serves: ``ID:DRIVER[:TAG,TAG]`` on the command line."""

    device_id: str
    driver_type: str
    tags: tuple[str, ...] = ()
    state: DeviceState = DeviceState.idle

    @classmethod
    def parse(cls, text: str) -> DeviceConfig:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise InvalidInput(f"bad device {text!r}: use ID:DRIVER or ID:DRIVER:TAG,TAG")
        tags = validate_tags(parts[2]) if len(parts) == 3 else ()
        return cls(validate_id(parts[0], "device id"), validate_id(parts[1], "driver_type"), tags)

    @classmethod
    def coerce(cls, value: Any) -> DeviceConfig:
        """From ``ID:DRIVER[:TAGS]`` text or a mapping (``id``/``device_id``, ``driver_type``,
        ``tags``, optional ``state``)."""
        if isinstance(value, DeviceConfig):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        if isinstance(value, dict):
            did = value.get("device_id", value.get("id"))
            return cls(
                validate_id(did, "device id"),
                validate_id(value.get("driver_type"), "driver_type"),
                validate_tags(value.get("tags") or ()),
                DeviceState(value.get("state", "idle")),
            )
        raise InvalidInput(f"bad device {value!r}")

    def report(self) -> DeviceReport:
        return DeviceReport(self.device_id, self.driver_type, self.tags, self.state)


@dataclass
class WorkerSettings:
    """How a host worker behaves. Intervals left at None follow the pool's settings:
    heartbeat every ``host_timeout``/3; leases are renewed at a third of each lease's length.
    ``takeover``: fence a live daemon of the same host id instead of refusing to start."""

    host_id: str
    devices: list[DeviceConfig]
    goal_runner: RunnerSpec | None = None  # required: how goal tasks run
    workflow_runner: RunnerSpec = field(default_factory=lambda: RunnerSpec("steps"))
    isolation: str = "auto"
    grace: float = 30.0
    task_timeout: float = 0.0
    stop_grace: float = 5.0
    poll_interval: float = 2.0
    heartbeat_interval: float | None = None
    renew_interval: float | None = None
    socket_timeout: float = 5.0
    device_check: str | None = None
    device_check_interval: float = 30.0
    device_check_timeout: float = 10.0
    recover: bool = True
    takeover: bool = False

    def __post_init__(self) -> None:
        validate_id(self.host_id, "host id")
        if self.goal_runner is None:
            raise ConfigError(
                "say how tasks run: goal_runner=RunnerSpec('command', {'template': ...}) or an "
                "import path; RunnerSpec('sim') only simulates work"
            )
        self.devices = [DeviceConfig.coerce(d) for d in self.devices]
        if not self.devices:
            raise ConfigError("a host needs at least one --device ID:DRIVER[:TAG,TAG]")
        ids = [d.device_id for d in self.devices]
        if len(set(ids)) != len(ids):
            raise ConfigError("device ids must be unique")
        for name in ("grace", "stop_grace", "poll_interval", "socket_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if self.task_timeout < 0:
            raise ConfigError("task_timeout must be >= 0 (0 = no limit)")
        if self.device_check is not None:
            CommandTemplate.parse(self.device_check, ("device_id", "driver_type", "tags"))
            if self.device_check_interval <= 0 or self.device_check_timeout <= 0:
                raise ConfigError("device check interval and timeout must be positive")
