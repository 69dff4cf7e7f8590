"""Where a host daemon's devices come from, merged into the one list it serves.

Sources (any combination; their union is the list, an id in two of them is an error):

- static: ``--device ID:DRIVER[:TAGS]`` flags (or ``devices`` of ``--config``); fixed;
- a devices file: ``--devices-file FILE``, a YAML or JSON list of devices with the fields of
  ``--device`` (``ID:DRIVER[:TAGS]`` texts or mappings ``id``, ``driver_type``, ``tags``,
  optional ``serial``); re-read on SIGHUP and when it changes (`DeviceSources.poll` looks at
  its size, mtime and content about every second);
- discovery: ``--discover adb`` (``adb devices -l``: one ``android`` device per serial in
  state ``device``, with the attributes ``sdk``, ``model``, ``release``, ``battery`` and
  ``temperature`` read from each of them at every round: `ADB_PROBE`) or ``--discover
  command:CMD`` (any command, run without a shell, printing one JSON device per line, which
  may carry ``attributes``), run every ``--discover-every`` seconds.

While the daemon runs, a bad devices file, a failing discovery command or a device id given
by two sources is logged (one warning line naming the problem) and the last good list of
that source stays in force; bad lines of a discovery's output are skipped with a warning
naming them. At start a bad devices file, or an id given twice among the flags and the file,
is a ConfigError (nothing is registered). The texts themselves are parsed in `device_lists`."""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from ..core.errors import ConfigError
from ..core.models import DeviceState
from .device_config import DeviceConfig
from .device_lists import (
    ADB_PROBE,
    DeviceSourceError,
    adb_unusable,
    parse_adb_devices,
    parse_adb_probe,
    parse_json_lines,
    read_devices_file,
)

DEFAULT_DISCOVER_EVERY = 5.0
DISCOVER_TIMEOUT = 20.0  # a discovery command running longer is killed (the last list stays)
FILE_POLL = 1.0  # seconds between looks at the devices file
PROBE_TIMEOUT = 5.0  # seconds one device's attribute probe (adb shell) may take
MAX_OUTPUT = 1024 * 1024  # bytes of a discovery command's output read at most

Log = Callable[[int, str], None]


@dataclass(frozen=True)
class DiscoverySpec:
    """``adb`` or ``command:CMD`` (CMD split like a shell would, run without one)."""

    kind: str  # adb | command
    argv: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> DiscoverySpec:
        text = str(text).strip()
        if text == "adb":
            return cls("adb", ("adb", "devices", "-l"))
        kind, sep, cmd = text.partition(":")
        if kind == "command" and sep:
            try:
                argv = tuple(shlex.split(cmd))
            except ValueError as exc:
                raise DeviceSourceError(f"bad --discover {text!r}: {exc}") from None
            if argv:
                return cls("command", argv)
        raise DeviceSourceError(f"bad --discover {text!r}: use adb or command:CMD")

    def __str__(self) -> str:
        return "adb" if self.kind == "adb" else "command:" + shlex.join(self.argv)

    def parse_output(self, text: str) -> tuple[list[DeviceConfig], list[str]]:
        if self.kind == "adb":  # (the unusable ones too: listed offline with their adb state)
            devices, warnings = parse_adb_devices(text)
            return devices + adb_unusable(text, devices), warnings
        return parse_json_lines(text, f"--discover {self}")


def probe_adb(serial: str, timeout: float = PROBE_TIMEOUT) -> str:
    """``adb -s SERIAL shell`` `ADB_PROBE`'s output (DeviceSourceError when it fails)."""
    spec = DiscoverySpec("adb", ("adb", "-s", serial, "shell", ADB_PROBE))
    return run_discovery(spec, timeout)


def run_discovery(spec: DiscoverySpec, timeout: float = DISCOVER_TIMEOUT) -> str:
    """Run a discovery command (no shell, no stdin, the host token not in its environment)
    and return its standard output; ConfigError (one line) when it cannot start, times out
    or exits non-zero."""
    env = {k: v for k, v in os.environ.items() if k != "DEVICEQ_HOST_TOKEN"}
    try:
        proc = subprocess.run(
            list(spec.argv),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            env=env,
            check=False,
        )
    except FileNotFoundError:
        raise DeviceSourceError(f"--discover {spec}: {spec.argv[0]} not found") from None
    except OSError as exc:
        raise DeviceSourceError(f"--discover {spec}: cannot start: {exc.strerror or exc}") from None
    except subprocess.TimeoutExpired:
        raise DeviceSourceError(f"--discover {spec}: timed out after {timeout:g} s") from None
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        why = f": {err[-1][:200]}" if err else ""
        raise DeviceSourceError(f"--discover {spec}: exit code {proc.returncode}{why}")
    return proc.stdout[:MAX_OUTPUT].decode(errors="replace")


@dataclass
class _Discovery:
    spec: DiscoverySpec
    devices: list[DeviceConfig] = field(default_factory=list)  # the last good list
    last_warning: str = ""


