"""Runners: the pluggable entry points that actually execute a task on a device.

A **goal runner** is a callable ``runner(task: Task) -> Outcome``. It gets a `Task` (the goal,
the device, the attempt, a deadline, a cancellation signal and a logger) and returns an
`Outcome` (success and a result text, or failure and an error text). Raising an exception means
the runner itself broke (``runner_error``). For convenience a runner may also return ``None``
(success, no text), a ``str`` (success with that result) or a ``bool``.

A runner may be an ``async def`` (a coroutine function, or an object whose ``__call__`` is
one): the host then awaits it on one event loop shared by all its async runs, with no thread per
run (`deviceq.host.runner_loop`); it waits with ``await task.wait_cancel(seconds)`` (or checks
``task.cancelled``), never with a blocking call, which would hold up every other run on the
loop. The built-in goal runners have async kinds (option ``async``, ``deviceq host run
--async``): `AsyncCommandRunner`, `AsyncSimRunner`.

A **workflow runner** is a callable ``runner(workflow, task, goal_runner) -> Outcome`` that runs
a `WorkflowDefinition` for a workflow task; it gets the configured goal runner to run steps with.

Runners are named by a `RunnerSpec`:

- a built-in name: ``command`` and ``sim`` (goal runners), ``steps`` (the reference workflow
  runner: each step's goal in order through the goal runner, stopping at the first failure);
- an import path ``package.module:callable`` (a class is instantiated with the spec's options);
- an entry point name in the group ``deviceq.runners``.

Python runners that are not built in (nor ``async def``) run, by default, in a child process
of their own (``isolation="auto"``), so a runner that holds the GIL or hangs can never starve
the worker's lease renewals, and a runner that ignores its cancellation signal can be killed
with its whole process group. The ``command`` runner always runs its command in a process
group of its own.
"""

from .aio import LoopEvent, is_async_runner
from .base import (
    DEFAULT_TAIL_BYTES,
    TAIL_BYTES,
    GoalRunner,
    LeaseClock,
    LogWriter,
    Outcome,
    Task,
    TaskLogger,
    WorkflowRunner,
    as_outcome,
    describe_exception,
    line_tail,
    tail,
    task_logger,
)
from .command import AsyncCommandRunner, CommandRunner, CommandTemplate, kill_group, render_argv
from .isolation import IsolatedRunner, RunnerCrashed, build_goal_runner, build_workflow_runner
from .registry import ENTRY_POINT_GROUP, RunnerSpec, load_runner
from .sim import AsyncSimRunner, SimRunner, parse_duration
from .steps import run_steps, run_steps_async, workflow_pair

__all__ = [
    "AsyncCommandRunner",
    "AsyncSimRunner",
    "DEFAULT_TAIL_BYTES",
    "TAIL_BYTES",
    "LogWriter",
    "line_tail",
    "ENTRY_POINT_GROUP",
    "CommandRunner",
    "CommandTemplate",
    "GoalRunner",
    "IsolatedRunner",
    "LeaseClock",
    "LoopEvent",
    "Outcome",
    "RunnerCrashed",
    "RunnerSpec",
    "SimRunner",
    "Task",
    "TaskLogger",
    "WorkflowRunner",
    "as_outcome",
    "build_goal_runner",
    "build_workflow_runner",
    "describe_exception",
    "is_async_runner",
    "kill_group",
    "load_runner",
    "parse_duration",
    "render_argv",
    "run_steps",
    "run_steps_async",
    "workflow_pair",
    "tail",
    "task_logger",
]
