"""Running one claimed attempt (a `deviceq.host.run.Run`) on one device: `Executor`, which
starts it (or hands it back), runs it through the `TaskDispatcher` in a long-lived thread
(the runner runs in that thread: no hand-off per run), or, for an async runner, as a coroutine
on the host's one event loop (`deviceq.host.runner_loop`), keeps the device out of service
while a runner that did not stop is still alive, and reports the outcome through
the `Reporter` (coalesced, retried while Redis is unreachable): the run's thread hands the
report over and is free; the reporter's thread ends the run once the report is answered.
Per-task log lines are DEBUG; the daemon logs a summary line now and then."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core import tracing
from ..core.errors import DeviceqError
from ..core.models import Assignment, DeviceState, FailureKind
from ..core.replies import parse
from ..core.vocabulary import ReplyCode
from .artifacts import TESTS_SUFFIX, WHOLE_LOG_SUFFIX, uploader, write_tests
from .dispatcher import DispatchOutcome, TaskDispatcher
from .link import HostLink, Report
from .log_stream import LogStreamer
from .progress import ProgressStreamer
from .reporter import Pending, Reporter
from .run import Run
from .runner_loop import RunnerLoop
from .runner_threads import RunnerThreads
from .runners import LeaseClock
from .state import TRANSIENT, HostState


def run_timeout(host_limit: float, task_limit: float | None) -> float | None:
    """Seconds a run may take: the smaller of the host's ``--task-timeout`` (0: no limit) and
    the task's own ``timeout``; None when neither limits it."""
    limits = [x for x in (host_limit, task_limit) if x is not None and x > 0]
    return min(limits) if limits else None


RELEASED_WHY = {
    "drain": "host shut down before the task finished",
    "removed": "device removed from this host",
}
"""Stop reasons whose unfinished run is handed back (released: no attempt spent)."""


