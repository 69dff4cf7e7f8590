"""`HostWorker`: the daemon a host runs. It starts a **session** for its host id (one live
daemon per host), heartbeats its device snapshot, waits on its inbox with a blocking call,
claims only as many assignments as it has free devices, runs each one through the
`TaskDispatcher` (one per device, concurrently), renews each lease at a third of its length
(on the heartbeat when one comes first, else from a thread of its own, which also blocks on
the host's control list, so a cancel, a quarantine change, a takeover or a removal is acted on
at once), and reports outcomes, retrying while Redis is unreachable; a report also claims what
already waits in the inbox for the free devices (one call), and those runs start at once.

While Redis (or, with ``--api-url``, the API) is unreachable, every loop backs off on its own
(0.2 s doubling to 10 s, jittered, reset on success) and running tasks go on; the daemon logs
one line when it goes away (``redis unreachable at HOST:PORT: ERROR; retrying``), at most one a
minute while it stays away, and one when it is back (``redis reachable again after 12.3 s``),
whereupon every loop resumes at once and the reports held meanwhile are sent (see
`deviceq.core.backoff`).

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

One process may serve several pools (``deviceq --pool a --pool b host run``): a `HostWorker`
per pool, run by `deviceq.host.multipool.MultiPoolHost`, each device in one pool only.

Under systemd use ``KillMode=mixed`` (the default ``control-group`` would SIGTERM the running
commands too instead of letting them finish within the grace period) and ``TimeoutStopSec``
above ``--grace``.
"""

from __future__ import annotations

import contextlib
import logging
import random
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from ..core import heap
from ..core.backoff import Backoff, Outage, endpoint, url_secrets
from ..core.connection import connect
from ..core.errors import AuthError, DeviceqError, SessionSuperseded
from ..core.models import Assignment
from ..core.redis_urls import redis_password
from ..core.tls import TLSError
from .device_watch import DeviceWatch
from .dispatcher import TaskDispatcher
from .execution import Executor
from .health import HealthChecker
from .http_link import ApiHostClient
from .link import HostLink
from .log_stream import QuietLogSink
from .progress import QuietProgressSink
from .redis_link import HostClient
from .runners import RunnerSpec, build_goal_runner, build_workflow_runner
from .session import new_session_id, owner_dead, owner_id
from .settings import WorkerSettings
from .state import EXIT_START_REFUSED, TRANSIENT, HostState
from .upkeep import CTL_BLOCK, Upkeep


def install_stop_signals(
    on_signal: Callable[[str], None], on_hup: Callable[[], None] | None = None
) -> None:
    """SIGTERM/SIGINT call ``on_signal(NAME)`` (from the main thread only); with ``on_hup``,
    SIGHUP calls it (re-read the devices) instead of ending the process. The Python handler
    does nothing itself (logging or taking a lock from a handler that interrupted the same
    thread could raise or deadlock): the signal number arrives through the wakeup fd at a
    watcher thread, which calls ``on_signal``."""
    rsock, wsock = socket.socketpair()
    wsock.setblocking(False)
    signal.set_wakeup_fd(wsock.fileno(), warn_on_full_buffer=False)
    _SIGNAL_SOCKS.append((rsock, wsock))  # kept open for the life of the process
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
                    on_signal(signal.Signals(signum).name)
                elif signum == signal.SIGHUP and on_hup is not None:
                    on_hup()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    if on_hup is not None:
        signal.signal(signal.SIGHUP, handler)
    threading.Thread(target=watch, name="signals", daemon=True).start()


_SIGNAL_SOCKS: list[tuple[socket.socket, socket.socket]] = []


