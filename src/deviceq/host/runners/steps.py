"""The built-in ``steps`` workflow runner (the reference one)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...core.models import WorkflowDefinition
from .base import GoalRunner, Outcome, Task, as_outcome, tail, task_logger


def run_steps(
    workflow: WorkflowDefinition, task: Task, goal_runner: GoalRunner, **_: Any
) -> Outcome:
    """The reference workflow runner: each step's goal in order through the goal runner, on the
    task's device; stops at the first failure (or cancellation). Exceptions propagate."""
    results: list[str] = []
    total = len(workflow.steps)
    for i, step in enumerate(workflow.steps, 1):
        label = f"step {i}/{total}" + (f" ({step.name})" if step.name else "")
        if task.cancel.is_set():
            return Outcome.failure(f"stopped before {label}")
        sub = replace(task, goal=step.goal, workflow=workflow.name, step=i)
        sub.logger = task_logger(sub, task.logger.logger, task.logger.extra)
        sub.logger.debug(f"workflow {workflow.name}: {label} started")
        out = as_outcome(goal_runner(sub))
        if not out.ok:
            return Outcome.failure(tail(f"{label} failed: {out.text}"))
        results.append(f"{label}: {out.text.strip()}")
    return Outcome.success(tail("\n".join(results)))
