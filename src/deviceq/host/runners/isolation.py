"""Process isolation: a Python runner run in a child process per task (forkserver), under a
lease watchdog thread of its own, so that the host daemon's threads keep running whatever the
runner does with the GIL, and a runner that ignores its cancel signal can still be killed;
and the choice of where a host's runners run (`build_goal_runner`, `build_workflow_runner`)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import multiprocessing
import os
import signal
import threading
import time
import traceback
from typing import Any, cast

from ...core.errors import ConfigError
from ...core.models import WorkflowDefinition
from .aio import LoopEvent, is_async_runner
from .base import (
    GoalRunner,
    Outcome,
    Task,
    TaskLogger,
    WorkflowRunner,
    as_outcome,
    tail,
    task_logger,
)
from .command import kill_group
from .registry import RunnerSpec, is_builtin, load_runner
from .steps import workflow_pair

_MP_LOCK = threading.Lock()
_MP_CTX: Any = None


def _mp_context() -> Any:
    """A forkserver context (safe in a threaded parent; cheap forks of a preloaded server)."""
    global _MP_CTX
    with _MP_LOCK:
        if _MP_CTX is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(["deviceq.host.runners", "deviceq.core.models"])
            _MP_CTX = ctx
        return _MP_CTX


def _child_main(
    result_w: Any, cancel_r: Any, kind: str, spec: RunnerSpec, goal_spec: RunnerSpec | None,
    task_data: dict[str, Any], workflow_json: str | None, log_format: str,
) -> None:  # fmt: skip
    """Body of an isolated runner process: its own process group, cancel via a pipe."""
    with contextlib.suppress(OSError):
        os.setsid()
    from ...core import logs

    logs.configure(log_format)
    cancel = LoopEvent()
    left = task_data.pop("lease_left", None)
    log_context = dict(task_data.pop("log_context", None) or {})  # the parent's task fields
    deadline = [None if left is None else time.monotonic() + float(left)]

    def die(why: str) -> None:
        logging.getLogger("deviceq.runner").error(
            f"{why}: run killed", extra={"fields": log_context}
        )
        logging.shutdown()
        os.killpg(os.getpid(), signal.SIGKILL)

    def watch() -> None:
        # the parent's messages: "cancel" (stop cooperatively), ("lease", seconds) (renewed);
        # the pipe closing means the host daemon is gone; a lease ending unrenewed means it is
        # frozen or cut off: either way this run must not go on
        while True:
            d = deadline[0]
            wait = None if d is None else max(0.0, d - time.monotonic())
            try:
                ready = cancel_r.poll(wait)
            except (EOFError, OSError):
                ready = True
            if not ready:
                if deadline[0] is not None and time.monotonic() >= deadline[0]:
                    die("lease ended without a renewal (host daemon frozen or cut off)")
                continue
            try:
                msg = cancel_r.recv()
            except (EOFError, OSError):
                die("the host daemon is gone")
                return
            if isinstance(msg, tuple) and msg and msg[0] == "lease":
                deadline[0] = time.monotonic() + float(msg[1])
            else:
                cancel.set()

    threading.Thread(target=watch, daemon=True).start()
    task = Task.from_portable(task_data, cancel)
    if log_context:
        task.logger = task_logger(task, None, log_context)
    send_lock = threading.Lock()

    def to_parent(stream: str, text: str) -> None:  # the live log, through the parent
        with send_lock, contextlib.suppress(OSError, ValueError):
            result_w.send(("log", stream, text[:LOG_MESSAGE_CHARS]))

    task.log_sink = to_parent

    def progress_to_parent(fraction: float, text: str) -> None:  # checked here, sent on
        with send_lock, contextlib.suppress(OSError, ValueError):
            result_w.send(("progress", fraction, text))

    task.progress_sink = progress_to_parent
    if isinstance(task.logger, TaskLogger):
        task.logger.sink = to_parent
    try:
        if kind == "workflow":
            assert goal_spec is not None and workflow_json is not None
            wf_runner, goal_runner = workflow_pair(
                load_runner(spec, "workflow"), load_runner(goal_spec, "goal")
            )
            wf = WorkflowDefinition.model_validate_json(workflow_json)
            out = as_outcome(_awaited(wf_runner(wf, task, goal_runner)))
        else:
            out = as_outcome(_awaited(load_runner(spec, "goal")(task)))
        with send_lock:
            result_w.send(("ok", out.ok, out.text, out.infra))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
        with send_lock:
            result_w.send(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
    finally:
        result_w.close()
        if os.getpgrp() == os.getpid():  # leftovers of the runner die with it
            logging.shutdown()
            os.killpg(os.getpid(), signal.SIGKILL)


def _awaited(value: Any) -> Any:
    """What a runner returned, or, for an async runner's coroutine, what it returned when run
    to its end on an event loop of this child's own."""
    if inspect.isawaitable(value):

        async def wait() -> Any:
            return await value

        return asyncio.run(wait())
    return value


