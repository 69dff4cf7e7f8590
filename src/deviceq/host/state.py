"""What a host daemon's threads share (`HostState`): the devices and their local states, the
runs in progress, the host's view of quarantine and drain, the stop signals, and the rule for
giving up (`fatal`) when the daemon may no longer act for its host."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from ..core.errors import DeviceqError, SessionSuperseded
from ..core.logs import log
from ..core.models import DeviceState
from ..core.redirects import UNAVAILABLE
from ..core.tls import TLSError
from .attribute_sync import AttributeSync
from .device_config import DeviceConfig
from .heartbeat_sync import Heartbeat
from .link import DeviceReport
from .run import Run
from .settings import WorkerSettings

LOG = logging.getLogger("deviceq.worker")
TRANSIENT = UNAVAILABLE


def unreachable(exc: BaseException) -> dict[str, str]:
    """Log fields of a transient Redis error: its type, and for a TLS failure what to check
    (a certificate problem is not a network blip; its message names no secret)."""
    if isinstance(exc, TLSError):
        return {"error": type(exc).__name__, "reason": str(exc)}
    return {"error": type(exc).__name__}


EXIT_START_REFUSED = 2  # could not start: bad token, host unknown, a live daemon holds it
EXIT_SUPERSEDED = 3  # another daemon took over this host id
EXIT_REVOKED = 4  # the host was removed or its token rotated while running


@dataclass
class DeviceChanges:
    """What `HostState.set_devices` changed."""

    added: list[DeviceConfig] = field(default_factory=list)
    changed: list[tuple[DeviceConfig, DeviceConfig]] = field(default_factory=list)  # old, new
    removed: list[DeviceConfig] = field(default_factory=list)
    stopped: list[Run] = field(default_factory=list)  # runs on removed devices, told to stop

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed)


@dataclass
class HostState:
    """The shared state of one host daemon (every field guarded by ``lock`` where threads
    write it)."""

    settings: WorkerSettings
    pool: str = ""  # the pool this daemon serves: a field of every log line (none if "")
    devices: dict[str, DeviceConfig] = field(init=False)
    states: dict[str, DeviceState] = field(init=False)  # from the device checks
    lock: threading.Lock = field(default_factory=threading.Lock)
    runs: dict[str, Run] = field(default_factory=dict)  # task id -> run (until reported)
    by_device: dict[str, Run] = field(default_factory=dict)  # device id -> newest run on it
    abandoned: dict[str, str] = field(default_factory=dict)  # device id -> why it is busy
    # devices no longer served whose runner is still stopping: out of every snapshot, never
    # given work; forgotten once nothing runs on them (`forget_retired`)
    retiring: set[str] = field(default_factory=set)
    quarantined: set[str] = field(default_factory=set)
    attributes: AttributeSync = field(default_factory=AttributeSync)  # sent as changes
    remote_draining: bool = False
    lease_ttl: float = 60.0
    host_timeout: float = 30.0
    log_max_bytes: int = 64 << 20  # the pool's, what one attempt may stream to its live log
    stopping: threading.Event = field(default_factory=threading.Event)  # stop claiming, drain
    hurry: threading.Event = field(default_factory=threading.Event)  # skip the grace period
    closed: threading.Event = field(default_factory=threading.Event)  # upkeep threads stop
    changed: threading.Event = field(default_factory=threading.Event)  # a slot freed
    renew_now: threading.Event = field(default_factory=threading.Event)  # a control message
    beat_now: threading.Event = field(default_factory=threading.Event)  # heartbeat at once
    abandon_reports_at: float | None = None
    signalled: str | None = None
    exit_code: int = 0
    fatal_reason: str | None = None
    nudge: Callable[[], None] = lambda: None  # wakes the daemon's blocking waits
    # a run is about to be reported / was reported: (device id, outcome, failure kind) -> the
    # health check policy (deviceq.host.health)
    task_ending: Callable[[str, str, str | None], None] = lambda device, outcome, kind: None
    task_ended: Callable[[str, str, str | None], None] = lambda device, outcome, kind: None
    # the heartbeat's snapshot as sent (joining devices reported busy) / after it got through
    adjust_snapshot: Callable[[list[DeviceReport]], list[DeviceReport]] = lambda reports: reports
    after_heartbeat: Callable[[], None] = lambda: None
    # Redis refused a device (another host owns it): (device id, why) -> leave it out
    device_refused: Callable[[str, str], None] = lambda device, why: None

    def __post_init__(self) -> None:
        self.devices = {d.device_id: d for d in self.settings.devices}
        self.states = {d.device_id: d.state for d in self.settings.devices}

    def context(self) -> dict[str, Any]:
        """The fields every log line of this daemon carries (pool, host)."""
        ctx: dict[str, Any] = {"pool": self.pool} if self.pool else {}
        ctx["host"] = self.settings.host_id
        return ctx

    def log(self, level: int, msg: str, **fields: Any) -> None:
        if LOG.isEnabledFor(level):  # (most per-task lines are DEBUG: nothing is built)
            log(LOG, level, msg, **{**self.context(), **fields})

    @staticmethod
    def debugging() -> bool:
        """Are DEBUG lines logged (a per-task line's fields are then worth building)?"""
        return LOG.isEnabledFor(logging.DEBUG)

    def log_exception(self, msg: str, **fields: Any) -> None:
        """Log ``msg`` at ERROR with the exception being handled (and this daemon's fields)."""
        LOG.exception(msg, extra={"fields": {**self.context(), **fields}})

    def free_devices(self) -> list[str]:
        """Devices with no run, no abandoned runner, not quarantined, idle by their check."""
        with self.lock:  # (names bound once: the main loop asks before each claim)
            running, abandoned, quarantined, retiring = (
                self.by_device,
                self.abandoned,
                self.quarantined,
                self.retiring,
            )
            states, idle = self.states, DeviceState.idle
            return [
                d
                for d in self.devices
                if d not in running
                and d not in abandoned
                and d not in quarantined
                and d not in retiring
                and states[d] is idle
            ]

    def active_runs(self) -> list[Run]:
        with self.lock:
            return list(self.runs.values())

    def snapshot(self) -> list[DeviceReport]:
        """The device snapshot a heartbeat sends. Devices running deviceq tasks are reported
        idle (their reservation protects them); busy = in use outside deviceq or by a runner
        that did not stop; offline = broken (from the device check)."""
        with self.lock:
            abandoned = dict(self.abandoned)
            devices = [(d, self.states[d.device_id]) for d in self.served_locked()]
        out = []
        for d, state in devices:
            reason = ""
            if d.device_id in abandoned:
                state, reason = DeviceState.busy, abandoned[d.device_id]
            elif state is DeviceState.busy:
                reason = "in use outside deviceq (device check)"
            elif state is DeviceState.offline:
                reason = d.reason or "device check failed"
            out.append(DeviceReport(d.device_id, d.driver_type, d.tags, state, reason))
        return out

    def served_locked(self) -> list[DeviceConfig]:
        """The devices this host serves now (not the retiring ones); hold ``lock``."""
        return [d for did, d in self.devices.items() if did not in self.retiring]

    def served(self) -> list[DeviceConfig]:
        with self.lock:
            return self.served_locked()

    def set_devices(self, wanted: list[DeviceConfig]) -> DeviceChanges:
        """Serve ``wanted`` from now on. New devices start idle (by their local check); a
        changed one (tags, driver type, serial) applies to its next task (a running task keeps
        what it was given); a removed one is retired: out of the snapshot and of service at
        once, its run (if any) stopped with reason ``removed`` (handed back, like a drain),
        forgotten once nothing runs on it. A retiring device given again is served again."""
        new = {d.device_id: d for d in wanted}
        ch = DeviceChanges()
        with self.lock:
            for did, dev in new.items():
                old = self.devices.get(did)
                if old is None or did in self.retiring:
                    ch.added.append(dev)
                    self.retiring.discard(did)
                    self.states[did] = dev.state
                elif old != dev:
                    ch.changed.append((old, dev))
                    if old.state != dev.state:  # (its source says it is usable now, or not)
                        self.states[did] = dev.state
                self.devices[did] = dev
            for did in list(self.devices):
                if did in new or did in self.retiring:
                    continue
                ch.removed.append(self.devices[did])
                self.retiring.add(did)
                self.states[did] = DeviceState.offline
                run = self.by_device.get(did)
                if run is not None and not run.ended.is_set():
                    ch.stopped.append(run)
        for run in ch.stopped:
            run.stop("removed")
        self.forget_retired()
        if ch:
            self.beat_now.set()
            self.changed.set()
        return ch

    def forget_retired(self) -> list[str]:
        """Forget the retiring devices nothing runs on any more; returns their ids."""
        with self.lock:
            done = [d for d in self.retiring if d not in self.by_device and d not in self.abandoned]
            for did in done:
                self.retiring.discard(did)
                self.devices.pop(did, None)
                self.states.pop(did, None)
        return done

    def apply_heartbeat(self, hb: Heartbeat) -> None:
        """Take the quarantine set and the operator's drain flag from a heartbeat answer."""
        q = set(hb.quarantined) & set(self.devices)
        with self.lock:
            added, removed = q - self.quarantined, self.quarantined - q
            self.quarantined = q
        for d in sorted(added):
            self.log(
                logging.WARNING,
                "device quarantined: no work until released (deviceq device unquarantine)",
                device=d,
            )
        for d in sorted(removed):
            self.log(logging.INFO, "device back in service", device=d)
        if added or removed:
            self.changed.set()
        if hb.draining != self.remote_draining:
            self.remote_draining = hb.draining
            self.changed.set()
            if not self.stopping.is_set():
                self.log(
                    logging.INFO, "host drained by an operator" if hb.draining else "host undrained"
                )

    def retry(
        self,
        what: str,
        fn: Callable[[], Any],
        until: Callable[[], bool],
        never: tuple[type[BaseException], ...] = (),
    ) -> Any:
        """Call ``fn`` until it answers (transient Redis errors are retried with backoff) or
        ``until()`` says give up (returns None then). A refused password is not transient, nor
        is any error of ``never`` (raised at once)."""
        delay = 0.05
        fatal: tuple[type[BaseException], ...] = (redis.AuthenticationError, *never)
        while True:
            try:
                return fn()
            except fatal:
                raise
            except TRANSIENT as exc:
                if until():
                    return None
                self.log(
                    logging.WARNING,
                    f"{what}: Redis unreachable, retrying",
                    **unreachable(exc),
                )
                time.sleep(delay)
                delay = min(1.0, delay * 2)

    def give_up_reports(self) -> bool:
        """True once undelivered reports should be abandoned (fatal, or past the drain)."""
        return self.fatal_reason is not None or (
            self.abandon_reports_at is not None and time.monotonic() > self.abandon_reports_at
        )

    def fatal(self, exc: DeviceqError) -> None:
        """This daemon may no longer act for its host (superseded by another daemon, host
        removed, token rotated): stop every runner without reporting, and exit non-zero."""
        if self.fatal_reason is not None:
            return
        host = self.settings.host_id
        if isinstance(exc, SessionSuperseded):
            code, why = EXIT_SUPERSEDED, f"another daemon took over host {host}"
        else:
            code, why = EXIT_REVOKED, f"host {host} can no longer act"
        self.fatal_reason = f"{why}: {exc}"
        self.exit_code = code
        self.log(logging.ERROR, f"{self.fatal_reason}; stopping runners and exiting")
        for run in self.active_runs():
            run.stop("lost")
        self.hurry.set()
        self.stopping.set()
        self.changed.set()
        self.renew_now.set()
        threading.Thread(target=self.nudge, daemon=True).start()