class DeviceSources:
    """The devices a host serves, from every source (see the module docstring). The daemon
    asks `poll` for the current merged list (about every second, and at once after
    `request_reload`); ``log`` gets the warnings (one line each, repeated only when they
    change)."""

    def __init__(
        self,
        static: Sequence[DeviceConfig],
        devices_file: str | None = None,
        discover: Iterable[DiscoverySpec] = (),
        discover_every: float = DEFAULT_DISCOVER_EVERY,
        log: Log = lambda level, msg: None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.static = list(static)
        self.devices_file = devices_file
        self.discoveries = [_Discovery(s) for s in discover]
        self.discover_every = discover_every
        self.log = log
        self.clock = clock
        self.file_devices: list[DeviceConfig] = []
        self._file_stamp: tuple[int, int] | None = None
        self._file_hash = ""
        self._next_discovery = 0.0
        self._reload = False
        self._last_merge_warning = ""
        self.refused: dict[str, str] = {}  # device id -> why Redis refused it (another host's)
        if devices_file is not None:
            self.file_devices, data = read_devices_file(devices_file)
            self._file_hash = hashlib.sha256(data).hexdigest()
            self._file_stamp = self._stamp()
            static_ids = {d.device_id for d in self.static}
            for d in self.file_devices:
                if d.device_id in static_ids:
                    raise DeviceSourceError(
                        f"device {d.device_id} is given by --device and in the devices file "
                        f"{devices_file}"
                    )

    @property
    def dynamic(self) -> bool:
        """True when the list may change while the daemon runs."""
        return self.devices_file is not None or bool(self.discoveries)

    def request_reload(self) -> None:
        """Re-read the devices file and run the discoveries at the next `poll` (SIGHUP)."""
        self._reload = True

    def refuse(self, device_id: str, why: str) -> None:
        """Leave ``device_id`` out of the list (Redis refused it: another host owns it)
        until no source gives it any more."""
        if device_id not in self.refused:
            self.refused[device_id] = why
            self.log(logging.WARNING, f"device {device_id} left out: {why}")

    def poll(self) -> list[DeviceConfig]:
        """The current merged list, after looking at the file (when it changed, or on a
        reload) and running the discoveries that are due."""
        reload, self._reload = self._reload, False
        self._poll_file(force=reload)
        now = self.clock()
        if self.discoveries and (reload or now >= self._next_discovery):
            self._next_discovery = now + self.discover_every
            for d in self.discoveries:
                self._discover(d)
        return self.merged()

    def merged(self) -> list[DeviceConfig]:
        """Static devices, then the file's, then each discovery's; an id already given by an
        earlier source is skipped with a warning (the file's duplicates refuse the whole
        file instead, in `_poll_file`)."""
        out: dict[str, DeviceConfig] = {}
        problems: list[str] = []
        sources: list[tuple[str, list[DeviceConfig]]] = [
            ("--device", self.static),
            ("the devices file", self.file_devices),
            *((f"--discover {d.spec}", d.devices) for d in self.discoveries),
        ]
        where: dict[str, str] = {}
        for name, devices in sources:
            for dev in devices:
                if dev.device_id in out:
                    problems.append(
                        f"device {dev.device_id} from {name} is also given by "
                        f"{where[dev.device_id]}: skipped"
                    )
                    continue
                out[dev.device_id] = dev
                where[dev.device_id] = name
        given = set(out)
        for did in list(self.refused):
            if did not in given:
                del self.refused[did]  # no source gives it now: it may come back later
        warning = "; ".join(problems)
        if warning and warning != self._last_merge_warning:
            self.log(logging.WARNING, warning)
        self._last_merge_warning = warning
        return [d for d in out.values() if d.device_id not in self.refused]

    # -- the devices file --------------------------------------------------------------------
    def _stamp(self) -> tuple[int, int] | None:
        assert self.devices_file is not None
        try:
            st = os.stat(self.devices_file)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def _poll_file(self, force: bool = False) -> None:
        if self.devices_file is None:
            return
        stamp = self._stamp()
        if not force and stamp == self._file_stamp:
            return
        self._file_stamp = stamp
        try:
            devices, data = read_devices_file(self.devices_file)
            digest = hashlib.sha256(data).hexdigest()
            if digest == self._file_hash and not force:
                return
            static_ids = {d.device_id for d in self.static}
            for d in devices:
                if d.device_id in static_ids:
                    raise DeviceSourceError(
                        f"devices file {self.devices_file}: device {d.device_id} is also "
                        "given by --device"
                    )
        except ConfigError as exc:
            self.log(logging.WARNING, f"{exc}; keeping the last good device list")
            self._file_hash = ""  # (a later valid content is taken even if it is the old one)
            return
        self._file_hash = digest
        self.file_devices = devices

    # -- discovery ---------------------------------------------------------------------------
    def _discover(self, d: _Discovery) -> None:
        try:
            text = run_discovery(d.spec, min(DISCOVER_TIMEOUT, max(2.0, 4 * self.discover_every)))
        except ConfigError as exc:
            self._warn(d, f"{exc}; keeping the last good device list")
            return
        devices, warnings = d.spec.parse_output(text)
        if d.spec.kind == "adb":
            devices = [self._probe(dev, warnings) for dev in devices]
        self._warn(d, "; ".join(warnings))
        d.devices = devices

    def _probe(self, dev: DeviceConfig, warnings: list[str]) -> DeviceConfig:
        """``dev`` with the attributes its adb probe reads (as it is, with a warning, when
        the probe fails)."""
        if not dev.serial or dev.state is not DeviceState.idle:
            return dev
        try:
            return dev.with_attributes(parse_adb_probe(probe_adb(dev.serial)))
        except ConfigError as exc:
            warnings.append(f"attributes of {dev.device_id} not read: {exc}")
            return dev

    def _warn(self, d: _Discovery, text: str) -> None:
        """Log a discovery's warning once (not again at every poll while it stays the same)."""
        if text and text != d.last_warning:
            self.log(logging.WARNING, text)
        d.last_warning = text
