"""Device health checks on a host (``deviceq host run --health-check DRIVER=TEMPLATE`` or
``DRIVER=python:package.module:callable``): the policy of when a device's check is due, and
running the checks in the background (a thread per running check) so that no device waits for
another's.

A check of a device is due when the device joins (first seen by this daemon), every
``health_every_tasks`` tasks run on it, every ``health_every_seconds`` seconds, and after an
infrastructure failure on it (a task reported failed with failure_kind ``infrastructure``,
``runner_error`` or ``timeout``). An unhealthy device is checked again every
``health_every_seconds`` (`UNHEALTHY_RECHECK` seconds when that is not set) until a check
passes.

A check goes through the same reservation as a task (``lua/device_health.lua``): `begin`
takes the device only while it holds no lease and is not booked by a person, and takes it out
of the idle candidates; no task can be assigned to it until the result is recorded. When a
check falls due by a run on the device (every N tasks, an infrastructure failure) or while it
runs (every S seconds), the device is marked before that run's report (``next``: it is
``checking`` at once), so the report does not put it back among the idle candidates, where a
busy scheduler would take it for the next task first; ``begin`` takes it once the run has
ended. When ``begin`` is refused (a task holds the device) the check stays due and is tried
again when the device is free. The host starts a check only on a device with no run of its own
(and no runner that did not stop), so a check never overlaps a task on the device.

A check is a command template or a Python callable (`deviceq.host.health_checks`: how each
kind runs and what it answers), called with a `Task` for the device (``device_id``,
``driver_type``, ``tags``, ``host_id``, a ``cancel`` event and a lease clock running out at
``health_check_timeout``). It answers healthy, or unhealthy with a reason (``exit code 1: no
usb``, ``raised OSError: ...``, ``timed out after 60 s``); the reason and the output's last
2,000 bytes are kept on the device hash (``deviceq device show``), the host token never. A
Python check that times out cannot be killed: the device stays out of service, and is not
checked again, until that call returns."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, replace

from ..core.errors import AuthError, DeviceqError, NotFound, SessionSuperseded
from ..core.models import DeviceState
from ..core.vocabulary import DEVICE_FAULT_KINDS
from .attribute_sync import attributes_in_output
from .device_config import DeviceConfig
from .health_checks import CheckResult, HealthCheck, build_check
from .link import DeviceReport, HostLink
from .runners import LeaseClock, Task
from .state import TRANSIENT, HostState, unreachable

JOINING = "joining: health check pending"  # a new device's state reason until its first check
UNHEALTHY_RECHECK = 60.0  # seconds between checks of an unhealthy device by default
INFRA_KINDS = frozenset(DEVICE_FAULT_KINDS)  # a failure of these kinds: the device is checked
LOOP_WAIT = 0.5  # longest wait of the policy loop between looks at the devices
REFUSED_RETRY = 1.0  # seconds before a refused `begin` is tried again
MARK_ERRORS: tuple[type[Exception], ...] = (DeviceqError, *TRANSIENT)


@dataclass
class DeviceHealth:
    """What the host knows about one checked device (times are ``time.monotonic()``)."""

    last_check: float | None = None  # end of the last check (None: not checked yet)
    healthy: bool | None = None  # its last result
    tasks: int = 0  # tasks ended on it since its last check
    infra: bool = False  # an infrastructure failure on it since its last check
    running: bool = False  # a check is running (or being started)
    begun: bool = False  # `begin` was accepted already (the check has yet to run)
    retry_at: float = 0.0  # after a refused `begin` (a lease or a booking holds the device)
    pending: str | None = None  # marked with `next` before a report: why its check is due


class HealthChecker:
    """The health checks of one host daemon: `task_ended` (from the executor) feeds the
    policy, `loop` (a thread of its own) starts the checks that are due."""

    def __init__(self, state: HostState, host: HostLink) -> None:
        self.state = state
        self.settings = state.settings
        self.host = host
        s = self.settings
        self.by_driver: dict[str, HealthCheck] = {
            driver: build_check(spec, timeout=s.health_check_timeout, term_grace=s.stop_grace)
            for driver, spec in s.health_check.items()
        }
        self.devices = {
            d.device_id: DeviceHealth() for d in s.devices if d.driver_type in self.by_driver
        }
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.closing = False  # the daemon is closing: running checks are stopped
        self.threads: dict[str, threading.Thread] = {}
        self.cancels: dict[str, threading.Event] = {}  # device id -> its running check's
        self.checks = 0  # checks run (tests, logs)
        self.joining: set[str] = set()  # joined while running, not taken for their check yet

    @property
    def enabled(self) -> bool:
        return bool(self.devices)

    # -- policy ------------------------------------------------------------------------------
    def task_ending(self, device_id: str, outcome: str, failure_kind: str | None) -> None:
        """A run on ``device_id`` is about to be reported: when its check will be due once the
        run is reported, mark the device now (``next``: it is ``checking`` at once), so that
        the report does not put it back among the idle candidates, where a busy scheduler would
        take it for the next task before the check could begin."""
        h = self.devices.get(device_id)
        if h is None or self.state.stopping.is_set():
            return
        with self.lock:
            infra = h.infra or (outcome == "failed" and failure_kind in INFRA_KINDS)
            why = self._due(h, time.monotonic(), h.tasks + 1, infra)
            if why is None or h.pending or h.running:
                return
        try:
            marked = self.host.health_next(device_id)
        except MARK_ERRORS as exc:  # the check still runs when the device is free
            self.state.log(logging.WARNING, f"health check not marked: {type(exc).__name__}",
                           device=device_id)  # fmt: skip
            return
        if marked:
            with self.lock:
                h.pending = why

    def task_ended(self, device_id: str, outcome: str, failure_kind: str | None) -> None:
        """A run on ``device_id`` was reported (done, failed or cancelled)."""
        h = self.devices.get(device_id)
        if h is None:
            return
        with self.lock:
            h.tasks += 1
            if outcome == "failed" and failure_kind in INFRA_KINDS:
                h.infra = True
        self.wake.set()

    def due(self, device_id: str, now: float) -> str | None:
        """Why the device's check is due now (joined | infrastructure_failure | unhealthy |
        every_tasks | every_seconds), or None."""
        h = self.devices[device_id]
        return self._due(h, now, h.tasks, h.infra)

    def _due(self, h: DeviceHealth, now: float, tasks: int, infra: bool) -> str | None:
        s = self.settings
        if h.last_check is None:
            return "joined"
        if infra:
            return "infrastructure_failure"
        if h.healthy is False:
            every = s.health_every_seconds or UNHEALTHY_RECHECK
            return "unhealthy" if now - h.last_check >= every else None
        if s.health_every_tasks and tasks >= s.health_every_tasks:
            return "every_tasks"
        if s.health_every_seconds and now - h.last_check >= s.health_every_seconds:
            return "every_seconds"
        return None

    def locally_free(self, device_id: str) -> bool:
        """No run (or runner that did not stop) of this daemon on the device, not quarantined,
        idle by the device check."""
        st = self.state
        with st.lock:
            return (
                device_id not in st.by_device
                and device_id not in st.abandoned
                and device_id not in st.quarantined
                and device_id not in st.retiring
                and st.states.get(device_id) is DeviceState.idle
            )

    # -- start-up ----------------------------------------------------------------------------
    def prepare(self) -> None:
        """At start (called before the first heartbeat and right after it): take the checked
        devices for their joining check at once (the registered ones before the heartbeat,
        new ones right after it registered them), so that the scheduler does not hand them
        work before their first check; forget the health of devices whose driver type this
        daemon does not check. Idempotent; transient errors propagate (the start is
        retried)."""
        stored = self.host.device_health(list(self.state.devices))
        for did, dev in self.state.devices.items():
            if did in self.devices:
                if not self.devices[did].begun:
                    with contextlib.suppress(NotFound):  # not registered yet
                        if self.host.health_begin(did):
                            self.devices[did].begun = True
            elif stored.get(did):
                self.host.health_clear(did)
                self.state.log(
                    logging.INFO,
                    f"no health check for driver type {dev.driver_type} here: health cleared",
                    device=did,
                )

    def first_snapshot(self, reports: list[DeviceReport]) -> list[DeviceReport]:
        """The start's first heartbeat snapshot, after `prepare`: a checked device not taken
        for its joining check yet (not registered before this heartbeat) is reported ``busy``
        (``JOINING``), so the heartbeat that registers it does not put it among the idle
        candidates, where the scheduler could give it a task before `prepare` takes it for
        the check. Its check makes it healthy; the next heartbeat reports it as it is."""
        return [
            replace(r, state=DeviceState.busy, reason=JOINING)
            if r.device_id in self.devices
            and not self.devices[r.device_id].begun
            and r.state is DeviceState.idle
            else r
            for r in reports
        ]

    # -- devices that join or leave while the daemon runs ---------------------------------------
    def device_added(self, dev: DeviceConfig) -> None:
        """A device joined while running (or its driver type changed): when its driver type
        is checked it is reported busy (``JOINING``) until `take_joining` took it for its
        joining check, as at start."""
        if dev.driver_type not in self.by_driver:
            self.device_removed(dev.device_id)
            return
        with self.lock:
            if dev.device_id not in self.devices:
                self.devices = {**self.devices, dev.device_id: DeviceHealth()}  # (copy: loops)
                self.joining.add(dev.device_id)

    def device_removed(self, device_id: str) -> None:
        """A device left: forget its health here; a check running on it is stopped."""
        with self.lock:
            if device_id in self.devices:
                self.devices = {k: v for k, v in self.devices.items() if k != device_id}
            self.joining.discard(device_id)
            if device_id in self.cancels:
                self.cancels[device_id].set()

    def joining_snapshot(self, reports: list[DeviceReport]) -> list[DeviceReport]:
        """A heartbeat's snapshot with the devices joining while running reported busy."""
        with self.lock:
            joining = set(self.joining)
        if not joining:
            return reports
        return [
            replace(r, state=DeviceState.busy, reason=JOINING)
            if r.device_id in joining and r.state is DeviceState.idle
            else r
            for r in reports
        ]

    def take_joining(self) -> None:
        """After a heartbeat: take the joining devices it registered for their check (like
        `prepare`); a refused one is checked when the loop finds it free."""
        with self.lock:
            joining = sorted(self.joining)
        for did in joining:
            h = self.devices.get(did)
            if h is not None and h.begun:  # taken at start already (prepare)
                with self.lock:
                    self.joining.discard(did)
                continue
            try:
                begun = h is not None and self.host.health_begin(did)
            except NotFound:
                continue  # not registered yet: the next heartbeat does
            except MARK_ERRORS as exc:
                self.state.log(logging.WARNING, f"health check not begun: {type(exc).__name__}",
                               device=did)  # fmt: skip
                continue
            with self.lock:
                if h is not None and begun:
                    h.begun = True
                self.joining.discard(did)
        if joining:
            self.wake.set()

    # -- the loop ----------------------------------------------------------------------------
    def loop(self) -> None:
        """Start every due check of a device that is free here (a thread per check) until the
        daemon closes; then stop the running checks."""
        try:
            while not self.state.closed.is_set():
                if not self.state.stopping.is_set():
                    try:
                        self.start_due()
                    except Exception:  # noqa: BLE001 - keep checking
                        self.state.log_exception("health checks failed; continuing")
                self.wake.wait(LOOP_WAIT)
                self.wake.clear()
        finally:
            with self.lock:
                self.closing = True
                for ev in self.cancels.values():
                    ev.set()
            for t in list(self.threads.values()):
                t.join(self.settings.stop_grace + 5.0)

    def start_due(self) -> None:
        now = time.monotonic()
        for did, h in self.devices.items():
            if did not in self.state.devices:
                continue  # left meanwhile
            with self.lock:
                if h.running or self.check_of(did).busy(did):  # (a timed-out call not returned)
                    continue
                if h.begun:  # taken at start (prepare): its joining check runs now
                    why: str | None = "joined"
                elif h.pending:  # marked before a report: runs once the run has ended here
                    why = h.pending
                    if not self.locally_free(did):
                        continue
                else:
                    why = self.due(did, now)
                    if why is None or now < h.retry_at or not self.locally_free(did):
                        continue
                h.running = True
                t = threading.Thread(
                    target=self._check_thread, args=(did, why), name=f"health-{did}", daemon=True
                )
                self.threads[did] = t
            t.start()

    def _check_thread(self, did: str, why: str) -> None:
        h = self.devices[did]
        try:
            self.check(did, why)
        except (AuthError, SessionSuperseded) as exc:
            self.state.fatal(exc)
        except TRANSIENT as exc:
            self.state.log(logging.WARNING, "health check: Redis unreachable", device=did,
                           **unreachable(exc))  # fmt: skip
        except DeviceqError as exc:
            self.state.log(logging.ERROR, f"health check refused: {type(exc).__name__}: {exc}",
                           device=did)  # fmt: skip
        except Exception:  # noqa: BLE001 - the device is checked again later
            self.state.log_exception("health check failed", device=did)
        finally:
            with self.lock:
                h.running = False
                self.threads.pop(did, None)
            self.wake.set()

    def check(self, did: str, why: str) -> bool | None:
        """One check of ``did``: begin (None when refused: a task holds the device; still due),
        run the template, record the result. Returns the result."""
        h = self.devices[did]
        if not h.begun and not self.host.health_begin(did):
            h.retry_at = time.monotonic() + REFUSED_RETRY
            return None
        h.begun, h.pending = False, None
        dev = self.state.devices[did]
        healthy, output, reason = self.run_check(dev)
        self._attributes(did, output)
        if self.closing and not healthy:
            # stopped by the daemon's shutdown: the result means nothing; the device stays
            # `checking` (out of service) until the next daemon checks it as it joins
            return None
        self._end(did, healthy, output, reason)
        with self.lock:
            h.last_check = time.monotonic()
            was, h.healthy = h.healthy, healthy
            h.tasks, h.infra = 0, False
        self.checks += 1
        if healthy:
            self.state.log(logging.INFO if was is False else logging.DEBUG,
                           "device healthy" + (": back in service" if was is False else ""),
                           device=did, why=why)  # fmt: skip
        else:
            # (scrubbed as in the stored reason: a Python check runs in this process)
            token = getattr(self.host, "_token", None)
            shown = reason.replace(token, "[host token]") if token else reason
            self.state.log(logging.WARNING, f"device unhealthy: {shown}; out of service",
                           device=did, why=why)  # fmt: skip
        return healthy

    def _attributes(self, did: str, output: str) -> None:
        """Take the attributes the check printed (a JSON line ``{"attributes": {...}}``)."""
        try:
            values = attributes_in_output(output)
            if values:
                self.state.attributes.from_check(did, values)
        except DeviceqError as exc:
            self.state.log(logging.WARNING, f"health check attributes ignored: {exc}",
                           device=did)  # fmt: skip

    def _end(self, did: str, healthy: bool, output: str, reason: str) -> None:
        """Record the result, retrying while Redis is unreachable (the device stays out of
        service meanwhile)."""
        delay = 0.05
        while True:
            try:
                self.host.health_end(did, healthy, output, reason)
                return
            except TRANSIENT as exc:
                if self.state.closed.is_set():
                    raise
                self.state.log(logging.WARNING, "health result: Redis unreachable, retrying",
                               device=did, **unreachable(exc))  # fmt: skip
                self.state.closed.wait(delay)
                delay = min(1.0, delay * 2)

    def check_of(self, did: str) -> HealthCheck:
        return self.by_driver[self.state.devices[did].driver_type]

    def run_check(self, dev: DeviceConfig) -> CheckResult:
        """Run the device's check: (healthy, output, reason when unhealthy)."""
        timeout = self.settings.health_check_timeout
        cancel = threading.Event()
        task = Task(
            goal="", task_id=f"health-{dev.device_id}", device_id=dev.device_id,
            driver_type=dev.driver_type, tags=dev.tags, host_id=self.settings.host_id,
            cancel=cancel, lease=LeaseClock(time.monotonic() + timeout),
        )  # fmt: skip
        with self.lock:
            if self.closing:
                cancel.set()
            self.cancels[dev.device_id] = cancel
        try:
            return self.by_driver[dev.driver_type](task)
        finally:
            with self.lock:
                self.cancels.pop(dev.device_id, None)
