"""The host daemon's upkeep threads: heartbeats (`Upkeep.heartbeat_loop`: the device snapshot;
its answer brings the quarantine set and the operator's drain; the renewals due before the next
heartbeat ride on it, one call for both, where the link can: `Upkeep.riding_renewals`), lease
renewals (those no heartbeat took in time, and those a control message asks for) and the control
list (`Upkeep.renew_loop`: each lease renewed a third into it; between renewals a blocking wait
on ``host:ID:ctl``, so a cancel, a preemption, a quarantine change, a takeover or a removal is
acted on at once: a renewal at most every `CTL_RENEW_GAP` and within `CTL_RENEW_SHARE` of the
time, a heartbeat at most every `CTL_MIN_INTERVAL`, however many messages arrive), and the
optional device
checks (`Upkeep.check_loop`). While Redis is unreachable each loop backs off on its own
(`deviceq.core.backoff.Backoff`) and says nothing itself: the daemon's `Outage` writes one
line when Redis goes away and one when it is back, and ends every loop's pause at once then."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence

from ..core.backoff import Backoff, Outage
from ..core.errors import AuthError, DeviceOwned, DeviceqError, InvalidInput, SessionSuperseded
from ..core.models import DeviceState
from .device_config import DeviceConfig
from .heartbeat_sync import Heartbeat
from .link import DeviceReport, HostLink, Renewal
from .run import Run
from .runners import CommandTemplate, kill_group
from .settings import DEVICE_CHECK_PLACEHOLDERS
from .state import TRANSIENT, HostState

RENEW_CHUNK = 200
CHECK_BUSY_EXIT = 3  # a device check exiting 3 means "in use outside deviceq"
CTL_BLOCK = 1.0  # longest wait on the control list (bounds how late a stop is noticed)
CTL_MIN_INTERVAL = 0.25  # at most one heartbeat for control messages per this many seconds
CTL_RENEW_GAP = 0.02  # at least this long between two renewals for control messages
CTL_RENEW_SHARE = 0.1  # and at most this share of the time spent in them (their gap grows)
OWNED_RE = re.compile(r"device (\S+) belongs to another host")  # heartbeat.lua's DEVICE_OWNED
ATTRS_PAUSE = 60.0  # seconds heartbeats go without attributes after Redis refused them


class Upkeep:
    """The upkeep loops of one host daemon (each runs in a thread of its own)."""

    def __init__(
        self,
        state: HostState,
        host: HostLink,
        ctl: HostLink,
        summary: Callable[[], None] = lambda: None,
        outage: Outage | None = None,
    ) -> None:
        self.state = state
        self.settings = state.settings
        self.host = host
        self.ctl = ctl
        self.summary = summary  # logs what the host did lately (every ~10 s)
        self.last_ctl = float("-inf")  # when the renew loop last reacted to a control message
        self.ctl_gap = CTL_RENEW_GAP  # the least time from that reaction to the next
        self.last_ctl_beat = float("-inf")  # when a control message last brought a heartbeat
        self.attrs_paused_until = float("-inf")  # attributes refused: heartbeats without them
        self.beat_owed = False  # a control message came within CTL_MIN_INTERVAL of that
        # (one per daemon, shared with its other loops: see deviceq.core.backoff)
        self.outage = outage or Outage("its address", lambda level, msg: state.log(level, msg))

    def hb_interval(self) -> float:
        return self.settings.heartbeat_interval or max(0.05, self.state.host_timeout / 3)

    def refresh_config(self) -> None:
        cfg = self.host.config()
        self.state.lease_ttl, self.state.host_timeout = cfg.lease_ttl, cfg.host_timeout
        self.state.log_max_bytes = cfg.log_max_bytes

    def heartbeat_loop(self) -> None:
        next_cfg = time.monotonic() + 10.0
        backoff = Backoff()
        while not self.state.closed.is_set():
            try:
                reports = self.state.adjust_snapshot(self.state.snapshot())
                riding = self.riding_renewals()
                sent = time.monotonic()
                hb = self.beat_with_attributes(
                    reports, [(r.task_id, r.assignment.lease_id) for r in riding]
                )
                self.outage.ok()
                backoff.reset()
                if hb.renewals is not None:
                    self.apply_renewals(riding, list(hb.renewals), sent)
                self.state.apply_heartbeat(hb)
                self.state.after_heartbeat()
                if time.monotonic() >= next_cfg:
                    self.refresh_config()
                    self.summary()
                    next_cfg = time.monotonic() + 10.0
                wait = self.hb_interval()
            except TRANSIENT as exc:
                self.outage.failed(exc)
                self.outage.pause(backoff.next(), self.state.closed.is_set)
                continue
            except (AuthError, SessionSuperseded) as exc:
                self.state.fatal(exc)
                return
            except DeviceOwned as exc:
                # a device that joined while running is another host's: leave it out (the
                # others must go on heartbeating), beat again at once without it
                m = OWNED_RE.search(str(exc))
                if m and m.group(1) in self.state.devices:
                    self.state.device_refused(m.group(1), "it belongs to another host")
                    wait = 0.0
                else:
                    self.state.log(logging.ERROR, f"heartbeat refused: DeviceOwned: {exc}")
                    wait = max(1.0, self.hb_interval())
            except DeviceqError as exc:
                self.state.log(logging.ERROR, f"heartbeat refused: {type(exc).__name__}: {exc}")
                wait = max(1.0, self.hb_interval())
            except Exception:  # noqa: BLE001 - the heartbeat must survive anything
                self.state.log_exception("heartbeat failed")
                wait = 1.0
            self.state.beat_now.wait(wait)
            self.state.beat_now.clear()

    def beat_with_attributes(
        self, reports: list[DeviceReport], leases: Sequence[tuple[str, str]] = ()
    ) -> Heartbeat:
        """Heartbeat ``reports`` with the devices' attributes (only what changed rides on
        it) and the ``leases`` to renew. Should Redis refuse the attributes (a device would
        end with more than 32 attributes with an operator's), the heartbeat goes without
        them, so the host stays alive, and so do the next ones for `ATTRS_PAUSE` seconds (then
        they are tried again), logged."""
        if time.monotonic() < self.attrs_paused_until:
            return self.host.heartbeat(reports, leases=leases)
        attrs = self.state.attributes.reported(self.state.served())
        try:
            return self.host.heartbeat(reports, attributes=attrs, stored=True, leases=leases)
        except InvalidInput as exc:
            self.state.log(logging.ERROR, f"attributes refused, heartbeats go without them "
                           f"for {ATTRS_PAUSE:.0f} s: {exc}")  # fmt: skip
            self.attrs_paused_until = time.monotonic() + ATTRS_PAUSE
            return self.host.heartbeat(reports, leases=leases)

    def riding_renewals(self) -> list[Run]:
        """The runs whose renewal rides on this heartbeat (where the link renews on its
        heartbeat): those due before the next heartbeat (their lease a third gone by then), at
        most `RENEW_CHUNK`. The renew loop still renews any run when it is due (a heartbeat
        late or refused, a lease shorter than three heartbeat intervals): a lease never waits
        for a heartbeat."""
        if not self.host.heartbeat_renews:
            return []
        by = time.monotonic() + self.hb_interval()
        runs = [r for r in self.state.active_runs()
                if r.reason != "lost" and not r.ended.is_set() and r.renew_at <= by]  # fmt: skip
        return runs[:RENEW_CHUNK]

    def renew_loop(self) -> None:
        """Renew each lease a third into it; between renewals block on the host's control
        list, so a cancel request, a quarantine change, a takeover or a removal is acted on at
        once; stop runs whose lease ended locally without a renewal."""
        backoff = Backoff()
        while not self.state.closed.is_set():
            runs = [
                r for r in self.state.active_runs() if r.reason != "lost" and not r.ended.is_set()
            ]
            now = time.monotonic()
            for r in runs:
                if r.lease.expired and r.reason is None:
                    self.state.log(
                        logging.WARNING,
                        "lease ended without a renewal: stopping the runner",
                        **r.fields(),
                    )
                    r.stop("expired")
            due = [r for r in runs if r.renew_at <= now + 0.05 and r.reason != "lost"]
            now_asked = self.state.renew_now.is_set()
            if now_asked:
                self.state.renew_now.clear()
                due = [r for r in runs if r.reason != "lost"]
            wait = CTL_BLOCK
            try:
                if due:
                    self.renew_once(due)
                if now_asked:  # (the gap to the next reaction: see wait_for_control)
                    took = time.monotonic() - now
                    self.ctl_gap = min(CTL_MIN_INTERVAL, max(CTL_RENEW_GAP, took / CTL_RENEW_SHARE))
                pending = [r.renew_at for r in self.state.active_runs() if r.reason != "lost"]
                if pending:
                    wait = min(wait, max(0.01, min(pending) - time.monotonic()))
                if self.state.closed.is_set():
                    return
                self.wait_for_control(wait)
                if not self.outage.down:  # (the calls made got through, if any were made)
                    backoff.reset()
            except TRANSIENT as exc:
                self.outage.failed(exc)
                # back at the latest when a lease ends locally: its runner is stopped then
                ends = [x for r in runs if r.reason is None and (x := r.lease.remaining())]
                delay = min([backoff.next(), *(x for x in ends if x > 0)])
                self.outage.pause(max(0.05, delay), self.state.closed.is_set)
            except (AuthError, SessionSuperseded) as exc:
                self.state.fatal(exc)
                return
            except DeviceqError as exc:
                self.state.log(logging.ERROR, f"renew refused: {type(exc).__name__}: {exc}")
                self.state.closed.wait(0.5)
            except Exception:  # noqa: BLE001 - renewals must survive anything
                self.state.log_exception("renew failed")
                self.state.closed.wait(0.5)

    def wait_for_control(self, wait: float) -> None:
        """Wait up to ``wait`` seconds for a control message, then renew at once and
        heartbeat. A flood of messages cannot make the daemon call a script per message
        (each wake-up drains the list): the renewals for them are at least `CTL_RENEW_GAP`
        apart, and ten times as far apart as the last one took (``ctl_gap``: within
        `CTL_RENEW_SHARE` of the time), so a preemption or a cancel of a run on a host that
        just reacted to one is acted on within a few tens of milliseconds; the heartbeats for
        them at most one per `CTL_MIN_INTERVAL` (one owed meanwhile is sent when it is up)."""
        now = time.monotonic()
        if self.beat_owed:
            beat_in = self.last_ctl_beat + CTL_MIN_INTERVAL - now
            if beat_in <= 0:
                self._ctl_beat(now)
            else:
                wait = min(wait, beat_in)
        quiet = self.last_ctl + self.ctl_gap - now
        if quiet > 0:
            self.state.closed.wait(min(wait, quiet))
            return
        sent = time.monotonic()
        msg = self.ctl.wait_for_control(wait)
        self.outage.ok(sent)  # (a long poll sent before an outage began ends none)
        if msg is not None:
            self.last_ctl = now = time.monotonic()
            self.state.renew_now.set()
            if now - self.last_ctl_beat >= CTL_MIN_INTERVAL:
                self._ctl_beat(now)
            else:
                self.beat_owed = True

    def _ctl_beat(self, now: float) -> None:
        """A heartbeat for control messages (its answer brings a quarantine change, a drain)."""
        self.last_ctl_beat = now
        self.beat_owed = False
        self.state.beat_now.set()

    def renew_once(self, runs: list[Run] | None = None) -> None:
        """Renew the given leases (every active one by default), batched; act on ``cancel``
        and ``lost`` answers."""
        if runs is None:
            runs = [r for r in self.state.active_runs() if r.reason != "lost"]
        for start in range(0, len(runs), RENEW_CHUNK):
            chunk = runs[start : start + RENEW_CHUNK]
            sent = time.monotonic()
            answers = self.host.renew([(r.task_id, r.assignment.lease_id) for r in chunk])
            self.outage.ok()
            self.apply_renewals(chunk, answers, sent)

    def apply_renewals(self, chunk: list[Run], answers: list[Renewal], sent: float) -> None:
        """Act on the renewals of ``chunk`` (by `renew_once` or a heartbeat, sent at
        ``sent``): extend each run's lease; stop a run on ``cancel``, ``preempt:GRACE_MS``
        and ``lost``."""
        lost = False
        for run, ans in zip(chunk, answers, strict=True):
            if run.ended.is_set():
                continue
            if not ans.lost:
                run.renewed(sent, ans.lease_ms)
                if self.settings.renew_interval:
                    run.renew_at = min(run.renew_at, sent + self.settings.renew_interval)
            if ans.status == "cancel" and run.reason is None:
                self.state.log(logging.INFO, "cancel requested: stopping runner", **run.fields())
                run.stop("cancel")
            elif ans.status.startswith("preempt:") and run.reason is None:
                grace_ms = ans.status.partition(":")[2]
                run.stop_grace = int(grace_ms) / 1000 if grace_ms.isdigit() else None
                self.state.log(
                    logging.INFO,
                    "preempted: stopping runner",
                    grace_s=run.stop_grace,
                    **run.fields(),
                )
                run.stop("preempt")
            elif ans.lost:
                self.state.log(
                    logging.WARNING,
                    f"lease lost ({ans.reason}): stopping runner, reporting nothing",
                    **run.fields(),
                )
                run.stop("lost")
                lost = True
        if lost:
            self.state.beat_now.set()  # prove this host alive: its devices return to service

    def check_loop(self) -> None:
        while not self.state.closed.wait(self.settings.device_check_interval):
            try:
                self.check_devices()
            except Exception:  # noqa: BLE001 - keep checking
                self.state.log_exception("device check failed")

    def check_devices(self) -> None:
        """Run the device check for every device not running a deviceq task: exit 0 -> idle,
        exit 3 -> busy (in use outside deviceq), anything else or a timeout -> offline."""
        for dev in self.state.served():
            with self.state.lock:
                running = dev.device_id in self.state.by_device
            if running or self.state.closed.is_set():
                continue
            state = self.check(dev)
            with self.state.lock:
                if self.state.devices.get(dev.device_id) is not dev or dev.device_id in (
                    self.state.retiring
                ):
                    continue  # removed or changed meanwhile: its result means nothing now
                was = self.state.states[dev.device_id]
                self.state.states[dev.device_id] = state
            if state is not was:
                self.state.log(
                    logging.WARNING if state is not DeviceState.idle else logging.INFO,
                    f"device now {state.value}",
                    device=dev.device_id,
                )
                self.state.beat_now.set()
                self.state.changed.set()

    def check(self, dev: DeviceConfig) -> DeviceState:
        assert self.settings.device_check is not None
        template = CommandTemplate.parse(self.settings.device_check, DEVICE_CHECK_PLACEHOLDERS)
        argv = template.render(
            {"device_id": dev.device_id, "driver_type": dev.driver_type,
             "tags": ",".join(dev.tags), "serial": dev.serial or dev.device_id}
        )  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "DEVICEQ_HOST_TOKEN"}
        env.update(
            DEVICEQ_DEVICE_ID=dev.device_id,
            DEVICEQ_DRIVER_TYPE=dev.driver_type,
            DEVICEQ_TAGS=",".join(dev.tags),
        )
        if dev.serial:
            env["ANDROID_SERIAL"] = dev.serial
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
            self.state.log(logging.ERROR, f"device check cannot start: {exc}", device=dev.device_id)
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