@dataclass
class Stats:
    """What the host did since the last summary line (per-task lines are DEBUG)."""

    claimed: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def ended(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def take(self) -> dict[str, int]:
        out = {"claimed": self.claimed, **self.outcomes}
        self.claimed, self.outcomes = 0, {}
        return out


class Executor:
    """Starts, runs and reports the attempts a host claimed."""

    def __init__(self, state: HostState, host: HostLink, dispatcher: TaskDispatcher) -> None:
        self.state = state
        self.settings = state.settings
        # a report also claims what waits in the inbox for the free devices: started at once
        self.reporter = Reporter(state, host, state.settings.report_linger, self.start_claimed)
        self.stats = Stats()
        # at most one run per device at a time, plus runs of a device whose earlier runner is
        # still stopping (they wait for it first), each in a reused thread
        self.threads = RunnerThreads(keep=2 * len(state.devices) + 2)
        # async runners' runs, all on one event loop (started if used); what they hand off
        # to threads may all wait at once (every device's run, an abandoned runner's device)
        self.loop = RunnerLoop(blocking_workers=4 * len(state.devices) + 32)
        self.host = host
        self.dispatcher = dispatcher
        # the runs' live logs, within the host's budget; each whole log kept a byte past
        # log_file_max on disk (the uploader then cuts log.txt there and records the cut)
        self.logs = LogStreamer(host, budget=self.settings.live_log_budget,
                                whole_max=self.settings.log_file_max + 1)  # fmt: skip
        self.progress = ProgressStreamer(host)  # the runs' progress
        self.artifacts = uploader(state, host)

    def start(self, a: Assignment, sent: float) -> None:
        """Start a claimed assignment: a thread runner's run in a runner thread (`execute`),
        an async runner's on the host's event loop (`execute_async`); or hand it back."""
        run = Run(a, LeaseClock(), sent)
        run.trace = tracing.current().attempt(a, sent)
        run.renewed(sent, a.lease_ms or int(self.state.lease_ttl * 1000))
        f = run.fields()
        if run.lease.expired:
            # claimed before a freeze (SIGSTOP) that outlasted the lease: the task has gone
            # back to the queue or elsewhere; a report would be refused
            self.state.log(logging.WARNING, "claimed lease already ended: not started", **f)
            run.trace.close("lease ended before start")
            return
        if a.device_id not in self.state.devices or a.host_id != self.settings.host_id:
            self.state.log(
                logging.WARNING,
                "assignment for a device this worker does not serve: handing it back",
                **f,
            )
            self.release(run, "device not served by this worker")
            return
        state = self.state.states.get(a.device_id, DeviceState.offline)
        with self.state.lock:  # (taken once: the run is registered here unless refused)
            busy = self.state.abandoned.get(a.device_id)
            refused = self.state.stopping.is_set() or busy or state is not DeviceState.idle
            if not refused:
                run.after = self.state.by_device.get(a.device_id)
                self.state.by_device[a.device_id] = run
                self.state.runs[run.task_id] = run
        if refused:
            why = (
                "host shutting down"
                if self.state.stopping.is_set()
                else busy
                if busy
                else f"device {state.value}"
            )
            self.state.log(logging.INFO, f"{why}: handing the assignment back", **f)
            self.release(run, why)
            return
        self.stats.claimed += 1
        if self.state.debugging():
            self.state.log(logging.DEBUG, "claimed", goal=(a.task.goal or "")[:80] or None,
                           workflow=a.task.workflow, **f)  # fmt: skip
        if self.dispatcher.is_async(a):
            self.loop.spawn(lambda: self.execute_async(run))
        else:
            self.threads.run(lambda: self.execute(run), f"run-{run.task_id}")

    def start_claimed(self, claimed: list[Assignment], sent: float) -> None:
        """Start what a report claimed (`Reporter`), as the main loop starts what it claims."""
        for a in claimed:
            self.start(a, sent)
        self.state.changed.set()  # (the main loop counts its free devices again)

    def execute(self, run: Run) -> None:
        """Run ``run`` through a thread runner, in this (runner) thread, and report it."""
        handed_over = False  # its report went to the reporter, whose thread ends the run
        try:
            if run.after is not None:
                run.after.ended.wait()
            deadline = self.deadline(run)  # (a multi-device task's wait for its parts counts)
            if run.assignment.task.gang and run.reason is None:
                self.gang_wait(run)
            call = self.begin(run, deadline)
            if isinstance(call, DispatchOutcome):
                outcome = call
            else:
                outcome = self.dispatcher.dispatch(run.assignment, run.cancel, **call)
                run.trace.run_ended(outcome.status, outcome.failure_kind)
            handed_over = self.end(run, outcome)
        except Exception:  # noqa: BLE001 - never lose the slot
            self.state.log_exception("run failed", **run.fields())
            with contextlib.suppress(Exception):
                self.release(run, "worker error")
        finally:
            if not handed_over:
                self.close_run(run)

    async def execute_async(self, run: Run) -> None:
        """`execute` for an async runner, on the host's event loop (`RunnerLoop`): no thread
        of its own. What may wait on a socket (a multi-device task's wait for its parts, a
        hand-back's answer, the last flush of a live log or of progress) goes to a pooled
        thread; a run that said nothing and ends done or failed never leaves the loop."""
        handed_over = False
        try:
            if run.after is not None:
                await run.after.ended.wait_async()
            deadline = self.deadline(run)
            if run.assignment.task.gang and run.reason is None:
                await asyncio.to_thread(self.gang_wait, run)
            call = self.begin(run, deadline)
            if isinstance(call, DispatchOutcome):
                outcome = call
            else:
                outcome = await self.dispatcher.dispatch_async(run.assignment, run.cancel, **call)
                run.trace.run_ended(outcome.status, outcome.failure_kind)
            if self.end_waits(run, outcome):
                handed_over = await asyncio.to_thread(self.end, run, outcome)
            else:  # (the runs that end in one pass of the loop wake the reporter once)
                handed_over = self.end(run, outcome, asyncio.get_running_loop().call_soon)
        except Exception:  # noqa: BLE001 - never lose the slot
            self.state.log_exception("run failed", **run.fields())
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.release, run, "worker error")
        finally:
            if not handed_over:
                self.close_run(run)

    def gang_wait(self, run: Run) -> None:
        """A part of a multi-device task: hold the device (a role) or wait for every part
        (the leader)."""
        if not run.assignment.task.leader:  # a role that only holds its device
            self.hold_part(run)
        else:
            self.await_parts(run)

    def deadline(self, run: Run) -> float | None:
        """The ``time.monotonic()`` by which ``run`` must end (its timeout from now), or None."""
        timeout = run_timeout(self.settings.task_timeout, run.assignment.task.timeout)
        return time.monotonic() + timeout if timeout is not None else None

    def begin(self, run: Run, deadline: float | None) -> dict[str, Any] | DispatchOutcome:
        """What the dispatcher gets for ``run`` (its live log, progress and artifacts folder
        opened), or the outcome of a run that does not start (a multi-device task's role,
        stopped or its lease ended before it started)."""
        task = run.assignment.task
        if task.gang and not task.leader:
            return DispatchOutcome("cancelled", None, "the multi-device attempt ended")
        if run.reason is not None or run.lease.expired:  # stopped before it started
            if run.reason is None:
                run.stop("lost")
            return DispatchOutcome("cancelled", None, "stopped before start")
        device = self.state.devices[run.device_id]
        a = run.assignment
        folder = run.artifacts_dir = self.artifacts.prepare(a.task.id, a.attempt)
        tests_file = None
        if a.tests is not None:
            try:
                tests_file = write_tests(folder, a.tests)
            except OSError as exc:  # (a full disk: the runner would miss its tests)
                why = f"cannot write the run's list of tests: {exc}"
                return DispatchOutcome("failed", FailureKind.runner_error, why)
        run.log = self.logs.open(run.task_id, a.lease_id, folder + WHOLE_LOG_SUFFIX,
                                 self.state.log_max_bytes)  # fmt: skip
        run.progress = self.progress.open(run.task_id, a.lease_id)
        run.trace.run_started()
        return {
            "deadline": deadline,
            "driver_type": device.driver_type,
            "serial": device.serial,
            "lease": run.lease,
            "on_abandon": lambda out: self.abandon(run, out),
            "log_sink": run.log.write,
            "artifacts_dir": run.artifacts_dir,
            "progress_sink": self.progress.writer(run.progress),
            "stop_grace": lambda: run.stop_grace,
            "tests_file": tests_file,
        }

    def end(
        self,
        run: Run,
        outcome: DispatchOutcome,
        defer: Callable[[Callable[[], None]], object] | None = None,
    ) -> bool:
        """The runner returned: report the outcome (`finish`); True when the reporter's
        thread now ends the run (the caller must not). ``defer``: see `Reporter.post`."""
        if outcome.handed_off:  # reported when it was abandoned; now it has ended
            self.runner_ended(run)
            return False
        return self.finish(run, outcome, wait=False, defer=defer)

    def end_waits(self, run: Run, out: DispatchOutcome) -> bool:
        """May `end` wait (on a socket, a flush) for ``run``'s outcome: its live log or its
        progress has something to flush, it is handed back (the answer is waited for), or a
        health check may have to be marked."""
        if out.handed_off:
            return False
        log, progress = run.log, run.progress
        if log is not None and (log.sent or log.pieces or log.dropped):
            return True
        if progress is not None and progress.pending is not None:
            return True
        if not out.ok and (
            run.reason in RELEASED_WHY or (out.status == "cancelled" and run.reason is None)
        ):
            return True
        return bool(self.settings.health_check)

    def close_run(self, run: Run) -> None:
        """The run is over (reported, or not to be): its device is free for the next claim."""
        run.trace.close(run.reason)
        self.artifacts.discard(run.artifacts_dir)  # (not queued: released, lost, error)
        run.ended.set()
        with self.state.lock:
            self.state.runs.pop(run.task_id, None)
            if self.state.by_device.get(run.device_id) is run:
                del self.state.by_device[run.device_id]
        self.state.changed.set()

    def hold_part(self, run: Run) -> None:
        """A non-leader role of a multi-device task: keep the device (its lease renewed like
        any run's) until the attempt ends. The leader's report, or the loss of any part, ends
        every part in Redis and tells this host at once; its renewal then finds the lease
        lost and stops the run (nothing is reported). A drain hands the part back, which
        ends the attempt for every role."""
        self.state.log(logging.DEBUG, "holding the device for a multi-device task", **run.fields())
        run.cancel.wait()  # (the renew loop also stops a run whose lease ended unrenewed)

    def await_parts(self, run: Run) -> None:
        """The leader role of a multi-device task runs once every other role's part is
        claimed (``dispatched``); until then it polls their status (bounded by its lease:
        an attempt whose parts never all start ends by expiry, for every part)."""
        t = run.assignment.task
        delay = 0.01
        while not run.cancel.is_set() and not run.lease.expired:
            try:
                if all(st == "dispatched" for st in self.host.part_statuses(t)):
                    return
            except TRANSIENT:
                pass
            run.cancel.wait(delay)
            delay = min(0.1, delay * 1.5)

    def abandon(self, run: Run, outcome: DispatchOutcome) -> None:
        """A runner that did not stop keeps its device: it is reported ``busy`` (before the
        attempt's report frees the reservation, so the device never looks idle meanwhile)
        until the runner really ends (`runner_ended`). The attempt is reported now."""
        with self.state.lock:
            self.state.abandoned[run.device_id] = self._abandoned_why(run)
        self.state.log(
            logging.ERROR, "runner abandoned: device out of service until it ends", **run.fields()
        )
        with contextlib.suppress(*TRANSIENT, DeviceqError):
            self.host.heartbeat(self.state.snapshot())
        try:
            self.finish(run, outcome)
        except Exception:  # noqa: BLE001 - the lease then expires and the task is retried
            self.state.log_exception("report of an abandoned run failed", **run.fields())
        with self.state.lock:  # no longer renewed or waited for at shutdown
            self.state.runs.pop(run.task_id, None)
        self.state.changed.set()

    @staticmethod
    def _abandoned_why(run: Run) -> str:
        return f"runner of task {run.task_id} did not stop; waiting for it to end"

    def runner_ended(self, run: Run) -> None:
        """An abandoned runner returned at last: its device is back in service."""
        with self.state.lock:
            if self.state.abandoned.get(run.device_id) == self._abandoned_why(run):
                del self.state.abandoned[run.device_id]
        self.state.log(
            logging.INFO, "abandoned runner ended: device back in service", **run.fields()
        )
        self.state.beat_now.set()

    def finish(
        self,
        run: Run,
        out: DispatchOutcome,
        wait: bool = True,
        defer: Callable[[Callable[[], None]], object] | None = None,
    ) -> bool:
        """Report the run's outcome (or hand it back, or not report it: its lease is lost).
        ``wait`` False: a report goes to the reporter thread, which ends the run (`close_run`)
        once it is answered; True when that is so (the caller must not end it). ``defer``:
        how the reporter thread is woken for it (see `Reporter.post`)."""
        f = run.fields()
        if run.log is not None:  # the last output, while the lease is still current
            self.logs.close(run.log)
        if run.progress is not None:  # its last progress, likewise
            self.progress.close(run.progress)
        if run.reason == "lost" or (not out.ok and (run.reason == "expired" or run.lease.expired)):
            # a run that failed after its lease ended here was most likely stopped by that
            # (the lease watchdog): the task comes back through expiry. A success is still
            # reported: the script accepts it only if the lease is still current there.
            self.state.log(
                logging.INFO,
                "runner stopped after losing the lease; not reported",
                status=out.status,
                **f,
            )
            return False
        if run.reason in RELEASED_WHY and not out.ok:
            self.release(run, RELEASED_WHY[run.reason])
            return False
        if run.reason == "preempt" and not out.ok:  # queued again, the attempt not spent
            report = Report(
                run.task_id, run.assignment.lease_id, "preempted", None, out.payload or "preempted"
            )
        elif run.reason == "cancel" and not out.ok:
            report = Report(
                run.task_id, run.assignment.lease_id, "cancelled", None, out.payload or "cancelled"
            )
        elif out.ok:
            report = Report(run.task_id, run.assignment.lease_id, "done", None, out.payload)
        elif out.status == "cancelled":  # cancelled without a request: hand it back
            self.release(run, out.payload or "stopped")
            return False
        else:
            report = Report(
                run.task_id, run.assignment.lease_id, "failed", out.failure_kind, out.payload
            )
        if wait:
            self.report(run, report)
            return False
        self._ending(run, report)

        def then(p: Pending) -> None:
            try:
                self.answered(run, report, p)
            finally:
                self.close_run(run)

        self.reporter.post(report, f, then, defer)
        return True

    def report(self, run: Run, report: Report) -> str | None:
        """Report through the `Reporter` (coalesced with the reports of runs that end at the
        same time), wait for the answer and log it; None when it was not delivered."""
        self._ending(run, report)
        return self.answered(run, report, self.reporter.send(report, run.fields()))

    def _ending(self, run: Run, report: Report) -> None:
        run.trace.report_started(report.outcome, report.failure_kind)
        if report.outcome != "released":
            kind = report.failure_kind
            self.state.task_ending(run.device_id, report.outcome, str(kind) if kind else None)

    def answered(self, run: Run, report: Report, p: Pending) -> str | None:
        """What follows a report's answer: log it, count it, queue the attempt's artifacts;
        the answer (None when the report was not delivered)."""
        f = run.fields()
        run.trace.report_ended(p.answer, None if p.error is None else str(p.error))
        if p.error is not None:
            self.state.log(logging.ERROR, f"report refused: {p.error}", **f)
            return None
        if p.answer is None:
            self.state.log(
                logging.ERROR,
                "report not delivered before shutdown; the lease will "
                "expire and the task be retried",
                outcome=report.outcome,
                **f,
            )
            return None
        answer = p.answer
        rejected = parse(answer).code is ReplyCode.rejected
        self.stats.ended(report.outcome if not rejected else "rejected")
        if not rejected and report.outcome != "released":
            kind = report.failure_kind
            self.state.task_ended(run.device_id, report.outcome, str(kind) if kind else None)
            if run.artifacts_dir is not None:  # uploaded in the background
                folder, run.artifacts_dir = run.artifacts_dir, None
                if run.assignment.tests is not None:  # (the list of tests is no artifact)
                    with contextlib.suppress(OSError):
                        os.unlink(folder + TESTS_SUFFIX)
                wrote = run.log is None or run.log.wrote
                self.artifacts.attempt_ended(run.task_id, run.assignment.attempt, folder,
                                             report.payload, wrote)  # fmt: skip
        if rejected or self.state.debugging():
            self.state.log(logging.WARNING if rejected else logging.DEBUG,
                           f"reported {report.outcome}", answer=answer,
                           failure_kind=report.failure_kind, **f)  # fmt: skip
        return answer

    def release(self, run: Run, why: str) -> None:
        self.report(run, Report(run.task_id, run.assignment.lease_id, "released", None, why))
