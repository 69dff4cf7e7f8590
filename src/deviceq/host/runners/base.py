"""The runner interface: the `Task` a runner gets (goal, device, attempt, deadline, a
cancellation signal, its lease clock, a logger) and the `Outcome` it returns."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ...core.bounds import MAX_PAYLOAD_BYTES
from ...core.models import WorkflowDefinition
from ..progress import check_fraction, clean_text
from .aio import LoopEvent

TAIL_BYTES = 8192
"""Bytes of a run's output kept in the task's ``result`` or ``error`` at most (its tail, from
a line boundary, after a line that says how much was cut); the whole output is in the
attempt's live log (``deviceq task logs``)."""
DEFAULT_TAIL_BYTES = TAIL_BYTES
_LOG = logging.getLogger("deviceq.runner")
LogWriter = Callable[[str, str], None]
"""Where a run's output goes while it runs: ``write(stream, text)`` with stream stdout, stderr
or log (``deviceq.host.log_stream.RunLog.write``)."""


class TaskLogger(logging.LoggerAdapter):
    """A logger whose every line carries the task's structured fields (task, lease, host,
    device, attempt) for ``deviceq.logs``; extra keyword fields may be given as ``fields=``.
    With a ``sink``, its INFO and higher lines also go to the attempt's live log."""

    sink: LogWriter | None = None

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:
        if self.sink is not None and level >= logging.INFO:
            try:
                text = str(msg) % args if args else str(msg)
            except (TypeError, ValueError):
                text = str(msg)
            self.sink("log", f"{logging.getLevelName(level)} {text}\n")
        super().log(level, msg, *args, **kwargs)

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        extra = dict(kwargs.pop("fields", None) or {})
        kwargs["extra"] = {"fields": {**(self.extra or {}), **extra}}
        return msg, kwargs


