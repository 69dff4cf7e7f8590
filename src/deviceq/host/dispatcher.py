"""`TaskDispatcher`: runs one claimed assignment on the local device through the configured
runners and maps what happened to a task outcome. It composes the runners; it never plans,
executes or retries anything itself (retries are the queue's job: lease expiry and attempts).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from ..core.errors import NotFound
from ..core.models import Assignment, WorkflowDefinition
from ..core.vocabulary import FailureKind
from .runner_threads import RunnerThreads
from .runners import (
    GoalRunner,
    LeaseClock,
    LogWriter,
    LoopEvent,
    Outcome,
    Task,
    TaskLogger,
    WorkflowRunner,
    as_outcome,
    describe_exception,
    is_async_runner,
    tail,
    task_logger,
    workflow_pair,
)

_LOG = logging.getLogger("deviceq.dispatcher")
WorkflowLoader = Callable[[str], WorkflowDefinition]


@dataclass(frozen=True)
class DispatchOutcome:
    """How an attempt ended: ``status`` is ``done``, ``failed`` or ``cancelled``;
    ``failure_kind`` is set unless done; ``payload`` is the result (done) or the error.
    ``abandoned`` means the runner did not stop when told to and was left behind: it may still
    be using the device until ``runner_done`` is set."""

    status: str
    failure_kind: FailureKind | None = None
    payload: str = ""
    abandoned: bool = False
    runner_done: threading.Event | None = None  # set when an abandoned runner really ended
    handed_off: bool = False  # inline run: this outcome already went to ``on_abandon``

    @property
    def ok(self) -> bool:
        return self.status == "done"


POLL_EVERY = 0.1  # how often a run whose cancel event cannot call back (a plain
# threading.Event, not a LoopEvent) is looked at for a cancel request


@dataclass(eq=False, slots=True)
class _Watched:
    """One run under watch. ``finished`` and ``gave_up`` change under the watchdog's lock;
    the events exist only where something waits on them."""

    task: Task
    cancel_event: threading.Event
    deadline: float | None
    on_abandon: Callable[[DispatchOutcome], None] | None
    grace_of: Callable[[], float | None] | None = None  # the run's stop grace, when told
    cause: str | None = None  # why the runner was told to stop: cancelled | timeout
    told_at: float = 0.0
    finished: bool = False  # the runner returned
    gave_up: bool = False  # abandoned: the runner did not stop within the grace
    over: threading.Event | None = None  # (a run not inline) finished or gave_up
    runner_done: threading.Event | None = None  # (once given up on) set when the runner returns
    polled: bool = False  # its cancel event cannot call back: looked at every POLL_EVERY
    unhook: Callable[[], None] | None = None  # takes back the cancel event's call-back


class _Watchdog:
    """One thread watching every run of a dispatcher (instead of a supervising thread per
    run): it tells a runner to stop when its cancel event is set or its deadline passes, and
    gives up on it ``grace`` seconds later. It waits on a condition, woken when a run is
    added or told to stop (a `LoopEvent` cancel event calls back when set), and otherwise
    sleeps until the next deadline or give-up; a plain ``threading.Event`` is looked at
    every `POLL_EVERY`. A run added with nothing due before the thread's next look (no
    deadline, or a later one; most runs) does not wake it: no hand-off between threads."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self._items: set[_Watched] = set()
        self._cv = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        # (lock held) the time.monotonic() of the thread's next look at the runs: inf while
        # it waits for a wake-up only, -inf while it is not waiting (it looks again anyway)
        self._next_look = -math.inf

    def watch(self, w: _Watched) -> None:
        if isinstance(w.cancel_event, LoopEvent):
            w.unhook = w.cancel_event.on_set(self._wake)  # (outside the lock: may call at once)
            due = math.inf if w.deadline is None else w.deadline
        else:
            w.polled = True
            due = time.monotonic() + POLL_EVERY
        with self._cv:
            self._items.add(w)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="watchdog", daemon=True)
                self._thread.start()
            elif due < self._next_look:
                self._cv.notify()

    def _wake(self) -> None:
        """A watched run's cancel event was set: look at the runs now."""
        with self._cv:
            self._cv.notify()

    def finish(self, w: _Watched) -> bool:
        """The runner of ``w`` returned. True if it had been given up on already."""
        if w.unhook is not None:
            w.unhook()
        with self._cv:
            w.finished = True
            self._items.discard(w)
            if w.runner_done is not None:
                w.runner_done.set()
            if w.over is not None:
                w.over.set()
            return w.gave_up

    def _due(self, now: float) -> tuple[list[_Watched], list[_Watched], float | None]:
        """(Lock held.) The runs to tell to stop now, those to give up on now, and how long
        until something else may be due (None: nothing until a wake-up)."""
        tell, give_up = [], []
        wait: float | None = None
        for w in self._items:
            if w.cause is None:
                if w.cancel_event.is_set() or (w.deadline is not None and now >= w.deadline):
                    tell.append(w)
                    continue
                at = w.deadline - now if w.deadline is not None else None
                if w.polled:
                    at = POLL_EVERY if at is None else min(at, POLL_EVERY)
            else:
                at = w.told_at + self.grace + (w.task.stop_grace or 0.0) - now
                if at < 0:
                    give_up.append(w)
                    continue
            if at is not None:
                wait = at if wait is None else min(wait, at)
        return tell, give_up, wait

    def _loop(self) -> None:
        while True:
            with self._cv:
                while True:
                    now = time.monotonic()
                    tell, give_up, wait = self._due(now)
                    if tell or give_up:
                        break
                    wait = None if wait is None else max(0.001, wait)
                    self._next_look = math.inf if wait is None else now + wait
                    self._cv.wait(wait)
                    self._next_look = -math.inf
            for w in tell:
                self._tell(w, now)
            for w in give_up:
                self._give_up(w)

    def _tell(self, w: _Watched, now: float) -> None:
        """Tell the runner of ``w`` to stop (its cancel event, or its deadline, came)."""
        if w.finished:
            return
        w.cause = "cancelled" if w.cancel_event.is_set() else "timeout"
        w.told_at = now
        if w.grace_of is not None and w.cause == "cancelled":
            w.task.stop_grace = w.grace_of()
        w.task.cancel.set()
        w.task.logger.info(f"stopping runner ({w.cause})")

    def _give_up(self, w: _Watched) -> None:
        """The runner of ``w`` did not stop within the grace: abandon it."""
        with self._cv:
            if w.finished:
                return
            w.gave_up = True
            w.runner_done = threading.Event()
            self._items.discard(w)
            if w.over is not None:
                w.over.set()
        w.task.logger.error(f"runner did not stop {self.grace:.1f}s after {w.cause}; abandoned")
        if w.on_abandon is not None:  # in a thread of its own: it reports (may ride out Redis)
            out = TaskDispatcher._stopped(
                w.cause or "cancelled", "runner did not stop; abandoned", abandoned=True,
                done=w.runner_done,
            )  # fmt: skip
            threading.Thread(target=w.on_abandon, args=(out,), name="abandon", daemon=True).start()


