"""Coalesced reports: the attempts that end together on a host are reported in one
``report.lua`` call (``HostClient.report_many``) instead of one call each, by one reporter
thread. A run hands its report over (`Reporter.post`) and its thread is free at once: what
follows the answer (the run's bookkeeping) is the report's ``then``, run by the reporter
thread once the answer is in, so a runner thread never waits on a socket.

Reports that arrive while a call is in flight go together in the next call (up to
``MAX_BATCH``); and while other runs of the host are still going, a report waits up to
``linger`` seconds (``--report-linger``, 5 ms) for those that end meanwhile: the runs of a busy
host then end in waves that share a call (and the scheduler's passes that follow them), where
a call each cost the host, the scheduler and Redis about twice the CPU per task. A host's lone
run is reported at once. `Reporter.send` waits for the answer (the rare paths: hand-backs,
abandoned runners).

A report also claims (``report.lua`` with ``claim_max``: `HostLink.report_and_claim`) the
assignments already waiting in the host's inbox, up to its free devices and those its reports
free (a device's next-task hint: report.lua assigns it there), when the reporter
has somewhere to start them (``on_claimed``, the executor's start): a host whose runs end
while others were assigned takes them in the same round trip, and starts them at once.

Redis being unreachable is ridden out (as for every host call); in durable mode a batch that
was applied but not confirmed is sent again (an applied report answers ``dup:``) for at most
two lease lengths. The thread ends after ``IDLE_EXIT`` seconds with nothing to send and starts
again with the next report."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..core.backoff import Outage
from ..core.errors import AuthError, DeviceqError, NotConfirmed, SessionSuperseded
from ..core.models import Assignment
from .link import HostLink, Report
from .state import HostState

MAX_BATCH = 200
IDLE_EXIT = 5.0  # seconds without a report before the reporter thread ends
FREEING = frozenset({"done", "failed", "cancelled"})  # outcomes whose report frees the device


@dataclass(eq=False)
class Pending:
    """One report waiting for its answer (None: not delivered; see ``error``); ``then`` runs
    in the reporter thread once it is answered (or given up)."""

    report: Report
    fields: dict[str, object]
    then: Callable[[Pending], None] | None = None
    answer: str | None = None
    error: str | None = None
    over: bool = False  # answered or given up
    _done: threading.Event | None = field(default=None, repr=False)

    @property
    def done(self) -> threading.Event:
        """Set once the report is answered or given up. Made when first asked for: a posted
        report whose ``then`` does the rest (most of them) never needs one."""
        if self._done is None:
            with _DONE_MADE:
                if self._done is None:
                    self._done = threading.Event()
            if self.over:  # (ended while it was being made)
                self._done.set()
        return self._done

    def ended(self) -> None:
        """The report is answered, or given up: wake whoever waits for it."""
        self.over = True
        if self._done is not None:
            self._done.set()


_DONE_MADE = threading.Lock()  # (makes `Pending.done` once, whichever thread asks first)


class Reporter:
    """Sends the host's reports (see the module docstring)."""

    def __init__(
        self,
        state: HostState,
        host: HostLink,
        linger: float = 0.0,
        on_claimed: Callable[[list[Assignment], float], None] | None = None,
    ) -> None:
        self.state = state
        self.host = host
        self.linger = linger
        # starts what a report claimed (sent: when the call was sent); None: reports only
        self.on_claimed = on_claimed
        self.claimed = 0  # assignments claimed by reports
        self._took: list[tuple[list[Assignment], float]] = []  # (the delivering call's claims)
        self._queue: deque[Pending] = deque()
        self._cv = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._lingering = False  # (new reports do not wake the thread meanwhile)
        self._wake_due = False  # a deferred wake-up (`post`'s ``defer``) is to come
        self.calls = 0
        self.sent = 0
        self.outage: Outage | None = None  # the daemon's (its outage lines, its backoff)

    def post(
        self,
        report: Report,
        fields: dict[str, object],
        then: Callable[[Pending], None] | None,
        defer: Callable[[Callable[[], None]], object] | None = None,
    ) -> Pending:
        """Hand ``report`` to the reporter thread and return at once; ``then(pending)`` runs
        in that thread after the answer (an exception in it is logged). ``defer``: what calls
        a function soon in the caller's thread (the host's event loop's ``call_soon``): the
        reporter thread is then woken once by that call for every report posted until it
        runs (the async runs that end in one pass of the loop), not once per report."""
        p = Pending(report, fields, then)
        later = False
        with self._cv:
            self._queue.append(p)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="reporter", daemon=True)
                self._thread.start()
            elif defer is not None:
                later, self._wake_due = not self._wake_due, True
            else:
                self._wake()
        if later:
            assert defer is not None
            defer(self._wake_deferred)
        return p

    def _wake(self) -> None:
        """(Lock held.) Wake the thread for the reports queued: a lingering one only once no
        other report can come."""
        if not self._lingering or not self._more_to_come():
            self._cv.notify()

    def _wake_deferred(self) -> None:
        with self._cv:
            self._wake_due = False
            self._wake()

    def send(self, report: Report, fields: dict[str, object]) -> Pending:
        """Report ``report`` and wait for its answer (or for the host to give up on it)."""
        if threading.current_thread() is self._thread:  # (from a ``then``: no self-wait)
            p = Pending(report, fields)
            self._deliver([p])
            return p
        p = self.post(report, fields, None)
        p.done.wait()
        return p

    def _loop(self) -> None:
        """Send what is waiting, batch after batch; end after ``IDLE_EXIT`` s of nothing."""
        while True:
            with self._cv:
                if not self._queue:
                    self._cv.wait(IDLE_EXIT)
                if not self._queue:
                    self._thread = None
                    return
                self._linger()
                n = min(MAX_BATCH, len(self._queue))
                batch = [self._queue.popleft() for _ in range(n)]
            try:
                self._deliver(batch)
            except BaseException as exc:  # noqa: BLE001 - never leave a run waiting forever
                for p in batch:
                    if not p.over:
                        p.error = f"interrupted while reporting: {type(exc).__name__}"
                        p.ended()
            for p in batch:
                if p.then is not None:
                    try:
                        p.then(p)
                    except Exception:  # noqa: BLE001 - the next reports still go
                        self.state.log_exception("after a report", **p.fields)

    def _linger(self) -> None:
        """(Lock held.) Wait up to ``linger`` for more reports while other runs still go."""
        end = time.monotonic() + self.linger
        self._lingering = True
        try:
            while self._more_to_come():
                left = end - time.monotonic()
                if left <= 0:
                    return
                self._cv.wait(left)
        finally:
            self._lingering = False

    def _more_to_come(self) -> bool:
        """(Lock held.) Room in the batch, and runs still going whose reports may join it."""
        n = len(self._queue)
        return n < MAX_BATCH and len(self.state.runs) > n

    def claim_max(self, reports: Sequence[Report] = ()) -> int:
        """How many assignments a report may claim now: the host's free devices and those of
        the ``reports``' runs that end (done, failed, cancelled: their runners have ended, and
        the call frees them before it claims, so it may bring their next task, a next-task
        hint's: report.lua); none while it stops, or without ``on_claimed``."""
        if self.on_claimed is None or self.state.stopping.is_set():
            return 0
        ending = sum(1 for r in reports if r.outcome in FREEING)
        return len(self.state.free_devices()) + ending

    def _deliver(self, batch: list[Pending]) -> None:
        reports = [p.report for p in batch]
        self._took = []
        try:
            if self.outage is not None:  # retried quietly: the outage says it once
                answers = self.outage.call(
                    lambda: self._send(reports, batch), self.state.give_up_reports
                )
            else:
                answers = self.state.retry(
                    "report", lambda: self._send(reports, batch), self.state.give_up_reports
                )
        except (AuthError, SessionSuperseded) as exc:
            self.state.fatal(exc)
            answers = None
            for p in batch:
                p.error = f"{type(exc).__name__}: {exc}"
        except DeviceqError as exc:
            answers = None
            for p in batch:
                p.error = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # noqa: BLE001 - never leave a run waiting forever
            answers = None
            for p in batch:
                p.error = f"{type(exc).__name__}: {exc}"
        for i, p in enumerate(batch):
            if answers is not None:
                p.answer = str(answers[i])
            p.ended()
        took, self._took = self._took, []
        for claimed, sent in took:  # (started at once, whatever became of the reports)
            self._start(claimed, sent)

    def _start(self, claimed: list[Assignment], sent: float) -> None:
        if not claimed or self.on_claimed is None:
            return
        self.claimed += len(claimed)
        try:
            self.on_claimed(claimed, sent)
        except Exception:  # noqa: BLE001 - the reports' answers still go out
            self.state.log_exception("starting what a report claimed")

    def _send(self, reports: list[Report], batch: list[Pending]) -> list[str]:
        """One ``report_many`` call; in durable mode again until confirmed (bounded)."""
        deadline = time.monotonic() + 2 * max(self.state.lease_ttl, 1.0)
        delay = 0.1
        while True:
            self.calls += 1
            sent = time.monotonic()
            try:
                answers, claimed = self.host.report_and_claim(reports, self.claim_max(reports))
                self._took.append((claimed, sent))
                self.sent += len(reports)
                return answers
            except NotConfirmed as exc:
                self._took.append((list(exc.claimed), sent))
                answers = [str(a) for a in exc.result or ["?"] * len(reports)]
                if time.monotonic() > deadline or self.state.give_up_reports():
                    for p, a in zip(batch, answers, strict=False):
                        self.state.log(
                            logging.ERROR,
                            "report applied but never confirmed durable",
                            answer=a,
                            **p.fields,
                        )
                    return answers
                self.state.log(logging.WARNING, f"report not confirmed durable ({exc}); "
                               "sending it again", reports=len(reports))  # fmt: skip
                time.sleep(delay)
                delay = min(2.0, delay * 2)