@dataclass
class Task:
    """What a runner gets for one attempt of one task.

    ``deadline`` is a ``time.monotonic()`` value (None: no limit); ``cancel`` is set when the
    runner must stop (cancel requested, deadline passed, lease lost or host draining): check it
    often, or wait on it instead of sleeping (``task.cancel.wait(s)`` in a thread runner,
    ``await task.wait_cancel(s)`` in an async one). ``workflow``/``step`` are set for the
    steps of a workflow task. For the leader role of a multi-device task, ``gang`` is the task's id
    (``task_id`` is its part ``GANG.ROLE``), ``role`` the role's name and ``roles`` every
    role's placement: role name -> ``{"device_id": ..., "host_id": ...}``; it runs once every
    role's part is claimed. ``artifacts_dir`` (``$DEVICEQ_ARTIFACTS_DIR`` for a command): a
    fresh empty folder whose files the host keeps in its artifact store when the attempt
    ends (symlinks and names escaping the folder are skipped). ``tests_file``
    (``$DEVICEQ_TESTS_FILE`` for a command): for a task with a list of tests (a suite's
    shard), a file holding its test ids, one a line, written before the run starts; None
    otherwise."""

    goal: str
    task_id: str
    device_id: str
    driver_type: str
    tags: tuple[str, ...] = ()
    attempt: int = 1
    deadline: float | None = None
    cancel: threading.Event = field(default_factory=LoopEvent)
    logger: logging.LoggerAdapter = field(default_factory=lambda: TaskLogger(_LOG, {}))
    lease_id: str = ""
    host_id: str = ""
    workflow: str | None = None
    step: int | None = None
    lease: LeaseClock | None = None
    gang: str | None = None
    role: str | None = None
    roles: dict[str, dict[str, str]] = field(default_factory=dict)
    serial: str = ""  # the device's real serial (a discovered device), else ""
    log_sink: LogWriter | None = None  # the attempt's live log (set by the host daemon)
    progress_sink: Callable[[float, str], None] | None = None  # (set by the host daemon)
    # seconds a runner gives the run between its stop signal and a kill, when the queue says
    # (a preempted run: its class's grace); None: the runner's own
    stop_grace: float | None = None
    tests_file: Path | None = None  # the shard's test ids, one a line ($DEVICEQ_TESTS_FILE)

    def log(self, text: str) -> None:
        """Write a line (or lines) to the attempt's live log (``deviceq task logs``), shown
        while the task runs; a no-op outside a host daemon."""
        self.output("log", text if text.endswith("\n") else text + "\n")

    def progress(self, fraction: float, text: str = "") -> None:
        """Say how far the run is: ``fraction`` from 0 to 1 and a short ``text`` (at most 200
        characters are kept, control characters taken out). Shown by ``deviceq task show``,
        ``task list``, the API and the dashboard while the task runs; the host writes it at
        most once a second (the latest value wins) and the last one before the report.
        Raises ValueError for a fraction out of range or not a number (nothing is recorded);
        a no-op outside a host daemon."""
        f = check_fraction(fraction)
        if self.progress_sink is not None:
            self.progress_sink(f, clean_text(text))

    def output(self, stream: str, text: str) -> None:
        """Write ``text`` of ``stream`` (stdout, stderr or log) to the attempt's live log."""
        if self.log_sink is not None and text:
            self.log_sink(stream, text)

    # the attempt's artifacts folder (see `artifacts_dir`), made on first use: most runs
    # write nothing, and a folder made and removed per task was a third of a silent run's cost
    # (given as text by the host: the `Path` too is made on first use)
    artifacts_path: Path | str | None = None
    _artifacts_made: bool = field(default=False, repr=False)

    @property
    def artifacts_dir(self) -> Path | None:
        """A fresh empty folder for this attempt (made when first asked for): what the runner
        writes there is kept in the host's artifact store when the attempt ends
        (``$DEVICEQ_ARTIFACTS_DIR``); None: not kept."""
        if self.artifacts_path is None:
            return None
        p = self.artifacts_path = Path(self.artifacts_path)
        if not self._artifacts_made:
            try:
                try:
                    p.mkdir(parents=True)
                except FileExistsError:  # left by a run of this attempt that died: not ours
                    shutil.rmtree(p, ignore_errors=True)
                    p.mkdir(parents=True, exist_ok=True)
            except OSError:  # a full or read-only disk: the run goes on without one
                self.artifacts_path = None
                return None
            self._artifacts_made = True
        return p

    def time_left(self) -> float | None:
        """Seconds until the deadline (never negative), or None without a deadline."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    @property
    def cancelled(self) -> bool:
        return self.cancel.is_set()

    async def wait_cancel(self, timeout: float | None = None) -> bool:
        """For an async runner: wait until the run is told to stop (what sets ``cancel``), at
        most ``timeout`` seconds (None: no limit); True when told. Sleep with this rather
        than ``asyncio.sleep``: a stop then reaches the runner at once."""
        if isinstance(self.cancel, LoopEvent):
            return await self.cancel.wait_async(timeout)
        # a plain threading.Event (a Task made by hand): looked at every 50 ms
        loop = asyncio.get_running_loop()
        end = None if timeout is None else loop.time() + timeout
        while not self.cancel.is_set():
            left = None if end is None else end - loop.time()
            if left is not None and left <= 0:
                return False
            await asyncio.sleep(0.05 if left is None else min(0.05, left))
        return True

    def env(self) -> dict[str, str]:
        """The ``DEVICEQ_*`` environment variables describing this task (and, for a device
        with a serial, ``ANDROID_SERIAL``)."""
        env = {
            "DEVICEQ_GOAL": self.goal,
            "DEVICEQ_DEVICE_ID": self.device_id,
            "DEVICEQ_DRIVER_TYPE": self.driver_type,
            "DEVICEQ_TAGS": ",".join(self.tags),
            "DEVICEQ_TASK_ID": self.task_id,
            "DEVICEQ_ATTEMPT": str(self.attempt),
            "DEVICEQ_LEASE_ID": self.lease_id,
            "DEVICEQ_HOST_ID": self.host_id,
        }
        if self.artifacts_dir is not None:
            env["DEVICEQ_ARTIFACTS_DIR"] = str(self.artifacts_dir)
        if self.tests_file is not None:
            env["DEVICEQ_TESTS_FILE"] = str(self.tests_file)
        if self.serial:
            env["DEVICEQ_SERIAL"] = env["ANDROID_SERIAL"] = self.serial
        if self.workflow:
            env["DEVICEQ_WORKFLOW"] = self.workflow
        if self.step is not None:
            env["DEVICEQ_STEP"] = str(self.step)
        if self.gang:
            env["DEVICEQ_GANG"] = self.gang
            env["DEVICEQ_ROLE"] = self.role or ""
            env["DEVICEQ_ROLES"] = json.dumps(self.roles, sort_keys=True)
        return env

    def portable(self) -> dict[str, Any]:
        """The picklable part (everything but the event, the logger and the lease clock), for a
        child process."""
        return {
            "goal": self.goal, "task_id": self.task_id, "device_id": self.device_id,
            "driver_type": self.driver_type, "tags": tuple(self.tags), "attempt": self.attempt,
            "deadline_in": self.time_left(), "lease_id": self.lease_id, "host_id": self.host_id,
            "workflow": self.workflow, "step": self.step, "gang": self.gang, "role": self.role,
            "roles": self.roles, "serial": self.serial,
            "artifacts_path": None if self.artifacts_path is None else str(self.artifacts_path),
            "tests_file": None if self.tests_file is None else str(self.tests_file),
        }  # fmt: skip

    @classmethod
    def from_portable(cls, data: Mapping[str, Any], cancel: threading.Event) -> Task:
        d = dict(data)
        left = d.pop("deadline_in", None)
        for name in ("artifacts_path", "tests_file"):
            if d.get(name) is not None:
                d[name] = Path(d[name])
        deadline = None if left is None else time.monotonic() + float(left)
        task = cls(**d, deadline=deadline, cancel=cancel)
        task.logger = task_logger(task)
        return task


class LeaseClock:
    """A run's lease as the host sees it: ``until`` is the ``time.monotonic()`` by which the
    lease ends unless renewed (a safety margin before its expiry in Redis), or None when
    unknown. The worker moves it at every renewal; runners that run the task outside the
    worker's process (commands, isolated runners) forward it to a watchdog beside the run,
    which kills the run when it passes: a frozen (SIGSTOP) or dead (SIGKILL) daemon can never
    leave a run going after its lease ended and the task went to another device."""

    def __init__(self, until: float | None = None) -> None:
        self.until = until
        self.version = 0

    def extend(self, until: float) -> None:
        self.until = until
        self.version += 1

    def remaining(self) -> float | None:
        return None if self.until is None else self.until - time.monotonic()

    @property
    def expired(self) -> bool:
        left = self.remaining()
        return left is not None and left <= 0


def task_logger(
    task: Task, base: logging.Logger | None = None, context: Mapping[str, Any] | None = None
) -> TaskLogger:
    """A `TaskLogger` carrying ``task``'s fields, after those of ``context`` (the daemon's:
    its pool, say)."""
    fields: dict[str, Any] = {
        **(context or {}),
        "task": task.task_id, "lease": task.lease_id or None, "host": task.host_id or None,
        "device": task.device_id, "attempt": task.attempt,
    }  # fmt: skip
    if task.step is not None:
        fields["step"] = task.step
    return TaskLogger(base or _LOG, fields)


@dataclass(frozen=True)
class Outcome:
    """What a runner reports: ``ok`` with a result text, or not ok with an error text.
    ``infra``: the failure is the device's or the rig's, not the task's (`infrastructure`);
    only such failures (and runner crashes and timeouts) count toward quarantining a device."""

    ok: bool
    text: str = ""
    infra: bool = False
    # a failed command's last line on stderr ("" if none): what a health check gives as the
    # reason, whichever line of the combined output came last
    reason_line: str = field(default="", compare=False)

    @classmethod
    def success(cls, result: str = "") -> Outcome:
        return cls(True, result)

    @classmethod
    def failure(cls, error: str) -> Outcome:
        """The task failed on its own (failure_kind ``runner_failed``)."""
        return cls(False, error)

    @classmethod
    def infrastructure(cls, error: str) -> Outcome:
        """The device or rig failed, not the task (failure_kind ``infrastructure``): counts
        toward ``quarantine_after``."""
        return cls(False, error, True)


def as_outcome(value: Any) -> Outcome:
    """Normalise what a runner returned: Outcome, None, str, bool, or a mapping with ``ok`` /
    ``success`` and ``result`` / ``error``."""
    if isinstance(value, Outcome):
        return value
    if value is None:
        return Outcome.success("")
    if isinstance(value, bool):
        return Outcome(value, "" if value else "runner reported failure")
    if isinstance(value, str):
        return Outcome.success(value)
    if isinstance(value, Mapping):
        ok = bool(value.get("ok", value.get("success", False)))
        text = value.get("result" if ok else "error") or value.get("text") or ""
        return Outcome(ok, str(text), not ok and bool(value.get("infrastructure", False)))
    ok_attr = getattr(value, "ok", getattr(value, "success", None))
    if isinstance(ok_attr, bool):
        text = getattr(value, "result" if ok_attr else "error", None) or ""
        return Outcome(ok_attr, str(text))
    if inspect.iscoroutine(value):  # a plain function returned one: it was never awaited
        value.close()
        raise TypeError(
            "runner returned a coroutine: an async runner must be an `async def` (a class's "
            "`async def __call__`) for the host to await it"
        )
    raise TypeError(f"runner returned {type(value).__name__}; expected an Outcome")


_PATH_RE = re.compile(r"(?<![\w.:/~-])(?:/[^\s/'\"(),:;<>]+)+/([^\s/'\"(),:;<>]+)")


def describe_exception(exc: BaseException, limit: int = 2000) -> str:
    """What a task's ``error`` says about an exception its runner raised: the type and the
    message, on no more than ``limit`` bytes, with the directories of any absolute file path
    left out (``.../name``). Never a traceback: that, with the host's paths, belongs in the
    host's log only."""
    text = f"{type(exc).__name__}: {exc}".rstrip()
    return tail(_PATH_RE.sub(r".../\1", text), limit)


