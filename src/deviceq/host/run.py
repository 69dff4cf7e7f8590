"""`Run`: one claimed attempt running (or about to run) on one device, with its lease clock
(ended locally a margin before Redis ends the lease: `lease_margin`), its stop reason, its
live log, its progress, its trace and its artifacts folder. `deviceq.host.execution.Executor`
runs it; the host's shared state (`deviceq.host.state.HostState`) keeps the runs by task and
by device."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core import tracing
from ..core.models import Assignment
from .log_stream import RunLog
from .progress import RunProgress
from .runners import LeaseClock, LoopEvent


def lease_margin(lease_s: float) -> float:
    """How long before a lease's expiry in Redis the host treats it as ended (clock rates,
    the time a kill takes): a tenth of it, at most a second."""
    return min(1.0, 0.1 * lease_s)


@dataclass(eq=False)
class Run:
    """One claimed attempt running (or about to run) on one device."""

    assignment: Assignment
    lease: LeaseClock
    renew_at: float  # time.monotonic() of the next renewal (a third into the lease)
    cancel: LoopEvent = field(default_factory=LoopEvent)  # (its setting wakes the watchdog)
    reason: str | None = None  # why it stopped: cancel | preempt | lost | expired | drain | removed
    stop_grace: float | None = None  # (preempt) seconds its runner gives it after the stop signal
    after: Run | None = None  # a previous run on the same device still stopping
    ended: LoopEvent = field(default_factory=LoopEvent)  # (awaited by an async run after it)
    log: RunLog | None = None  # its live log (deviceq.host.log_stream)
    progress: RunProgress | None = None  # what it said of its progress (deviceq.host.progress)
    trace: Any = tracing.NO_ATTEMPT  # its spans (deviceq.core.tracing)
    artifacts_dir: str | None = None  # the attempt's folder until it is queued for upload
    renewed_sent: float = float("-inf")  # when the renewal last applied was sent
    _fields: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def task_id(self) -> str:
        return self.assignment.task.id

    @property
    def device_id(self) -> str:
        return self.assignment.device_id

    def fields(self) -> dict[str, Any]:
        """The run's fields on the host's log lines (made once; not to be changed)."""
        if self._fields is None:
            a = self.assignment
            self._fields = {
                "task": a.task.id,
                "lease": a.lease_id,
                "host": a.host_id,
                "device": a.device_id,
                "attempt": a.attempt,
            }
        return self._fields

    def stop(self, reason: str) -> None:
        """Ask the runner to stop; ``lost`` overrides any earlier reason."""
        if self.reason is None or reason == "lost":
            self.reason = reason
        self.cancel.set()
        # (expired: the lease ended here without a renewal; Redis decides whether it is lost)

    def renewed(self, sent_at: float, lease_ms: int) -> None:
        """A claim or renewal sent at ``sent_at`` granted a lease of ``lease_ms``: the lease
        ends locally a margin before it does in Redis; the next renewal is a third into it."""
        if sent_at < self.renewed_sent:  # (the renew loop's and a heartbeat's renewals may
            return  # cross: the one sent last gives the local end; Redis' end is no earlier)
        self.renewed_sent = sent_at
        lease_s = max(0.001, lease_ms / 1000)
        self.lease.extend(sent_at + lease_s - lease_margin(lease_s))
        self.renew_at = sent_at + lease_s / 3
