"""`DeviceWatch`: keeps a running host daemon's devices in step with its device sources
(`deviceq.host.device_sources.DeviceSources`), applying each change to the daemon's shared
state (`deviceq.host.state.HostState`) and to its health checks
(`deviceq.host.health.HealthChecker`)."""

from __future__ import annotations

import logging
import threading

from .device_config import DeviceConfig
from .device_sources import FILE_POLL, DeviceSources
from .health import HealthChecker
from .state import HostState


class DeviceWatch:
    """Keeps a host daemon's devices (`HostState`) and their health checks
    (`HealthChecker`) in step with its `DeviceSources`: `loop` (a thread of its own) polls
    them about every second (at once on SIGHUP: `reload`) and applies what changed, each
    change logged in one line."""

    def __init__(self, state: HostState, health: HealthChecker, sources: DeviceSources | None):
        self.state = state
        self.health = health
        self.sources = sources or DeviceSources(state.settings.devices)
        self.sources.log = lambda level, msg: state.log(level, msg)
        self.wake = threading.Event()
        self.lock = threading.Lock()  # one change applied at a time (the loop, a refusal)
        state.adjust_snapshot = health.joining_snapshot
        state.after_heartbeat = self.after_heartbeat
        state.device_refused = self.refused

    @property
    def dynamic(self) -> bool:
        return self.sources.dynamic

    def reload(self) -> None:
        """SIGHUP: re-read the devices file and run the discoveries now."""
        self.state.log(logging.INFO, "SIGHUP: reading the device sources again")
        self.sources.request_reload()
        self.wake.set()

    def loop(self) -> None:
        while not self.state.closed.is_set():
            if not self.state.stopping.is_set():
                try:
                    self.refresh()
                except Exception:  # noqa: BLE001 - the device list must survive anything
                    self.state.log_exception("device sources failed; keeping the device list")
            self.wake.wait(FILE_POLL)
            self.wake.clear()

    def refresh(self) -> None:
        """Apply the sources' current list; forget retired devices whose runs ended."""
        self.apply(self.sources.poll())
        for did in self.state.forget_retired():
            self.state.log(logging.INFO, "removed device released: nothing runs on it", device=did)

    def apply(self, wanted: list[DeviceConfig]) -> None:
        with self.lock:
            self._apply(wanted)

    def _apply(self, wanted: list[DeviceConfig]) -> None:
        current = {d.device_id: d for d in self.state.served()}
        new = {d.device_id: d for d in wanted}
        # health first for a new device (reported joining from its first heartbeat on)
        for did, dev in new.items():
            old = current.get(did)
            if old is None or old.driver_type != dev.driver_type:
                self.health.device_added(dev)
        ch = self.state.set_devices(wanted)
        for dev in ch.removed:
            self.health.device_removed(dev.device_id)
        for dev in ch.added:
            self.state.log(logging.INFO, "device added", device=dev.device_id,
                           driver_type=dev.driver_type, tags=",".join(dev.tags))  # fmt: skip
        for _old, dev in ch.changed:
            self.state.log(logging.INFO, "device changed: applies to its next task",
                           device=dev.device_id, driver_type=dev.driver_type,
                           tags=",".join(dev.tags))  # fmt: skip
        for dev in ch.removed:
            running = [r for r in ch.stopped if r.device_id == dev.device_id]
            self.state.log(logging.INFO, "device removed" + (": stopping its run, handing "
                           "the task back" if running else ""), device=dev.device_id,
                           **({"task": running[0].task_id} if running else {}))  # fmt: skip

    def after_heartbeat(self) -> None:
        self.health.take_joining()

    def refused(self, device_id: str, why: str) -> None:
        """Redis refused ``device_id`` in a heartbeat: leave it out, apply the list at once."""
        self.sources.refuse(device_id, why)
        self.apply(self.sources.merged())
