"""Coalesced reports: the attempts that end together on a host are reported in one
``report.lua`` call (``HostClient.report_many``) instead of one call each. A run's thread hands
its report to the `Reporter` and waits for its own answer; the reporter thread sends whatever
is waiting (up to ``MAX_BATCH``) as soon as the previous call returned, so a lone report goes
out at once and a burst shares one round trip. Redis being unreachable is ridden out (as for
every host call); in durable mode a batch that was applied but not confirmed is sent again
(an applied report answers ``dup:``) for at most two lease lengths."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from ..core.errors import AuthError, DeviceqError, NotConfirmed, SessionSuperseded
from .client import HostClient, Report
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
    """The host's one reporting thread (see the module docstring)."""

    def __init__(self, state: HostState, host: HostClient) -> None:
        self.state = state
        self.host = host
        self._queue: deque[Pending] = deque()
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="reporter", daemon=True)
        self._started = False
        self.calls = 0
        self.sent = 0

    def send(self, report: Report, fields: dict[str, object]) -> Pending:
        """Queue ``report`` and wait for its answer (or for the host to give up on it)."""
        p = Pending(report, fields)
        with self._wake:
            if not self._started:
                self._started = True
                self._thread.start()
            self._queue.append(p)
            self._wake.notify()
        p.done.wait()
        return p

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._queue:
                    self._wake.wait()
                batch = [self._queue.popleft() for _ in range(min(MAX_BATCH, len(self._queue)))]
            self._deliver(batch)

    def _deliver(self, batch: list[Pending]) -> None:
        reports = [p.report for p in batch]
        try:
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