class HostWorker:
    """The host worker daemon. ``run()`` blocks until stopped (``stop()`` or SIGTERM) and
    returns the exit code (0 after a drain; ``EXIT_*`` in `deviceq.host.state` for the
    others). It talks to Redis only through `HostClient` (three of them: one for calls, one
    for the blocking inbox wait, one for the blocking control wait), or, with
    ``settings.api_url``, to the HTTP service ``deviceq api`` through `ApiHostClient` (same
    interface, same guarantees; ``redis_url`` is then unused).

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
        self.pool = pool
        self.session_id = new_session_id()
        self.owner = owner_id()

        def client(socket_timeout: float) -> HostLink:
            if settings.api_url:  # through `deviceq api`: no Redis credentials on this host
                return ApiHostClient(settings.api_url, pool, settings.host_id, token,
                                     settings.api_ca, timeout=socket_timeout)  # fmt: skip
            r = connect(
                redis_url,
                socket_timeout=socket_timeout,
                connect_timeout=2.0,
                retries=2,
                backoff_cap=0.5,
                health_check_interval=15,
            )
            return HostClient(r, pool, settings.host_id, token)

        self.host = client(settings.socket_timeout)
        api = bool(settings.api_url)  # (an API request's timeout adds the wait it asks for)
        self.waiter = client(
            settings.socket_timeout + (0 if api else settings.poll_interval * 1.25)
        )
        self.ctl = client(settings.socket_timeout + (0 if api else CTL_BLOCK))
        self.state = HostState(settings, pool)
        self.state.nudge = self._nudge
        self.outage = self._outage(redis_url, settings.api_url)
        self.backoff = Backoff()  # the main loop's, while Redis is unreachable
        self.dispatcher = dispatcher or self._dispatcher(settings, pool)
        self.executor = Executor(self.state, self.host, self.dispatcher)
        self.executor.reporter.outage = self.outage
        self.executor.logs.sink = QuietLogSink(self.host, self.outage, TRANSIENT)
        self.executor.progress.sink = QuietProgressSink(self.host, self.outage, TRANSIENT)
        self.upkeep = Upkeep(
            self.state, self.host, self.ctl, summary=self._summary, outage=self.outage
        )
        self.health = HealthChecker(self.state, self.host)
        self.state.task_ending = self.health.task_ending
        self.state.task_ended = self.health.task_ended
        self.devices = DeviceWatch(self.state, self.health, settings.sources)
        self._threads: list[threading.Thread] = []

    def _outage(self, redis_url: str, api_url: str | None) -> Outage:
        """What every loop of this daemon reports the reachability of Redis (or the API) to:
        its lines name the address, never the password."""
        url = api_url or redis_url
        secrets = url_secrets(url)
        with contextlib.suppress(DeviceqError):  # (unreadable: connect() has said so already)
            secrets.append(redis_password() or "")
        return Outage(
            endpoint(url),
            lambda level, msg: self.state.log(level, msg),
            what="deviceq api" if api_url else "redis",
            secrets=secrets,
        )

    def _dispatcher(self, settings: WorkerSettings, pool: str) -> TaskDispatcher:
        spec = settings.goal_runner
        assert spec is not None
        if spec.name == "command" and "term_grace" not in spec.options:
            spec = RunnerSpec(spec.name, {**spec.options, "term_grace": settings.stop_grace})
        goal = build_goal_runner(spec, settings.isolation, kill_grace=settings.stop_grace)
        wf = build_workflow_runner(
            settings.workflow_runner, spec, settings.isolation, kill_grace=settings.stop_grace
        )
        return TaskDispatcher(
            goal,
            wf,
            self.host.get_workflow,
            stop_grace=settings.stop_grace + 2.0,
            log_fields={"pool": pool},
        )

    # -- lifecycle ---------------------------------------------------------------------------
    def run(self) -> int:
        """Run the daemon until stopped; returns the process exit code."""
        if threading.current_thread() is threading.main_thread():
            self._install_signals()
        code = self._startup()
        if code:
            return code
        if threading.current_thread() is threading.main_thread():
            heap.settle()  # (the process is this daemon's alone)
        loops = [("heartbeat", self.upkeep.heartbeat_loop), ("renew", self.upkeep.renew_loop)]
        if self.settings.device_check:
            loops.append(("device-check", self.upkeep.check_loop))
        if self.health.enabled or (self.devices.dynamic and self.settings.health_check):
            loops.append(("health", self.health.loop))
        if self.devices.dynamic:
            loops.append(("devices", self.devices.loop))
        for name, target in loops:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        try:
            self._main_loop()
            self._drain()
        finally:
            self.state.closed.set()
            self.state.beat_now.set()
            self.state.renew_now.set()
            for t in self._threads:
                t.join(self.settings.socket_timeout + CTL_BLOCK + 1)
            if self.state.fatal_reason is None:
                with contextlib.suppress(Exception):
                    self.host.end_session()
            for c in (self.host, self.waiter, self.ctl):
                c.close()
        if self.state.fatal_reason is not None:
            self.state.log(logging.ERROR, f"host worker stopped: {self.state.fatal_reason}")
        else:
            self.state.log(logging.INFO, "host worker stopped")
        return self.state.exit_code

    def stop(self) -> None:
        """Begin a drain (what SIGTERM does); a second call skips the grace period."""
        if self.state.stopping.is_set():
            self.state.hurry.set()
        self.state.stopping.set()
        self.state.changed.set()
        threading.Thread(target=self._nudge, daemon=True).start()

    def _install_signals(self) -> None:
        def on_signal(name: str) -> None:
            self.state.signalled = name
            self.stop()

        install_stop_signals(on_signal, self.devices.reload if self.devices.dynamic else None)

    def _summary(self) -> None:
        """One INFO line about what the host did since the last one (if anything)."""
        counts = self.executor.stats.take()
        if any(counts.values()):
            rep = self.executor.reporter  # (report_claims: claimed by reports, since the start)
            self.state.log(logging.INFO, "tasks", running=len(self.state.active_runs()),
                           reports_calls=rep.calls, report_claims=rep.claimed,
                           **counts)  # fmt: skip

    def _nudge(self) -> None:
        """Wake our own blocking inbox and control waits (best effort)."""
        with contextlib.suppress(Exception):
            self.host.nudge()

    def _startup(self) -> int:
        self.host.storage_warning(f"host daemon {self.settings.host_id} (pool {self.pool})")
        if self.devices.dynamic:
            self.devices.refresh()  # discovered devices are in the first heartbeat
        if self.settings.device_check:
            self.upkeep.check_devices()

        def first() -> Any:
            self.upkeep.refresh_config()
            info = self._start_session()
            # health checks: registered devices are taken for their joining check before the
            # heartbeat puts them among the idle candidates, new ones right after (the
            # heartbeat that registers them reports them busy meanwhile)
            self.health.prepare()
            hb = self.host.heartbeat(self.health.first_snapshot(self.state.snapshot()))
            self.state.apply_heartbeat(hb)
            self.health.prepare()
            self.health.take_joining()
            return info

        try:
            # a TLS failure at start is configuration, not an outage: fail in one line (while
            # running, it is retried like any outage, its reason in the log)
            info = self.outage.call(first, self.state.stopping.is_set, never=(TLSError,))
        except redis.AuthenticationError as exc:  # a wrong or missing password: never transient
            self.state.log(logging.ERROR, f"cannot start: Redis refused the credentials: {exc}")
            return EXIT_START_REFUSED
        except DeviceqError as exc:
            why = str(exc) if isinstance(exc, AuthError) else f"{type(exc).__name__}: {exc}"
            self.state.log(logging.ERROR, f"cannot start: {why}")
            return EXIT_START_REFUSED
        if info is None:
            return 0
        fields: dict[str, Any] = {"session": self.session_id, "epoch": info.epoch}
        if info.replaced:
            fields["replaced"] = info.replaced
        if info.handed_back:
            fields["handed_back"] = info.handed_back
        if self.settings.health_check:
            fields["health_checks"] = ",".join(sorted(self.settings.health_check))
            unused = set(self.settings.health_check) - {
                d.driver_type for d in self.settings.devices
            }
            if unused:
                self.state.log(logging.WARNING, "health check for a driver type no device of "
                               "this host has", driver_types=",".join(sorted(unused)))  # fmt: skip
        self.state.log(
            logging.INFO,
            "host worker started",
            devices=len(self.state.devices),
            goal_runner=str(self.settings.goal_runner),
            workflow_runner=str(self.settings.workflow_runner),
            **fields,
        )
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
            how = {
                "dead": "its daemon is gone",
                "takeover": "taken over",
                "start": "its daemon stopped heartbeating",
            }[mode]
            self.state.log(
                logging.WARNING if mode == "takeover" else logging.INFO,
                f"replaced session {info.replaced} ({how})",
                handed_back=info.handed_back,
            )
        return info

    # -- main loop ---------------------------------------------------------------------------
    def _main_loop(self) -> None:
        while not self.state.stopping.is_set():
            try:
                self._main_loop_inner()
            except Exception:  # noqa: BLE001 - the daemon must survive a bug in one pass
                self.state.log_exception("main loop failed; continuing")
                self.state.stopping.wait(1.0)

    def _main_loop_inner(self) -> None:
        delay = 0.05
        self.backoff.reset()
        wait = False  # the last claim emptied the inbox: wait for a wake-up before the next
        while not self.state.stopping.is_set():
            free = self.state.free_devices()
            # an operator's drain stops new assignments; what was assigned before still runs
            if not free:
                self.state.changed.wait(self.settings.poll_interval)
                self.state.changed.clear()
                # a device freed here was freed in Redis first (its report), and its next
                # assignment pushes the wake list: wait for that (at once when pushed already)
                wait = True
                continue
            try:
                sent = time.monotonic()  # (after a wait: the claim ran at this time or later)
                if wait:
                    claimed = self.waiter.wait_and_claim(self._wait_timeout(), len(free))
                else:
                    claimed = self.host.claim(len(free))
                self.outage.ok(sent)  # (a long poll sent before an outage began ends none)
                self.backoff.reset()
                delay = 0.05
            except TRANSIENT as exc:
                self._unreachable(exc)
                wait = False
                continue
            except (AuthError, SessionSuperseded) as exc:
                self.state.fatal(exc)
                return
            except DeviceqError as exc:
                self.state.log(logging.ERROR, f"claim refused: {type(exc).__name__}: {exc}")
                self.state.stopping.wait(max(1.0, delay))
                delay = min(5.0, delay * 2)
                wait = False
                continue
            for a in claimed:
                self.executor.start(a, sent)
            # fewer than asked: the inbox was empty (claim drains it up to the max), so an
            # immediate second claim would be an empty round trip; the next claim follows a
            # wait for the wake list, which a later assignment pushes (the two in one round
            # trip where the connection allows: `HostClient.wait_and_claim`)
            wait = len(claimed) < len(free)

    def _wait_timeout(self) -> float:
        """How long one inbox wait lasts: about ``poll_interval``, and at most a tenth of the
        lease (a claim that ends a wait may have run as soon as the wait began: its lease
        is counted from then)."""
        timeout = self.settings.poll_interval * random.uniform(0.75, 1.25)
        return max(0.05, min(timeout, self.state.lease_ttl / 10))

    def _unreachable(self, exc: Exception) -> None:
        """A claim or an inbox wait met an outage: back off (ends early if Redis is back)."""
        self.outage.failed(exc)
        self.outage.pause(self.backoff.next(), self.state.stopping.is_set)

    # -- drain -------------------------------------------------------------------------------
    def _drain(self) -> None:
        s = self.settings
        grace_end = time.monotonic() + s.grace
        if self.state.fatal_reason is None:
            self.state.log(
                logging.INFO,
                "draining: no new work",
                running=len(self.state.active_runs()),
                grace=s.grace,
                signal=self.state.signalled,
            )

        def past_grace() -> bool:
            return (
                time.monotonic() > grace_end
                or self.state.hurry.is_set()
                or self.state.fatal_reason is not None
            )

        def give_up() -> bool:
            # the server stays unreachable: retried within the grace period while something
            # runs; with nothing running there is nothing to wait for (assigned work not
            # started comes back when its lease expires)
            return past_grace() or not self.state.active_runs()

        claimed: list[Assignment] = []
        sent = time.monotonic()
        if self.state.fatal_reason is None:
            try:
                quick = Backoff(0.05, 1.0)  # (within the grace period)
                self.outage.call(lambda: self.host.set_draining(True), give_up, backoff=quick)
                # hand back what was assigned to us but not started
                sent = time.monotonic()
                claimed = (
                    self.outage.call(
                        lambda: self.host.claim(max(1, len(self.state.devices))),
                        give_up,
                        backoff=quick,
                    )
                    or []
                )
            except (AuthError, SessionSuperseded) as exc:
                self.state.fatal(exc)
            except DeviceqError as exc:
                self.state.log(logging.ERROR, f"drain refused: {type(exc).__name__}: {exc}")
        for a in claimed:
            self.executor.start(a, sent)  # stopping is set: released at once
        while self.state.active_runs() and not past_grace():
            self.state.changed.wait(0.1)
            self.state.changed.clear()
        left = self.state.active_runs()
        if left and self.state.fatal_reason is None:
            self.state.log(
                logging.INFO, "grace period over: stopping and handing back", running=len(left)
            )
            for run in left:
                run.stop("drain")
        # runners get stop_grace to stop (the dispatcher abandons them after that), then the
        # reports a few seconds to get through
        self.state.abandon_reports_at = time.monotonic() + s.stop_grace + 5.0 + 2 * s.socket_timeout
        for run in left:
            run.ended.wait(max(0.0, self.state.abandon_reports_at + 1.0 - time.monotonic()))
