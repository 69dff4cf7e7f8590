"""``explain`` of a queued task of a priority class: whom it will preempt (the scheduler's own
choice, `deviceq.scheduler.preemption.choose`, over the same bounded reads), whom it is
preempting now, or why it preempts nobody."""

from __future__ import annotations

from ...core.connection import PoolConnection
from ...core.models import ScheduledTask
from ...core.priority_classes import all_classes
from ...scheduler.preemption import Urgent, choose, limits, read_victims
from .model import Reason


def preemption_reason(
    admin: PoolConnection, task: ScheduledTask, raw: dict[str, str], idle_matching: int
) -> tuple[Reason, str | None] | None:
    """The reason to show for ``task`` (its hash ``raw``) and, when preemption decides its
    fate, the summary; None for a task without a class."""
    name = task.priority_class
    if not name:
        return None
    classes = {c.name: c for c in all_classes(admin.redis, admin.keys)}
    c = classes.get(name)
    if c is None:
        return Reason("preemption", f"its priority class {name} does not exist: it preempts "
                      "nobody"), None  # fmt: skip
    if not c.preempts:
        return None
    device, victim = raw.get("preempting", ""), raw.get("preempting_task", "")
    if device:
        text = (f"it preempted task {victim} on {device}: it gets the device once that run has "
                "stopped (within the victim class's grace)")  # fmt: skip
        return Reason("preempting", text, 1, {"victim": victim, "device_id": device}), text
    if idle_matching:
        return None  # an idle device matches: it is placed without preempting
    per_min, per_task, used = limits(admin.redis, admin.keys)
    if used >= per_min:
        text = (f"it preempts nobody now: {used} preemptions in the last minute "
                f"(max_preemptions_per_minute {per_min})")  # fmt: skip
        return Reason("preemption", text, used), text
    u = Urgent(task.id, task.priority, task.driver_type or "", frozenset(task.tags), name)
    ch = choose(u, read_victims(admin.redis, admin.keys), classes, per_task)
    if ch.victim is None:
        text = f"it preempts nobody: {ch.why_none}"
        return Reason("preemption", text, 0, {"skipped": ch.skipped}), text
    v = ch.victim
    text = (
        f"every matching device is busy: it will preempt task {v.task_id} on {v.device_id} "
        f"(priority {v.priority}; the shortest-running preemptible task of a lower priority)"
    )
    return Reason("preemption", text, 1, {"victim": v.task_id, "device_id": v.device_id}), text