LOG_MESSAGE_CHARS = 65536  # of one live log message from an isolated runner
_DRAIN = 100  # live log messages taken at once, at most (the loop still sees a cancel)


def _receive(conn: Any, task: Task, timeout: float) -> tuple[bool, Any]:
    """(True, answer) once the child's answer arrived (None: the pipe broke); the live log
    messages before it go to the task's live log. (False, None): no answer yet."""
    for _ in range(_DRAIN):
        if not conn.poll(timeout):
            return False, None
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return True, None
        if isinstance(msg, tuple) and len(msg) == 3 and msg[0] == "progress":
            with contextlib.suppress(ValueError, TypeError):
                task.progress(msg[1], str(msg[2]))
            timeout = 0.0
            continue
        if not (isinstance(msg, tuple) and len(msg) == 3 and msg[0] == "log"):
            return True, msg
        task.output(str(msg[1]), str(msg[2]))
        timeout = 0.0
    return False, None


class RunnerCrashed(RuntimeError):
    """An isolated runner's process died without an answer, or raised."""


class IsolatedRunner:
    """Runs a Python runner in a child process per call (forkserver): the worker's threads keep
    running whatever the runner does with the GIL. On cancel the child's cancel signal is set;
    if it has not finished ``kill_grace`` seconds later (the task's ``stop_grace`` when set: a
    preempted run's class's grace) its process group is killed."""

    def __init__(
        self,
        spec: RunnerSpec,
        kind: str = "goal",
        goal_spec: RunnerSpec | None = None,
        *,
        kill_grace: float = 5.0,
        log_format: str = "text",
    ) -> None:
        self.spec, self.kind, self.goal_spec = spec, kind, goal_spec
        self.kill_grace = kill_grace
        self.log_format = log_format

    def __call__(self, *args: Any) -> Outcome:
        if self.kind == "workflow":
            workflow, task = args[0], args[1]
            wf_json: str | None = workflow.model_dump_json()
        else:
            task, wf_json = args[0], None
        lease = task.lease
        left = lease.remaining() if lease is not None else None
        if left is not None and left <= 0:
            return Outcome.failure("lease already ended: not started")
        ctx = _mp_context()
        result_r, result_w = ctx.Pipe(duplex=False)
        cancel_r, cancel_w = ctx.Pipe(duplex=False)
        from ...core import logs

        data = {**task.portable(), "lease_left": left,
                "log_context": dict(task.logger.extra or {})}  # fmt: skip
        proc = ctx.Process(
            target=_child_main,
            args=(result_w, cancel_r, self.kind, self.spec, self.goal_spec, data,
                  wf_json, logs._FORMAT.get("value", self.log_format)),
            name=f"runner-{task.task_id}", daemon=False,
        )  # fmt: skip
        proc.start()
        result_w.close()
        cancel_r.close()
        task.logger.debug("isolated runner started", fields={"pid": proc.pid})
        answer: Any = None
        killed = False
        grace = self.kill_grace
        sent = lease.version if lease is not None else 0
        try:
            cancel_sent_at: float | None = None
            while True:
                if lease is not None and lease.version != sent:
                    sent = lease.version
                    remaining = lease.remaining()
                    if remaining is not None:
                        with contextlib.suppress(OSError):
                            cancel_w.send(("lease", max(0.0, remaining)))
                got, answer = _receive(result_r, task, 0.05)
                if got:
                    break
                if not proc.is_alive():
                    for _ in range(1000):  # what it sent before it ended, then its answer
                        got, answer = _receive(result_r, task, 0.05)
                        if got or not result_r.poll(0):
                            break
                    break
                if task.cancel.is_set() and cancel_sent_at is None:
                    cancel_sent_at = time.monotonic()
                    # (a preempted run gets its class's grace, set before its stop signal)
                    if task.stop_grace is not None:
                        grace = task.stop_grace
                    with contextlib.suppress(OSError):
                        cancel_w.send("cancel")
                waited = 0.0 if cancel_sent_at is None else time.monotonic() - cancel_sent_at
                if waited > grace:
                    task.logger.warning("runner ignored cancel; killing its process group")
                    killed = True
                    break
        finally:
            pid = proc.pid
            if pid is not None:
                if killed:
                    kill_group(pid)  # it is alive (it ignored the cancel): the group is its own
                proc.join(1.0 if not killed else 5.0)
                if proc.is_alive():
                    kill_group(pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    proc.join(5.0)
            for conn in (result_r, cancel_w):
                conn.close()
        if killed:
            return Outcome.failure(
                f"runner did not stop {grace:g} s after cancel; process group killed"
            )
        if answer is None:
            raise RunnerCrashed(f"runner process exited with code {proc.exitcode} and no answer")
        # (a child that answered ends itself and its group with SIGKILL: exit code -9 is fine)
        if answer[0] == "error":  # its traceback (the host's paths) stays in the host's log
            task.logger.error(f"isolated runner raised {answer[1]}\n{tail(answer[2], 4096)}")
            raise RunnerCrashed(answer[1])
        return Outcome(
            bool(answer[1]), str(answer[2]), bool(answer[3]) if len(answer) > 3 else False
        )


def build_goal_runner(
    spec: RunnerSpec, isolation: str = "auto", *, kill_grace: float = 5.0
) -> GoalRunner:
    """The goal runner for ``spec``: in this process (built-ins, ``async def`` runners, or
    ``isolation="thread"``) or in a child process per task (``"process"``; ``"auto"`` isolates
    every other one). An async runner kept here runs on the host's event loop: it waits by
    awaiting, and a process per task would cost what it saves."""
    _check_isolation(isolation)
    runner = load_runner(spec, "goal")  # (fails fast on a bad spec, in the parent)
    if isolation == "thread" or (
        isolation == "auto" and (is_builtin(spec) or is_async_runner(runner))
    ):
        return runner
    return cast(GoalRunner, IsolatedRunner(spec, "goal", kill_grace=kill_grace))


def build_workflow_runner(
    spec: RunnerSpec,
    goal_spec: RunnerSpec,
    isolation: str = "auto",
    *,
    kill_grace: float = 5.0,
) -> WorkflowRunner:
    """The workflow runner for ``spec`` (see `build_goal_runner`). An isolated workflow runner
    runs its steps' goal runner (``goal_spec``) inside the same child process."""
    _check_isolation(isolation)
    runner = load_runner(spec, "workflow")
    if isolation == "thread" or (
        isolation == "auto" and (is_builtin(spec) or is_async_runner(runner))
    ):
        return runner
    return cast(WorkflowRunner, IsolatedRunner(spec, "workflow", goal_spec, kill_grace=kill_grace))


def _check_isolation(isolation: str) -> None:
    if isolation not in ("auto", "process", "thread"):
        raise ConfigError(f"isolation must be auto, process or thread, not {isolation!r}")