class TaskDispatcher:
    """Run assignments through a goal runner (goal tasks) or a workflow runner (workflow tasks,
    whose `WorkflowDefinition` ``workflow_loader`` loads, e.g. ``Client.get_workflow``).

    Outcome mapping: the runner's success -> ``done``; its reported failure -> ``failed`` /
    ``runner_failed`` (``infrastructure`` when the runner marks it as the device's, see
    ``Outcome.infrastructure``); an exception -> ``failed`` / ``runner_error`` (the error says
    its type and message; its traceback goes to the host's log); past the deadline ->
    ``failed`` / ``timeout``; stopped because ``cancel_event`` was set -> ``cancelled``; a
    workflow that no longer exists -> ``failed`` / ``rejected`` (not the device's fault).
    A runner still running ``stop_grace`` seconds after it was told to stop is abandoned.

    A runner runs in a thread of its own (`dispatch` returns even if it never stops), or, with
    ``on_abandon``, in the calling thread (no hand-off between threads per run): an abandoned
    run's outcome then goes to ``on_abandon`` (from another thread) when it is given up on,
    and `dispatch` returns only when the runner does, with ``handed_off`` set. An ``async
    def`` runner's assignment (`is_async`) is awaited with `dispatch_async` on the caller's
    event loop, watched and mapped alike; a workflow runner is given a goal runner of its own
    kind (`deviceq.host.runners.workflow_pair`)."""

    def __init__(
        self,
        goal_runner: GoalRunner,
        workflow_runner: WorkflowRunner | None = None,
        workflow_loader: WorkflowLoader | None = None,
        *,
        stop_grace: float = 10.0,
        logger: logging.Logger | None = None,
        log_fields: Mapping[str, Any] | None = None,
    ) -> None:
        self.goal_runner = goal_runner
        self.goal_async = is_async_runner(goal_runner)
        # a workflow runner gets a goal runner of its own kind (steps: awaited or called)
        self.workflow_runner: WorkflowRunner | None = None
        self.workflow_goal_runner: GoalRunner = goal_runner
        if workflow_runner is not None:
            self.workflow_runner, self.workflow_goal_runner = workflow_pair(
                workflow_runner, goal_runner
            )
        self.workflow_async = is_async_runner(self.workflow_runner)
        self._jobs: set[asyncio.Future[Any]] = set()  # async runs given up on, still going
        self.workflow_loader = workflow_loader
        self.stop_grace = stop_grace
        self.log = logger or _LOG
        self.log_fields = dict(log_fields or {})  # on every task's log lines (e.g. the pool)
        self.threads = RunnerThreads()  # a thread per run, reused (see runner_threads.py)
        self.watchdog = _Watchdog(stop_grace)

    def make_task(
        self,
        assignment: Assignment,
        cancel: threading.Event,
        deadline: float | None,
        lease: LeaseClock | None = None,
    ) -> Task:
        """The `Task` a runner gets for ``assignment``."""
        t = assignment.task
        task = Task(
            goal=t.goal or "",
            task_id=t.id,
            device_id=assignment.device_id,
            driver_type=t.driver_type or "",
            tags=tuple(t.tags),
            attempt=assignment.attempt,
            deadline=deadline,
            cancel=cancel,
            lease_id=assignment.lease_id,
            host_id=assignment.host_id,
            workflow=t.workflow,
            lease=lease,
            gang=t.gang,
            role=t.role,
            roles={
                name: {"device_id": r.device_id or "", "host_id": r.host_id or ""}
                for name, r in (t.roles or {}).items()
            },
        )
        task.logger = task_logger(task, self.log, self.log_fields)
        return task

    def dispatch(
        self,
        assignment: Assignment,
        cancel_event: threading.Event | None = None,
        deadline: float | None = None,
        *,
        driver_type: str | None = None,
        serial: str = "",
        lease: LeaseClock | None = None,
        on_abandon: Callable[[DispatchOutcome], None] | None = None,
        log_sink: LogWriter | None = None,
        artifacts_dir: str | Path | None = None,
        progress_sink: Callable[[float, str], None] | None = None,
        stop_grace: Callable[[], float | None] | None = None,
        tests_file: Path | None = None,
    ) -> DispatchOutcome:
        """Run ``assignment`` to its end and return the outcome. ``cancel_event`` asks the
        runner to stop (the outcome is then ``cancelled`` unless the runner still succeeded);
        ``deadline`` is a ``time.monotonic()`` value after which the runner is stopped and
        the attempt fails with ``timeout``. ``driver_type`` is the device's (the task's
        constraint may be empty), ``serial`` its real serial if it has one; ``lease`` is the
        run's `LeaseClock` (runners outside this process kill the run when it ends
        unrenewed); ``log_sink`` gets the run's output while it runs (``Task.log``, its
        logger's INFO lines, a command's stdout and stderr: the live log); ``progress_sink``
        gets what it says of its progress (``Task.progress``, checked); ``stop_grace``, asked
        when the run is told to stop, how long the runner gives it after its stop signal
        (None: the runner's own; a preempted run gets its class's grace); ``tests_file``, the
        file holding the task's list of tests (``task.tests_file``, ``$DEVICEQ_TESTS_FILE``).
        An async runner's assignment (`is_async`) goes to `dispatch_async` instead."""
        cancel_event = cancel_event or LoopEvent()
        task = self._task(assignment, deadline, lease, driver_type, serial, log_sink,
                          artifacts_dir, progress_sink)  # fmt: skip
        task.tests_file = tests_file
        definition = None
        if assignment.task.kind == "workflow":
            loaded = self._workflow(assignment, cancel_event, deadline)
            if isinstance(loaded, DispatchOutcome):
                return loaded
            definition = loaded
        return self._supervise(task, self._call(task, definition), cancel_event, deadline,
                               on_abandon, stop_grace)  # fmt: skip

    async def dispatch_async(
        self,
        assignment: Assignment,
        cancel_event: threading.Event | None = None,
        deadline: float | None = None,
        *,
        driver_type: str | None = None,
        serial: str = "",
        lease: LeaseClock | None = None,
        on_abandon: Callable[[DispatchOutcome], None] | None = None,
        log_sink: LogWriter | None = None,
        artifacts_dir: str | Path | None = None,
        progress_sink: Callable[[float, str], None] | None = None,
        stop_grace: Callable[[], float | None] | None = None,
        tests_file: Path | None = None,
    ) -> DispatchOutcome:
        """`dispatch` for an assignment whose runner is ``async def`` (`is_async`), awaited on
        the running event loop: no thread of its own. The same watchdog tells it to stop
        (its ``task.cancel``, which ``await task.wait_cancel()`` sees at once) and gives up on
        it ``stop_grace`` seconds later; the outcomes are mapped alike. Without
        ``on_abandon`` it returns once given up on, leaving the runner to its end on the
        loop; with it, when the runner returns (``handed_off`` if it was given up on)."""
        cancel_event = cancel_event or LoopEvent()
        task = self._task(assignment, deadline, lease, driver_type, serial, log_sink,
                          artifacts_dir, progress_sink)  # fmt: skip
        task.tests_file = tests_file
        definition = None
        if assignment.task.kind == "workflow":  # (a Redis read: kept off the loop)
            loaded = await asyncio.to_thread(self._workflow, assignment, cancel_event, deadline)
            if isinstance(loaded, DispatchOutcome):
                return loaded
            definition = loaded
        return await self._supervise_async(
            task, self._call(task, definition), cancel_event, deadline, on_abandon, stop_grace
        )

    def is_async(self, assignment: Assignment) -> bool:
        """Does ``assignment`` run through an async runner (`dispatch_async`)?"""
        if assignment.task.kind == "workflow":
            return self.workflow_async
        return self.goal_async

    def _task(
        self,
        assignment: Assignment,
        deadline: float | None,
        lease: LeaseClock | None,
        driver_type: str | None,
        serial: str,
        log_sink: LogWriter | None,
        artifacts_dir: str | Path | None,
        progress_sink: Callable[[float, str], None] | None,
    ) -> Task:
        """The runner's `Task`, its stop signal fresh (set on cancel or at the deadline)."""
        task = self.make_task(assignment, LoopEvent(), deadline, lease)
        if log_sink is not None:
            task.log_sink = log_sink
            if isinstance(task.logger, TaskLogger):
                task.logger.sink = log_sink
        task.progress_sink = progress_sink
        if driver_type:
            task.driver_type = driver_type
        task.serial = serial  # the device's real serial (discovered devices), else ""
        task.artifacts_path = artifacts_dir  # made on first use (deviceq.host.artifacts)
        return task

    def _workflow(
        self, assignment: Assignment, cancel_event: threading.Event, deadline: float | None
    ) -> WorkflowDefinition | DispatchOutcome:
        """A workflow task's definition, or the outcome that ends it (no workflow runner, no
        such workflow, unreadable)."""
        if self.workflow_runner is None or self.workflow_loader is None:
            why = "this host runs no workflow tasks"
            return DispatchOutcome("failed", FailureKind.rejected, why)
        try:
            return self._load(assignment.task.workflow or "", cancel_event, deadline)
        except NotFound as exc:
            return DispatchOutcome("failed", FailureKind.rejected, str(exc))
        except Exception as exc:  # noqa: BLE001
            self.log.warning("cannot load workflow", exc_info=True)
            return DispatchOutcome(
                "failed",
                FailureKind.runner_error,
                f"cannot load workflow: {describe_exception(exc)}",
            )

    def _call(self, task: Task, definition: WorkflowDefinition | None) -> Callable[[], Any]:
        """The runner's call for ``task`` (a workflow's runner when ``definition`` is given)."""
        if definition is not None:
            wf_runner, goal_runner = self.workflow_runner, self.workflow_goal_runner
            assert wf_runner is not None

            def run() -> Any:
                return wf_runner(definition, task, goal_runner)

            return run
        goal = self.goal_runner

        def run_goal() -> Any:
            return goal(task)

        return run_goal

    def _load(
        self, name: str, cancel_event: threading.Event, deadline: float | None
    ) -> WorkflowDefinition:
        """Load a workflow, riding out a briefly unreachable Redis."""
        assert self.workflow_loader is not None
        delay = 0.1
        while True:
            try:
                return self.workflow_loader(name)
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                late = deadline is not None and time.monotonic() + delay > deadline
                if cancel_event.wait(delay) or late:
                    raise
                delay = min(2.0, delay * 2)

    def _supervise(
        self,
        task: Task,
        run: Callable[[], Any],
        cancel_event: threading.Event,
        deadline: float | None,
        on_abandon: Callable[[DispatchOutcome], None] | None = None,
        stop_grace: Callable[[], float | None] | None = None,
    ) -> DispatchOutcome:
        box: dict[str, Any] = {}
        w = _Watched(task, cancel_event, deadline, on_abandon, stop_grace)

        def target() -> bool:
            try:
                box["out"] = as_outcome(run())
            except BaseException as exc:  # noqa: BLE001 - any runner exception is runner_error
                box["exc"] = exc
                box["tb"] = traceback.format_exc()
            return self.watchdog.finish(w)

        started = time.monotonic()
        debug = self._started(task)
        self.watchdog.watch(w)
        if on_abandon is not None:
            if target():  # given up on meanwhile: its outcome went to on_abandon
                return self._handed_off(w)
        else:
            w.over = threading.Event()
            self.threads.run(lambda: None if target() else None, f"runner-{task.task_id}")
            w.over.wait()
            if not w.finished:
                assert w.cause is not None
                return self._stopped(
                    w.cause, "runner did not stop; abandoned", abandoned=True, done=w.runner_done
                )
        return self._mapped(task, w, box, cancel_event, deadline, started, debug)

    async def _supervise_async(
        self,
        task: Task,
        run: Callable[[], Any],
        cancel_event: threading.Event,
        deadline: float | None,
        on_abandon: Callable[[DispatchOutcome], None] | None = None,
        stop_grace: Callable[[], float | None] | None = None,
    ) -> DispatchOutcome:
        box: dict[str, Any] = {}
        w = _Watched(task, cancel_event, deadline, on_abandon, stop_grace)

        async def target() -> bool:
            try:
                box["out"] = as_outcome(await run())
            except asyncio.CancelledError:  # the loop itself is going: not the runner's doing
                self.watchdog.finish(w)
                raise
            except BaseException as exc:  # noqa: BLE001 - any runner exception is runner_error
                box["exc"] = exc
                box["tb"] = traceback.format_exc()
            return self.watchdog.finish(w)

        started = time.monotonic()
        debug = self._started(task)
        self.watchdog.watch(w)
        if on_abandon is not None:
            if await target():
                return self._handed_off(w)
        else:
            over = w.over = LoopEvent()
            job = asyncio.ensure_future(target())
            self._jobs.add(job)  # (kept referenced until it ends, however long that is)
            job.add_done_callback(self._jobs.discard)
            await over.wait_async()
            if not w.finished:
                assert w.cause is not None
                return self._stopped(
                    w.cause, "runner did not stop; abandoned", abandoned=True, done=w.runner_done
                )
        return self._mapped(task, w, box, cancel_event, deadline, started, debug)

    def _started(self, task: Task) -> bool:
        """Log the run's start (DEBUG); whether DEBUG lines are on."""
        debug = self.log.isEnabledFor(logging.DEBUG)  # (the two lines per run are DEBUG)
        if debug:
            task.logger.debug("runner started", fields={"goal": task.goal[:80] or None})
        return debug

    @staticmethod
    def _handed_off(w: _Watched) -> DispatchOutcome:
        """A run given up on (its outcome went to ``on_abandon``) whose runner now returned."""
        return DispatchOutcome(
            "cancelled", FailureKind.cancelled, "abandoned runner ended", True, w.runner_done,
            handed_off=True,
        )  # fmt: skip

    def _mapped(
        self,
        task: Task,
        w: _Watched,
        box: dict[str, Any],
        cancel_event: threading.Event,
        deadline: float | None,
        started: float,
        debug: bool,
    ) -> DispatchOutcome:
        """What the runner's return (or exception) means for the attempt."""
        cause = w.cause
        if "exc" in box:  # the traceback goes to the host's log, never into the task
            exc = box["exc"]
            task.logger.warning(f"runner raised {type(exc).__name__}: {exc}\n{box.get('tb', '')}")
            return DispatchOutcome("failed", FailureKind.runner_error, describe_exception(exc))
        out: Outcome = box["out"]
        if debug:
            seconds = round(time.monotonic() - started, 3)
            task.logger.debug("runner finished", fields={"ok": out.ok, "seconds": seconds})
        if out.ok:
            return DispatchOutcome("done", None, out.text)
        if cause is None and cancel_event.is_set():
            cause = "cancelled"
        if cause is None and deadline is not None and time.monotonic() >= deadline:
            cause = "timeout"
        if cause is not None:
            return self._stopped(cause, out.text)
        kind = FailureKind.infrastructure if out.infra else FailureKind.runner_failed
        return DispatchOutcome("failed", kind, out.text)

    @staticmethod
    def _stopped(
        cause: str, text: str, abandoned: bool = False, done: threading.Event | None = None
    ) -> DispatchOutcome:
        if cause == "timeout":
            return DispatchOutcome(
                "failed", FailureKind.timeout, tail(f"deadline passed; {text}"), abandoned, done
            )
        return DispatchOutcome("cancelled", FailureKind.cancelled, text, abandoned, done)
