"""The built-in ``steps`` workflow runner (the reference one), as a thread runner
(`run_steps`) and as an async one (`run_steps_async`, for an async goal runner), and the pairing
of a workflow runner with a goal runner of its kind (`workflow_pair`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from ...core.models import WorkflowDefinition
from .aio import is_async_runner
from .base import GoalRunner, Outcome, Task, WorkflowRunner, as_outcome, tail, task_logger


def run_steps(
    workflow: WorkflowDefinition, task: Task, goal_runner: GoalRunner, **_: Any
) -> Outcome:
    """The reference workflow runner: each step's goal in order through the goal runner, on the
    task's device; stops at the first failure (or cancellation). Exceptions propagate."""
    results: list[str] = []
    for label, sub in _steps(workflow, task):
        if task.cancel.is_set():
            return Outcome.failure(f"stopped before {label}")
        out = as_outcome(goal_runner(sub))
        if not out.ok:
            return Outcome.failure(tail(f"{label} failed: {out.text}"))
        results.append(f"{label}: {out.text.strip()}")
    return Outcome.success(tail("\n".join(results)))


async def run_steps_async(
    workflow: WorkflowDefinition, task: Task, goal_runner: Callable[[Task], Any], **_: Any
) -> Outcome:
    """`run_steps` for an async goal runner: each step awaited in order on the host's event
    loop; stops at the first failure (or cancellation). Exceptions propagate."""
    results: list[str] = []
    for label, sub in _steps(workflow, task):
        if task.cancel.is_set():
            return Outcome.failure(f"stopped before {label}")
        out = as_outcome(await goal_runner(sub))
        if not out.ok:
            return Outcome.failure(tail(f"{label} failed: {out.text}"))
        results.append(f"{label}: {out.text.strip()}")
    return Outcome.success(tail("\n".join(results)))


def _steps(workflow: WorkflowDefinition, task: Task) -> Iterator[tuple[str, Task]]:
    """Each step's label and the `Task` it runs as (its goal, workflow and step number)."""
    total = len(workflow.steps)
    for i, step in enumerate(workflow.steps, 1):
        label = f"step {i}/{total}" + (f" ({step.name})" if step.name else "")
        sub = replace(task, goal=step.goal, workflow=workflow.name, step=i)
        sub.logger = task_logger(sub, task.logger.logger, task.logger.extra)
        sub.logger.debug(f"workflow {workflow.name}: {label} started")
        yield label, sub


def workflow_pair(
    workflow_runner: WorkflowRunner, goal_runner: GoalRunner
) -> tuple[WorkflowRunner, GoalRunner]:
    """A workflow runner and the goal runner it is given, of one kind: the built-in steps
    runner with an async goal runner is `run_steps_async`; any other workflow runner gets the
    goal runner as its own kind (an async goal runner as a plain call that runs each step to
    its end with ``asyncio.run`` in the workflow's thread; a thread goal runner, for an async
    workflow runner, as a coroutine running it with ``asyncio.to_thread``)."""
    goal_async = is_async_runner(goal_runner)
    if workflow_runner is run_steps and goal_async:
        return run_steps_async, goal_runner
    wf_async = is_async_runner(workflow_runner)
    if goal_async and not wf_async:
        async_goal = goal_runner

        def in_thread(task: Task) -> Any:
            return asyncio.run(async_goal(task))

        return workflow_runner, in_thread
    if wf_async and not goal_async:
        sync_goal = goal_runner

        async def on_loop(task: Task) -> Any:
            return await asyncio.to_thread(sync_goal, task)

        return workflow_runner, on_loop
    return workflow_runner, goal_runner