def line_tail(data: bytes, limit: int = TAIL_BYTES, before: int = 0) -> str:
    """The end of a run's output on at most ``limit`` bytes: when anything is cut (or
    ``before`` bytes were already dropped ahead of ``data``), it starts on a line boundary
    after a line saying how many bytes came before it (``… 123,456 bytes before this``)."""
    limit = max(64, min(limit, MAX_PAYLOAD_BYTES))
    if len(data) <= limit and not before:
        return data.decode(errors="replace")
    start = max(0, len(data) - (limit - 64))  # (64: room for the mark's line)
    nl = data.find(b"\n", max(0, start - 1))
    if 0 <= nl < len(data) - 1:
        start = nl + 1
    while start < len(data) and 0x80 <= data[start] < 0xC0:  # never inside a character
        start += 1
    cut = before + start
    body = data[start:].decode(errors="replace")
    return f"… {cut:,} bytes before this\n{body}" if cut else body


def tail(text: str | bytes, limit: int = DEFAULT_TAIL_BYTES) -> str:
    """The last ``limit`` bytes of ``text`` as text (never more than the payload limit)."""
    data = text if isinstance(text, bytes) else text.encode()
    limit = max(1, min(limit, MAX_PAYLOAD_BYTES))
    if len(data) > limit:
        data = data[-limit:]
    return data.decode(errors="replace")


class GoalRunner(Protocol):
    def __call__(self, task: Task) -> Any: ...


class WorkflowRunner(Protocol):
    def __call__(
        self, workflow: WorkflowDefinition, task: Task, goal_runner: GoalRunner
    ) -> Any: ...
