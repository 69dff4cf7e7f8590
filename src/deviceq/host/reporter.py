"""Coalesced reports: the attempts that end together on a host are reported in one
``report.lua`` call (``HostClient.report_many``) instead of one call each. No thread of its
own: a run that reports while no call is in flight sends its report itself, at once, from its
own thread; reports that arrive while a call is in flight wait, and the sending thread takes
them all (up to ``MAX_BATCH``) in its next call, until none is left. A lone report thus costs
no hand-off between threads, and a burst shares one round trip. Redis being unreachable is
ridden out (as for every host call); in durable mode a batch that was applied but not
confirmed is sent again (an applied report answers ``dup:``) for at most two lease lengths."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from ..core.backoff import Outage
from ..core.errors import AuthError, DeviceqError, NotConfirmed, SessionSuperseded
from .client import HostLink, Report
from .state import HostState

MAX_BATCH = 200


@dataclass(eq=False)
class Pending:
    """One report waiting for its answer (None: not delivered; see ``error``)."""

    report: Report
    fields: dict[str, object]
    done: threading.Event = field(default_factory=threading.Event)
    answer: str | None = None
    error: str | None = None


class Reporter:
    """Sends the host's reports (see the module docstring)."""

    def __init__(self, state: HostState, host: HostLink) -> None:
        self.state = state
        self.host = host
        self._queue: deque[Pending] = deque()
        self._lock = threading.Lock()
        self._sending = False  # a thread is sending: new reports wait for it to take them
        self.calls = 0
        self.sent = 0
        self.outage: Outage | None = None  # the daemon's (its outage lines, its backoff)

    def send(self, report: Report, fields: dict[str, object]) -> Pending:
        """Report ``report`` and wait for its answer (or for the host to give up on it)."""
        p = Pending(report, fields)
        with self._lock:
            self._queue.append(p)
            lead = not self._sending
            self._sending = True
        while True:
            if lead:
                self._drain()  # p was waiting: it is answered when nothing is left
            if p.done.wait(0 if lead else 0.5):
                return p
            with self._lock:  # the sending thread died (never expected): take over
                lead = not self._sending
                self._sending = True

    def _drain(self) -> None:
        """Send what is waiting, batch after batch, until nothing is (then stop sending)."""
        batch: list[Pending] = []
        try:
            while True:
                with self._lock:
                    if not self._queue:
                        self._sending = False
                        return
                    n = min(MAX_BATCH, len(self._queue))
                    batch = [self._queue.popleft() for _ in range(n)]
                self._deliver(batch)
        except BaseException:
            with self._lock:
                self._sending = False
            for p in batch:
                if not p.done.is_set():
                    p.error = "interrupted while reporting"
                    p.done.set()
            raise

    def _deliver(self, batch: list[Pending]) -> None:
        reports = [p.report for p in batch]
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
            p.done.set()

    def _send(self, reports: list[Report], batch: list[Pending]) -> list[str]:
        """One ``report_many`` call; in durable mode again until confirmed (bounded)."""
        deadline = time.monotonic() + 2 * max(self.state.lease_ttl, 1.0)
        delay = 0.1
        while True:
            self.calls += 1
            try:
                answers = self.host.report_many(reports)
                self.sent += len(reports)
                return answers
            except NotConfirmed as exc:
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
