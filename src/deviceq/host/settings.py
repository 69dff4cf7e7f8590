"""How a host daemon is configured: its behaviour (`WorkerSettings`), with the devices it serves
(`DeviceConfig`, ``ID:DRIVER[:TAGS]`` on the command line, from `device_config`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import ConfigError, InvalidInput
from ..core.validation import validate_id
from .device_config import DeviceConfig
from .device_sources import DeviceSourceError, DeviceSources, DiscoverySpec
from .health_checks import PythonCheckSpec, check_spec
from .runners import CommandTemplate, RunnerSpec

DEVICE_CHECK_PLACEHOLDERS = ("device_id", "driver_type", "tags", "serial")
"""The placeholders of ``--device-check`` (``{serial}``: the device's serial, else its id)."""

MIN_BYTE_LIMIT, MAX_BYTE_LIMIT = 64 << 10, 1 << 40
"""The range of ``live_log_budget`` and ``log_file_max``."""

HEALTH_PLACEHOLDERS = ("device_id", "driver_type", "tags", "host_id")
"""The placeholders of a health check's command template (validated ids: safe anywhere)."""


def parse_health_checks(value: Any) -> dict[str, str | PythonCheckSpec]:
    """Health checks per driver type, from ``DRIVER=CHECK`` texts (``--health-check``,
    repeatable) or a mapping driver -> check (a config file). A check is a command template,
    split once and checked now like the command runner's (`CommandTemplate`), with the
    placeholders ``{device_id}`` ``{driver_type}`` ``{tags}`` ``{host_id}``; or
    ``python:package.module:callable`` (in a mapping also a callable), resolved now like a
    runner (`deviceq.host.health_checks`). ConfigError for a missing ``=``, a malformed
    driver type, a driver given twice, a bad template or a Python check that cannot be
    loaded."""
    if value is None or value == () or value == []:
        return {}
    items: list[tuple[str, Any]]
    if isinstance(value, Mapping):
        items = [(str(k), v) for k, v in value.items()]
    else:
        texts = [value] if isinstance(value, str) else list(value)
        items = []
        for text in texts:
            driver, sep, template = str(text).partition("=")
            if not sep or not driver.strip() or not template.strip():
                raise ConfigError(
                    f"bad --health-check {text!r}: use DRIVER=TEMPLATE, e.g. "
                    "android='adb -s {device_id} get-state', or "
                    "DRIVER=python:package.module:callable"
                )
            items.append((driver.strip(), template))
    out: dict[str, str | PythonCheckSpec] = {}
    for driver, check in items:
        try:
            validate_id(driver, "driver_type")
        except InvalidInput as exc:
            raise ConfigError(f"bad --health-check driver type {driver!r}: {exc}") from None
        if driver in out:
            raise ConfigError(f"--health-check {driver}=... is given twice")
        try:
            spec = check_spec(check)
        except ConfigError as exc:
            raise ConfigError(f"--health-check {driver}={check}: {exc}") from None
        if isinstance(spec, str):
            try:
                CommandTemplate.parse(spec, HEALTH_PLACEHOLDERS)
            except ConfigError as exc:
                why = str(exc).replace(" and {goal:shell}", "")  # (no goal in a health check)
                raise ConfigError(f"--health-check {driver}: {why}") from None
        out[driver] = spec
    return out


@dataclass
class WorkerSettings:
    """How a host worker behaves. Intervals left at None follow the pool's settings:
    heartbeat every ``host_timeout``/3; leases are renewed at a third of each lease's length
    (on the heartbeat when one comes before that: `deviceq.host.upkeep`).
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
    report_linger: float = 0.005  # how long a report waits for others (deviceq.host.reporter)
    heartbeat_interval: float | None = None
    renew_interval: float | None = None
    socket_timeout: float = 5.0
    device_check: str | None = None
    device_check_interval: float = 30.0
    device_check_timeout: float = 10.0
    # health checks per driver type (DRIVER=TEMPLATE or DRIVER=python:PATH texts, or a
    # mapping; a dict driver -> template | PythonCheckSpec after init):
    # when a device joins, every health_every_tasks tasks, every health_every_seconds and
    # after an infrastructure failure (deviceq.host.health)
    health_check: Any = field(default_factory=dict)
    health_every_tasks: int = 0
    health_every_seconds: float = 0.0
    health_check_timeout: float = 60.0
    recover: bool = True
    takeover: bool = False
    # devices that change while the daemon runs (deviceq.host.device_sources): a YAML/JSON
    # list re-read on SIGHUP and when it changes, and discovery providers (adb, command:CMD)
    devices_file: str | None = None
    discover: Any = ()
    discover_every: float = 5.0
    sources: Any = field(init=False, default=None, repr=False)
    # through the HTTP service `deviceq api` instead of Redis (deviceq.host.http_link):
    # its address and, for https, the CA bundle its certificate is checked against
    api_url: str | None = None
    api_ca: str | None = None
    # artifacts (deviceq.host.artifacts): the store URL (None: the pool's artifact_store, else
    # a file store under state_dir), its fsspec options (KEY=VALUE texts or a mapping), and
    # the folder of the attempts' folders and the upload spool
    artifact_store: str | None = None
    artifact_store_option: Any = ()
    state_dir: str | None = None
    # bytes the live logs of the host's running attempts may stream together (each attempt
    # also stops at the pool's log_max_bytes), and of an attempt's log.txt kept (the rest
    # cut, and the cut recorded in its artifacts_error)
    live_log_budget: int = 256 << 20
    log_file_max: int = 64 << 20

    def __post_init__(self) -> None:
        validate_id(self.host_id, "host id")
        if self.goal_runner is None:
            raise ConfigError(
                "say how tasks run: goal_runner=RunnerSpec('command', {'template': ...}) or an "
                "import path; RunnerSpec('sim') only simulates work"
            )
        self.devices = [DeviceConfig.coerce(d) for d in self.devices]
        ids = [d.device_id for d in self.devices]
        if len(set(ids)) != len(ids):
            raise ConfigError("device ids must be unique")
        self._device_sources()
        self._api()
        self._artifacts()
        self._byte_limits()
        self._seconds()
        for name in ("grace", "stop_grace", "poll_interval", "socket_timeout"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if not 0 <= self.report_linger <= 1:
            raise ConfigError("report_linger must be between 0 and 1 (seconds)")
        if self.task_timeout < 0:
            raise ConfigError("task_timeout must be >= 0 (0 = no limit)")
        self.health_check = parse_health_checks(self.health_check)
        try:
            self.health_every_tasks = int(self.health_every_tasks or 0)
            self.health_every_seconds = float(self.health_every_seconds or 0.0)
            self.health_check_timeout = float(self.health_check_timeout)
        except (TypeError, ValueError):
            raise ConfigError("health check intervals and timeout must be numbers") from None
        if self.health_every_tasks < 0 or self.health_every_seconds < 0:
            raise ConfigError("--health-every-tasks and --health-every-seconds must be >= 0")
        if not self.health_check_timeout > 0:
            raise ConfigError("--health-check-timeout must be positive")
        if not self.health_check and (self.health_every_tasks or self.health_every_seconds):
            raise ConfigError(
                "--health-every-tasks/--health-every-seconds need a --health-check DRIVER=TEMPLATE"
            )
        if self.device_check is not None:
            CommandTemplate.parse(self.device_check, DEVICE_CHECK_PLACEHOLDERS)
            if self.device_check_interval <= 0 or self.device_check_timeout <= 0:
                raise ConfigError("device check interval and timeout must be positive")

    def _seconds(self) -> None:
        """The durations as finite numbers (a config file may give any text): ConfigError
        naming the setting, else each one a float (optional ones may stay None)."""
        names = ("grace", "task_timeout", "stop_grace", "poll_interval", "report_linger",
                 "socket_timeout", "device_check_interval", "device_check_timeout",
                 "heartbeat_interval", "renew_interval")  # fmt: skip
        for name in names:
            value = getattr(self, name)
            if value is None and name in ("heartbeat_interval", "renew_interval"):
                continue
            try:
                number = float(value)
            except (TypeError, ValueError):
                raise ConfigError(f"{name} must be a number of seconds, not {value!r}") from None
            if not math.isfinite(number):
                raise ConfigError(f"{name} must be a finite number of seconds, not {value!r}")
            setattr(self, name, number)

    def _byte_limits(self) -> None:
        """``live_log_budget`` and ``log_file_max``: whole numbers of bytes, 64 KiB to 1 TiB
        (a bool or a text is refused: ConfigError naming the setting)."""
        for name in ("live_log_budget", "log_file_max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name} must be a whole number of bytes, not {value!r}")
            if not MIN_BYTE_LIMIT <= value <= MAX_BYTE_LIMIT:
                raise ConfigError(f"{name} must be from {MIN_BYTE_LIMIT:,} to "
                                  f"{MAX_BYTE_LIMIT:,} bytes, not {value:,}")  # fmt: skip

    def _artifacts(self) -> None:
        """Check the artifact store settings (ConfigError: one line); nothing is contacted."""
        from ..artifacts.store import check_store_settings

        self.artifact_store_option = check_store_settings(
            self.artifact_store, self.artifact_store_option
        )

    def _api(self) -> None:
        """Check ``api_url``/``api_ca`` (ConfigError: one line); nothing is contacted."""
        from ..core.http import check_api_url, tls_context

        if self.api_url is None:
            if self.api_ca is not None:
                raise ConfigError("--api-ca applies with --api-url")
            return
        self.api_url = check_api_url(self.api_url)
        if self.api_ca is not None:
            if not self.api_url.startswith("https://"):
                raise ConfigError("--api-ca applies to an https:// API URL")
            self.api_ca = str(self.api_ca)
            tls_context(self.api_ca)

    def _device_sources(self) -> None:
        """Check ``devices_file``/``discover``/``discover_every`` and read the devices file
        (ConfigError: one line); ``devices`` becomes the starting list (the flags' and the
        file's devices; discovered ones join once the daemon runs), ``sources`` what the daemon
        asks for the current list."""
        texts = [self.discover] if isinstance(self.discover, str) else list(self.discover or ())
        specs = [DiscoverySpec.parse(t) for t in texts]
        if len({str(s) for s in specs}) != len(specs):
            raise DeviceSourceError("the same --discover is given twice")
        try:
            self.discover_every = float(self.discover_every)
        except (TypeError, ValueError):
            raise DeviceSourceError("--discover-every must be a number of seconds") from None
        if not self.discover_every > 0:
            raise DeviceSourceError("--discover-every must be positive")
        if self.devices_file is not None:
            self.devices_file = str(self.devices_file)
        self.sources = DeviceSources(self.devices, self.devices_file, specs, self.discover_every)
        self.discover = tuple(str(s) for s in specs)
        if not self.sources.dynamic and not self.devices:
            raise ConfigError(
                "a host needs at least one --device ID:DRIVER[:TAG,TAG] (or --devices-file "
                "FILE, --discover adb|command:CMD)"
            )
        self.devices = self.sources.merged()
