"""`HostWorker`: the daemon a host runs. It starts a **session** for its host id (one live
daemon per host), heartbeats its device snapshot, waits on its inbox with a blocking call,
claims only as many assignments as it has free devices, runs each one through the
`TaskDispatcher` (one per device, concurrently), renews each lease at a third of its length
from a thread of its own (which also blocks on the host's control list, so a cancel, a
quarantine change, a takeover or a removal is acted on at once), and reports outcomes,
retrying while Redis is unreachable.

Lifecycle of one attempt on the host::

    claim -> run (renewed at 1/3 of each lease) -> report done | failed | cancelled
                 renew says ``cancel`` -> stop the runner, report ``cancelled``
                 renew says ``lost``   -> stop the runner, report nothing, heartbeat at once
                 lease ends locally    -> (no renewal got through) the run is killed
                 SIGTERM grace over    -> stop the runner, release (requeued at once)

Commands and isolated Python runners run in process groups of their own under a watchdog that
kills the run when this daemon dies (SIGKILL) or its lease ends without a renewal (the daemon
is frozen by SIGSTOP, or cut off from Redis): a task never goes on running after its lease
ended, so it never runs twice at once. A runner that does not stop when told (an in-process
runner) keeps its device out of service (``busy``, reason shown) until it really ends.

Sessions: a second daemon for a host whose session is live is refused (``--takeover`` fences
the first: its calls are refused from then on, and it stops its runners and exits 3). A daemon
restarted on the same machine after a crash sees that the old process is gone and hands its
attempts back at once. A removed host, or a rotated token, stops the daemon (exit 4).

SIGTERM (or SIGINT): stop claiming, mark the host ``stopping``, hand back assignments not yet
started, let running tasks finish within the grace period, release what cannot finish, end
the session, exit 0. A second signal skips the rest of the grace period. An operator's drain
(``deviceq host drain``) is a separate flag that a restart keeps.

Under systemd use ``KillMode=mixed`` (the default ``control-group`` would SIGTERM the running
commands too instead of letting them finish within the grace period) and ``TimeoutStopSec``
above ``--grace``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from .client import Client
from .connection import check_redis_url
from .dispatcher import DispatchOutcome, TaskDispatcher
from .errors import AuthError, ConfigError, DeviceqError, InvalidInput, SessionSuperseded
from .host import DeviceReport, HostClient, Report
from .logs import log
from .models import Assignment, DeviceState, validate_id, validate_tags
from .runners import (
    CommandTemplate,
    LeaseClock,
    RunnerSpec,
    build_goal_runner,
    build_workflow_runner,
    kill_group,
)
from .session import new_session_id, owner_dead, owner_id

_LOG = logging.getLogger("deviceq.worker")
TRANSIENT = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)
RENEW_CHUNK = 200
CHECK_BUSY_EXIT = 3  # a device check exiting 3 means "in use outside deviceq"
CTL_BLOCK = 1.0  # longest wait on the control list (bounds how late a stop is noticed)
EXIT_START_REFUSED = 2  # could not start: bad token, host unknown, a live daemon holds it
EXIT_SUPERSEDED = 3  # another daemon took over this host id
EXIT_REVOKED = 4  # the host was removed or its token rotated while running


def lease_margin(lease_s: float) -> float:
    """How long before a lease's expiry in Redis the host treats it as ended (clock rates,
    the time a kill takes): a tenth of it, at most a second."""
    return min(1.0, 0.1 * lease_s)


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


@dataclass(eq=False)
class Run:
    """One claimed attempt running (or about to run) on one device."""

    assignment: Assignment
    lease: LeaseClock
    renew_at: float  # time.monotonic() of the next renewal (a third into the lease)
    cancel: threading.Event = field(default_factory=threading.Event)
    reason: str | None = None  # why it was stopped: cancel | lost | expired | drain
    after: Run | None = None  # a previous run on the same device still stopping
    ended: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    @property
    def task_id(self) -> str:
        return self.assignment.task.id

    @property
    def device_id(self) -> str:
        return self.assignment.device_id

    def fields(self) -> dict[str, Any]:
        a = self.assignment
        return {"task": a.task.id, "lease": a.lease_id, "host": a.host_id,
                "device": a.device_id, "attempt": a.attempt}  # fmt: skip

    def stop(self, reason: str) -> None:
        """Ask the runner to stop; ``lost`` overrides any earlier reason."""
        if self.reason is None or reason == "lost":
            self.reason = reason
        self.cancel.set()
        # (expired: the lease ended here without a renewal; Redis decides whether it is lost)

    def renewed(self, sent_at: float, lease_ms: int) -> None:
        """A claim or renewal sent at ``sent_at`` granted a lease of ``lease_ms``: the lease
        ends locally a margin before it does in Redis; the next renewal is a third into it."""
        lease_s = max(0.001, lease_ms / 1000)
        self.lease.extend(sent_at + lease_s - lease_margin(lease_s))
        self.renew_at = sent_at + lease_s / 3


def worker_redis(url: str, socket_timeout: float | None) -> redis.Redis:
    """A Redis client for the worker: bounded socket timeouts and a short reconnect retry. A
    malformed ``url`` raises ConfigError."""
    return redis.Redis.from_url(
        check_redis_url(url),
        decode_responses=True,
        socket_timeout=socket_timeout,
        socket_connect_timeout=2.0,
        socket_keepalive=True,
        health_check_interval=15,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 2),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )


class HostWorker:
    """The host worker daemon. ``run()`` blocks until stopped (``stop()`` or SIGTERM) and
    returns the exit code (0 after a drain; see ``EXIT_*`` for the others).

    >>> w = HostWorker("redis://localhost:6379/0", "default", settings, token)
    >>> sys.exit(w.run())
    """

    def __init__(
        self,
        redis_url: str,
        pool: str,
        settings: WorkerSettings,
        token: str,
        *,
        dispatcher: TaskDispatcher | None = None,
    ) -> None:
        self.settings = settings
        self.log = _LOG
        self.devices = {d.device_id: d for d in settings.devices}
        self.session_id = new_session_id()
        self.owner = owner_id()
        self.host = HostClient(worker_redis(redis_url, settings.socket_timeout), pool,
                               settings.host_id, token)  # fmt: skip
        self.waiter = HostClient(
            worker_redis(redis_url, settings.poll_interval * 1.25 + settings.socket_timeout),
            pool, settings.host_id, token,
        )  # fmt: skip
        self.ctl = HostClient(worker_redis(redis_url, CTL_BLOCK + settings.socket_timeout),
                              pool, settings.host_id, token)  # fmt: skip
        self.producer = Client(self.host.redis, pool)
        if dispatcher is None:
            spec = settings.goal_runner
            assert spec is not None
            if spec.name == "command" and "term_grace" not in spec.options:
                spec = RunnerSpec(spec.name, {**spec.options, "term_grace": settings.stop_grace})
            goal = build_goal_runner(spec, settings.isolation,
                                     kill_grace=settings.stop_grace)  # fmt: skip
            wf = build_workflow_runner(
                settings.workflow_runner,
                spec,
                settings.isolation,
                kill_grace=settings.stop_grace,
            )
            dispatcher = TaskDispatcher(goal, wf, self.producer.get_workflow,
                                        stop_grace=settings.stop_grace + 2.0)  # fmt: skip
        self.dispatcher = dispatcher
        self.lock = threading.Lock()
        self.runs: dict[str, Run] = {}  # task id -> run (until its report is answered)
        self.by_device: dict[str, Run] = {}  # device id -> newest run on it
        self.abandoned: dict[str, str] = {}  # device id -> why it is busy (a runner left behind)
        self.quarantined: set[str] = set()
        self.remote_draining = False
        self.stopping = threading.Event()  # stop claiming and drain
        self.hurry = threading.Event()  # second signal: skip the rest of the grace period
        self.closed = threading.Event()  # upkeep threads stop
        self.changed = threading.Event()  # a device slot freed or the run set changed
        self.renew_now = threading.Event()  # renew every lease at once (a control message)
        self.lease_ttl = 60.0
        self.host_timeout = 30.0
        self.abandon_reports_at: float | None = None
        self.states: dict[str, DeviceState] = {d.device_id: d.state for d in settings.devices}
        self.beat_now = threading.Event()  # heartbeat at once (a device state changed)
        self._threads: list[threading.Thread] = []
        self.signalled: str | None = None
        self.exit_code = 0
        self.fatal_reason: str | None = None

    # -- helpers -----------------------------------------------------------------------------
    def _log(self, level: int, msg: str, **fields: Any) -> None:
        log(self.log, level, msg, **{"host": self.settings.host_id, **fields})

    def _hb_interval(self) -> float:
        return self.settings.heartbeat_interval or max(0.05, self.host_timeout / 3)

    def free_devices(self) -> list[str]:
        """Devices with no run, no abandoned runner, not quarantined, idle by their check."""
        with self.lock:
            return [d for d in self.devices if d not in self.by_device and
                    d not in self.abandoned and d not in self.quarantined and
                    self.states[d] is DeviceState.idle]  # fmt: skip

    def active_runs(self) -> list[Run]:
        with self.lock:
            return list(self.runs.values())

    def _retry(self, what: str, fn: Callable[[], Any], until: Callable[[], bool]) -> Any:
        """Call ``fn`` until it answers (transient Redis errors are retried with backoff) or
        ``until()`` says give up (returns None then)."""
        delay = 0.05
        while True:
            try:
                return fn()
            except redis.AuthenticationError:
                raise
            except TRANSIENT as exc:
                if until():
                    return None
                self._log(logging.WARNING, f"{what}: Redis unreachable, retrying",
                          error=type(exc).__name__)  # fmt: skip
                time.sleep(delay)
                delay = min(1.0, delay * 2)

    def fatal(self, exc: DeviceqError) -> None:
        """This daemon may no longer act for its host (superseded by another daemon, host
        removed, token rotated): stop every runner without reporting, and exit non-zero."""
        if self.fatal_reason is not None:
            return
        if isinstance(exc, SessionSuperseded):
            code, why = EXIT_SUPERSEDED, f"another daemon took over host {self.settings.host_id}"
        else:
            code, why = EXIT_REVOKED, f"host {self.settings.host_id} can no longer act"
        self.fatal_reason = f"{why}: {exc}"
        self.exit_code = code
        self._log(logging.ERROR, f"{self.fatal_reason}; stopping runners and exiting")
        for run in self.active_runs():
            run.stop("lost")
        self.hurry.set()
        self.stopping.set()
        self.changed.set()
        self.renew_now.set()
        threading.Thread(target=self._nudge, daemon=True).start()

    # -- lifecycle ---------------------------------------------------------------------------
    def run(self) -> int:
        """Run the daemon until stopped; returns the process exit code."""
        if threading.current_thread() is threading.main_thread():
            self._install_signals()
        code = self._startup()
        if code:
            return code
        loops = [("heartbeat", self._heartbeat_loop), ("renew", self._renew_loop)]
        if self.settings.device_check:
            loops.append(("device-check", self._check_loop))
        for name, target in loops:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        try:
            self._main_loop()
            self._drain()
        finally:
            self.closed.set()
            self.beat_now.set()
            self.renew_now.set()
            for t in self._threads:
                t.join(self.settings.socket_timeout + CTL_BLOCK + 1)
            if self.fatal_reason is None:
                with contextlib.suppress(Exception):
                    self.host.end_session()
            for c in (self.host, self.waiter, self.ctl):
                c.close()
        if self.fatal_reason is not None:
            self._log(logging.ERROR, f"host worker stopped: {self.fatal_reason}")
        else:
            self._log(logging.INFO, "host worker stopped")
        return self.exit_code

    def stop(self) -> None:
        """Begin a drain (what SIGTERM does); a second call skips the grace period."""
        if self.stopping.is_set():
            self.hurry.set()
        self.stopping.set()
        self.changed.set()
        threading.Thread(target=self._nudge, daemon=True).start()

    def _install_signals(self) -> None:
        """SIGTERM/SIGINT start a drain. The Python handler does nothing itself (logging or
        taking a lock from a handler that interrupted the same thread could raise or deadlock):
        the signal number arrives through the wakeup fd at a watcher thread, which acts."""
        rsock, wsock = socket.socketpair()
        wsock.setblocking(False)
        signal.set_wakeup_fd(wsock.fileno(), warn_on_full_buffer=False)
        self._signal_socks = (rsock, wsock)
        wanted = {int(signal.SIGTERM), int(signal.SIGINT)}

        def handler(signum: int, frame: Any) -> None:
            return None

        def watch() -> None:
            while True:
                try:
                    data = rsock.recv(64)
                except OSError:
                    return
                if not data:
                    return
                for signum in data:
                    if signum in wanted:
                        self.signalled = signal.Signals(signum).name
                        self.stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
        threading.Thread(target=watch, name="signals", daemon=True).start()

    def _nudge(self) -> None:
        """Wake our own blocking inbox and control waits (best effort)."""
        with contextlib.suppress(Exception):
            pipe = self.host.redis.pipeline(transaction=False)
            pipe.lpush(self.host.keys.host_wake(self.host.host_id), "stop")
            pipe.execute()

    def _startup(self) -> int:
        if self.settings.device_check:
            self.check_devices()

        def first() -> Any:
            self._refresh_config()
            info = self._start_session()
            hb = self.host.heartbeat(self._snapshot())
            self._apply_heartbeat(hb)
            return info

        try:
            info = self._retry("start", first, self.stopping.is_set)
        except redis.AuthenticationError as exc:  # a wrong or missing password: never transient
            self._log(logging.ERROR, f"cannot start: Redis refused the credentials: {exc}")
            return EXIT_START_REFUSED
        except DeviceqError as exc:
            why = str(exc) if isinstance(exc, AuthError) else f"{type(exc).__name__}: {exc}"
            self._log(logging.ERROR, f"cannot start: {why}")
            return EXIT_START_REFUSED
        if info is None:
            return 0
        fields: dict[str, Any] = {"session": self.session_id, "epoch": info.epoch}
        if info.replaced:
            fields["replaced"] = info.replaced
        if info.handed_back:
            fields["handed_back"] = info.handed_back
        self._log(logging.INFO, "host worker started", devices=len(self.devices),
                  goal_runner=str(self.settings.goal_runner),
                  workflow_runner=str(self.settings.workflow_runner), **fields)  # fmt: skip
        return 0

    def _start_session(self) -> Any:
        """Start this daemon's session: refused while another daemon of this host id is live
        (unless --takeover); a session whose daemon is certainly dead (same machine, process
        gone) is replaced at once and its attempts handed back (unless --no-recover)."""
        cur = self.host.host_record()
        old = cur["session"]
        mode = "start"
        if self.settings.takeover:
            mode = "takeover"
        elif old and owner_dead(cur["session_owner"]):
            # certainly gone (this machine, process not running): replace it at once; its
            # running attempts are handed back now unless --no-recover (then they expire)
            mode = "dead" if self.settings.recover else "takeover"
        info = self.host.start_session(self.session_id, mode, self.owner, old)
        for c in (self.waiter, self.ctl):
            c.session = self.session_id
        if info.replaced:
            how = {"dead": "its daemon is gone", "takeover": "taken over",
                   "start": "its daemon stopped heartbeating"}[mode]  # fmt: skip
            self._log(logging.WARNING if mode == "takeover" else logging.INFO,
                      f"replaced session {info.replaced} ({how})",
                      handed_back=info.handed_back)  # fmt: skip
        return info

    def _snapshot(self) -> list[DeviceReport]:
        # Devices running deviceq tasks are reported idle: their reservation protects them.
        # busy = in use outside deviceq or by a runner that did not stop; offline = broken.
        with self.lock:
            abandoned = dict(self.abandoned)
        out = []
        for d in self.devices.values():
            state, reason = self.states[d.device_id], ""
            if d.device_id in abandoned:
                state, reason = DeviceState.busy, abandoned[d.device_id]
            elif state is DeviceState.busy:
                reason = "in use outside deviceq (device check)"
            elif state is DeviceState.offline:
                reason = "device check failed"
            out.append(DeviceReport(d.device_id, d.driver_type, d.tags, state, reason))
        return out

    def _refresh_config(self) -> None:
        cfg = self.host.config()
        self.lease_ttl, self.host_timeout = cfg.lease_ttl, cfg.host_timeout

    def _apply_heartbeat(self, hb: Any) -> None:
        """Take the quarantine set and the operator's drain flag from a heartbeat answer."""
        q = set(hb.quarantined) & set(self.devices)
        with self.lock:
            added, removed = q - self.quarantined, self.quarantined - q
            self.quarantined = q
        for d in sorted(added):
            self._log(logging.WARNING, "device quarantined: no work until released "
                      "(deviceq device unquarantine)", device=d)  # fmt: skip
        for d in sorted(removed):
            self._log(logging.INFO, "device back in service", device=d)
        if added or removed:
            self.changed.set()
        if hb.draining != self.remote_draining:
            self.remote_draining = hb.draining
            self.changed.set()
            if not self.stopping.is_set():
                self._log(logging.INFO, "host drained by an operator" if hb.draining
                          else "host undrained")  # fmt: skip

    # -- upkeep threads ----------------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        next_cfg = time.monotonic() + 10.0
        while not self.closed.is_set():
            try:
                self._apply_heartbeat(self.host.heartbeat(self._snapshot()))
                if time.monotonic() >= next_cfg:
                    self._refresh_config()
                    next_cfg = time.monotonic() + 10.0
                wait = self._hb_interval()
            except TRANSIENT as exc:
                self._log(logging.WARNING, "heartbeat: Redis unreachable",
                          error=type(exc).__name__)  # fmt: skip
                wait = min(0.5, self._hb_interval())
            except (AuthError, SessionSuperseded) as exc:
                self.fatal(exc)
                return
            except DeviceqError as exc:
                self._log(logging.ERROR, f"heartbeat refused: {type(exc).__name__}: {exc}")
                wait = max(1.0, self._hb_interval())
            except Exception:  # noqa: BLE001 - the heartbeat must survive anything
                self.log.exception("heartbeat failed")
                wait = 1.0
            self.beat_now.wait(wait)
            self.beat_now.clear()

    def _renew_loop(self) -> None:
        """Renew each lease a third into it; between renewals block on the host's control
        list, so a cancel request, a quarantine change, a takeover or a removal is acted on at
        once; stop runs whose lease ended locally without a renewal."""
        while not self.closed.is_set():
            runs = [r for r in self.active_runs() if r.reason != "lost" and not r.ended.is_set()]
            now = time.monotonic()
            for r in runs:
                if r.lease.expired and r.reason is None:
                    self._log(logging.WARNING, "lease ended without a renewal: stopping the "
                              "runner", **r.fields())  # fmt: skip
                    r.stop("expired")
            due = [r for r in runs if r.renew_at <= now + 0.05 and r.reason != "lost"]
            if self.renew_now.is_set():
                self.renew_now.clear()
                due = [r for r in runs if r.reason != "lost"]
            wait = CTL_BLOCK
            try:
                if due:
                    self.renew_once(due)
                pending = [r.renew_at for r in self.active_runs() if r.reason != "lost"]
                if pending:
                    wait = min(wait, max(0.01, min(pending) - time.monotonic()))
                if self.closed.is_set():
                    return
                msg = self.ctl.wait_for_control(wait)
                if msg is not None:
                    self.renew_now.set()
                    self.beat_now.set()
            except TRANSIENT as exc:
                self._log(logging.WARNING, "renew: Redis unreachable", error=type(exc).__name__)
                self.closed.wait(0.2)
            except (AuthError, SessionSuperseded) as exc:
                self.fatal(exc)
                return
            except DeviceqError as exc:
                self._log(logging.ERROR, f"renew refused: {type(exc).__name__}: {exc}")
                self.closed.wait(0.5)
            except Exception:  # noqa: BLE001 - renewals must survive anything
                self.log.exception("renew failed")
                self.closed.wait(0.5)

    def renew_once(self, runs: list[Run] | None = None) -> None:
        """Renew the given leases (every active one by default), batched; act on ``cancel``
        and ``lost`` answers."""
        if runs is None:
            runs = [r for r in self.active_runs() if r.reason != "lost"]
        for start in range(0, len(runs), RENEW_CHUNK):
            chunk = runs[start : start + RENEW_CHUNK]
            sent = time.monotonic()
            answers = self.host.renew([(r.task_id, r.assignment.lease_id) for r in chunk])
            lost = False
            for run, ans in zip(chunk, answers, strict=True):
                if run.ended.is_set():
                    continue
                if not ans.lost:
                    run.renewed(sent, ans.lease_ms)
                    if self.settings.renew_interval:
                        run.renew_at = min(run.renew_at, sent + self.settings.renew_interval)
                if ans.status == "cancel" and run.reason is None:
                    self._log(logging.INFO, "cancel requested: stopping runner", **run.fields())
                    run.stop("cancel")
                elif ans.lost:
                    self._log(logging.WARNING, f"lease lost ({ans.reason}): stopping runner, "
                              "reporting nothing", **run.fields())  # fmt: skip
                    run.stop("lost")
                    lost = True
            if lost:
                self.beat_now.set()  # prove this host alive: its devices return to service

    def _check_loop(self) -> None:
        while not self.closed.wait(self.settings.device_check_interval):
            try:
                self.check_devices()
            except Exception:  # noqa: BLE001 - keep checking
                self.log.exception("device check failed")

    def check_devices(self) -> None:
        """Run the device check for every device not running a deviceq task: exit 0 -> idle,
        exit 3 -> busy (in use outside deviceq), anything else or a timeout -> offline."""
        for dev in self.devices.values():
            with self.lock:
                running = dev.device_id in self.by_device
            if running or self.closed.is_set():
                continue
            state = self._check(dev)
            if state is not self.states[dev.device_id]:
                self._log(logging.WARNING if state is not DeviceState.idle else logging.INFO,
                          f"device now {state.value}", device=dev.device_id)  # fmt: skip
                self.states[dev.device_id] = state
                self.beat_now.set()
                self.changed.set()

    def _check(self, dev: DeviceConfig) -> DeviceState:
        assert self.settings.device_check is not None
        template = CommandTemplate.parse(self.settings.device_check,
                                         ("device_id", "driver_type", "tags"))  # fmt: skip
        argv = template.render({"device_id": dev.device_id, "driver_type": dev.driver_type,
                                "tags": ",".join(dev.tags)})  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "DEVICEQ_HOST_TOKEN"}
        env.update(DEVICEQ_DEVICE_ID=dev.device_id, DEVICEQ_DRIVER_TYPE=dev.driver_type,
                   DEVICEQ_TAGS=",".join(dev.tags))  # fmt: skip
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            self._log(logging.ERROR, f"device check cannot start: {exc}", device=dev.device_id)
            return DeviceState.offline
        try:
            rc = proc.wait(self.settings.device_check_timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            proc.wait()
            return DeviceState.offline
        finally:
            kill_group(proc.pid)
        if rc == 0:
            return DeviceState.idle
        return DeviceState.busy if rc == CHECK_BUSY_EXIT else DeviceState.offline

    # -- main loop ---------------------------------------------------------------------------
    def _main_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                self._main_loop_inner()
            except Exception:  # noqa: BLE001 - the daemon must survive a bug in one pass
                self.log.exception("main loop failed; continuing")
                self.stopping.wait(1.0)

    def _main_loop_inner(self) -> None:
        delay = 0.05
        while not self.stopping.is_set():
            free = self.free_devices()
            # an operator's drain stops new assignments; what was assigned before still runs
            if not free:
                self.changed.wait(self.settings.poll_interval)
                self.changed.clear()
                continue
            try:
                sent = time.monotonic()
                claimed = self.host.claim(len(free))
                delay = 0.05
            except TRANSIENT as exc:
                self._log(logging.WARNING, "claim: Redis unreachable", error=type(exc).__name__)
                self.stopping.wait(delay)
                delay = min(1.0, delay * 2)
                continue
            except (AuthError, SessionSuperseded) as exc:
                self.fatal(exc)
                return
            except DeviceqError as exc:
                self._log(logging.ERROR, f"claim refused: {type(exc).__name__}: {exc}")
                self.stopping.wait(max(1.0, delay))
                delay = min(5.0, delay * 2)
                continue
            for a in claimed:
                self._start(a, sent)
            if len(claimed) >= len(free):
                continue  # the inbox may hold more: claim again at once
            # fewer than asked: the inbox was empty (claim drains it up to the max), so an
            # immediate second claim would be an empty round trip; a later assignment pushes
            # the wake list, which ends the wait at once
            self._wait_for_work()

    def _wait_for_work(self) -> None:
        timeout = self.settings.poll_interval * random.uniform(0.75, 1.25)
        try:
            self.waiter.wait_for_work(timeout)
        except TRANSIENT as exc:
            self._log(logging.WARNING, "inbox wait: Redis unreachable", error=type(exc).__name__)
            self.stopping.wait(random.uniform(0.1, 0.3))

    def _start(self, a: Assignment, sent: float) -> None:
        run = Run(a, LeaseClock(), sent)
        run.renewed(sent, a.lease_ms or int(self.lease_ttl * 1000))
        f = run.fields()
        if run.lease.expired:
            # claimed before a freeze (SIGSTOP) that outlasted the lease: the task has gone
            # back to the queue or elsewhere; a report would be refused
            self._log(logging.WARNING, "claimed lease already ended: not started", **f)
            return
        if a.device_id not in self.devices or a.host_id != self.settings.host_id:
            self._log(logging.WARNING, "assignment for a device this worker does not serve: "
                      "handing it back", **f)  # fmt: skip
            self._release(run, "device not served by this worker")
            return
        with self.lock:
            busy = self.abandoned.get(a.device_id)
        state = self.states[a.device_id]
        if self.stopping.is_set() or busy or state is not DeviceState.idle:
            why = ("host shutting down" if self.stopping.is_set() else busy
                   if busy else f"device {state.value}")  # fmt: skip
            self._log(logging.INFO, f"{why}: handing the assignment back", **f)
            self._release(run, why)
            return
        with self.lock:
            run.after = self.by_device.get(a.device_id)
            self.by_device[a.device_id] = run
            self.runs[run.task_id] = run
        self._log(logging.INFO, "claimed", goal=(a.task.goal or "")[:80] or None,
                  workflow=a.task.workflow, **f)  # fmt: skip
        run.thread = threading.Thread(target=self._execute, args=(run,),
                                      name=f"task-{run.task_id}", daemon=True)  # fmt: skip
        run.thread.start()

    def _execute(self, run: Run) -> None:
        try:
            if run.after is not None:
                run.after.ended.wait()
            timeout = self.settings.task_timeout
            deadline = time.monotonic() + timeout if timeout > 0 else None
            device = self.devices[run.device_id]
            if run.reason is None and not run.lease.expired:
                outcome = self.dispatcher.dispatch(run.assignment, run.cancel, deadline,
                                                   driver_type=device.driver_type,
                                                   lease=run.lease)  # fmt: skip
            else:  # stopped (or its lease ended) before it started
                if run.reason is None:
                    run.stop("lost")
                outcome = DispatchOutcome("cancelled", None, "stopped before start")
            if outcome.abandoned:
                self._hold_device(run, outcome)
            self._finish(run, outcome)
        except Exception:  # noqa: BLE001 - never lose the slot
            self.log.exception("run failed", extra={"fields": run.fields()})
            with contextlib.suppress(Exception):
                self._release(run, "worker error")
        finally:
            run.ended.set()
            with self.lock:
                self.runs.pop(run.task_id, None)
                if self.by_device.get(run.device_id) is run:
                    del self.by_device[run.device_id]
            self.changed.set()

    def _hold_device(self, run: Run, outcome: DispatchOutcome) -> None:
        """A runner that did not stop keeps its device: it is reported ``busy`` (before the
        attempt's report frees the reservation, so the device never looks idle meanwhile)
        until the runner really ends."""
        why = f"runner of task {run.task_id} did not stop; waiting for it to end"
        with self.lock:
            self.abandoned[run.device_id] = why
        self._log(logging.ERROR, "runner abandoned: device out of service until it ends",
                  **run.fields())  # fmt: skip
        with contextlib.suppress(*TRANSIENT, DeviceqError):
            self.host.heartbeat(self._snapshot())

        def watch() -> None:
            done = outcome.runner_done
            while done is not None and not done.wait(1.0):
                if self.closed.is_set():
                    return
            with self.lock:
                if self.abandoned.get(run.device_id) == why:
                    del self.abandoned[run.device_id]
            self._log(logging.INFO, "abandoned runner ended: device back in service",
                      **run.fields())  # fmt: skip
            self.changed.set()
            self.beat_now.set()

        threading.Thread(target=watch, name=f"abandoned-{run.task_id}", daemon=True).start()

    def _finish(self, run: Run, out: DispatchOutcome) -> None:
        f = run.fields()
        if run.reason == "lost" or (not out.ok and (run.reason == "expired" or
                                                    run.lease.expired)):  # fmt: skip
            # a run that failed after its lease ended here was most likely stopped by that
            # (the lease watchdog): the task comes back through expiry. A success is still
            # reported: the script accepts it only if the lease is still current there.
            self._log(logging.INFO, "runner stopped after losing the lease; not reported",
                      status=out.status, **f)  # fmt: skip
            return
        if run.reason == "drain" and not out.ok:
            self._release(run, "host shut down before the task finished")
            return
        if run.reason == "cancel" and not out.ok:
            report = Report(run.task_id, run.assignment.lease_id, "cancelled", None,
                            out.payload or "cancelled")  # fmt: skip
        elif out.ok:
            report = Report(run.task_id, run.assignment.lease_id, "done", None, out.payload)
        elif out.status == "cancelled":  # cancelled without a request: hand it back
            self._release(run, out.payload or "stopped")
            return
        else:
            report = Report(run.task_id, run.assignment.lease_id, "failed",
                            out.failure_kind, out.payload)  # fmt: skip
        self._report(run, report)

    def _give_up(self) -> bool:
        return self.fatal_reason is not None or (
            self.abandon_reports_at is not None and time.monotonic() > self.abandon_reports_at
        )

    def _report(self, run: Run, report: Report) -> str | None:
        f = run.fields()
        try:
            answer = self._retry("report", lambda: self.host.report_many([report])[0],
                                 self._give_up)  # fmt: skip
        except (AuthError, SessionSuperseded) as exc:
            self.fatal(exc)
            return None
        except DeviceqError as exc:
            self._log(logging.ERROR, f"report refused: {type(exc).__name__}: {exc}", **f)
            return None
        if answer is None:
            self._log(
                logging.ERROR,
                "report not delivered before shutdown; the lease will "
                "expire and the task be retried",
                outcome=report.outcome,
                **f,
            )
            return None
        level = logging.WARNING if answer.startswith("rejected") else logging.INFO
        self._log(level, f"reported {report.outcome}", answer=answer,
                  failure_kind=report.failure_kind, **f)  # fmt: skip
        return str(answer)

    def _release(self, run: Run, why: str) -> None:
        self._report(run, Report(run.task_id, run.assignment.lease_id, "released", None, why))

    # -- drain -------------------------------------------------------------------------------
    def _drain(self) -> None:
        s = self.settings
        grace_end = time.monotonic() + s.grace
        if self.fatal_reason is None:
            self._log(logging.INFO, "draining: no new work", running=len(self.active_runs()),
                      grace=s.grace, signal=self.signalled)  # fmt: skip
        past_grace = lambda: (time.monotonic() > grace_end or self.hurry.is_set()  # noqa: E731
                              or self.fatal_reason is not None)  # fmt: skip
        claimed: list[Assignment] = []
        sent = time.monotonic()
        if self.fatal_reason is None:
            try:
                self._retry("set stopping", lambda: self.host.set_draining(True), past_grace)
                # hand back what was assigned to us but not started
                sent = time.monotonic()
                claimed = self._retry("drain inbox", lambda: self.host.claim(len(self.devices)),
                                      past_grace) or []  # fmt: skip
            except (AuthError, SessionSuperseded) as exc:
                self.fatal(exc)
            except DeviceqError as exc:
                self._log(logging.ERROR, f"drain refused: {type(exc).__name__}: {exc}")
        for a in claimed:
            self._start(a, sent)  # stopping is set: released at once
        while self.active_runs() and not past_grace():
            self.changed.wait(0.1)
            self.changed.clear()
        left = self.active_runs()
        if left and self.fatal_reason is None:
            self._log(logging.INFO, "grace period over: stopping and handing back",
                      running=len(left))  # fmt: skip
            for run in left:
                run.stop("drain")
        # runners get stop_grace to stop (the dispatcher abandons them after that), then the
        # reports a few seconds to get through
        self.abandon_reports_at = time.monotonic() + s.stop_grace + 5.0 + 2 * s.socket_timeout
        for run in left:
            if run.thread is not None:
                run.thread.join(max(0.0, self.abandon_reports_at + 1.0 - time.monotonic()))
