"""A submission checked and encoded: `spec_from` validates a task spec (one clear
InvalidInput), `chunk_args` makes submit.lua's arguments for a chunk of them, with fresh task
ids; the argument checks the producer shares."""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from ..core.errors import InvalidInput
from ..core.models import TaskSpec, encode_roles


def new_task_id() -> str:
    """A fresh random task id (16 hex characters)."""
    return secrets.token_hex(8)


def spec_from(data: TaskSpec | Mapping[str, Any]) -> TaskSpec:
    """Validate a submission, turning pydantic's report into one clear InvalidInput."""
    if isinstance(data, TaskSpec):
        return data
    if not isinstance(data, Mapping):
        raise InvalidInput(
            f"a task spec must be a TaskSpec or a mapping (dict), not {type(data).__name__}"
        )
    try:
        return TaskSpec.model_validate(dict(data))
    except ValidationError as exc:
        raise InvalidInput(first_error(exc)) from None


def first_error(exc: ValidationError) -> str:
    """Pydantic's first complaint about an input, as one line."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ()) if p != "__root__")
    msg = str(err.get("msg", "invalid input")).removeprefix("Value error, ")
    return f"{where}: {msg}" if where and not msg.startswith("invalid") else msg


def not_before_of(
    not_before: float | None, delay: float | None, now: Callable[[], float] = time.time
) -> float | None:
    """The Unix time a submission waits for: ``not_before``, or ``now()`` plus ``delay``
    seconds (never both). A `Client` gives the Redis server's clock as ``now`` (the clock
    the scripts compare with), so a task never becomes eligible before the delay asked."""
    if not_before is not None and delay is not None:
        raise InvalidInput("give not_before or delay, not both")
    if delay is None:
        return not_before
    if (
        isinstance(delay, bool)
        or not isinstance(delay, int | float)
        or not 0 <= delay <= 365 * 86400
    ):
        raise InvalidInput(f"delay must be 0 to 365 days in seconds, got {delay!r}")
    return now() + float(delay)


def check_int(name: str, value: object, minimum: int) -> None:
    """InvalidInput unless ``value`` is an int (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidInput(f"{name} must be an int >= {minimum}, got {value!r}")


def submit_args(spec: TaskSpec, task_id: str) -> list[Any]:
    """submit.lua's 14 fields of one task."""
    return [
        task_id,
        "workflow" if spec.workflow else "goal",
        spec.goal or "",
        spec.workflow or "",
        spec.driver_type or "",
        ",".join(spec.tags),
        spec.priority,
        "" if spec.max_attempts is None else spec.max_attempts,
        spec.idempotency_key or "",
        "" if spec.queue_timeout is None else f"{spec.queue_timeout:.3f}",
        "" if spec.reject_unmatched is None else int(spec.reject_unmatched),
        spec.retry_on or "",
        spec.retry_backoff or "",
        spec.tenant or "",
    ]


def chunk_args(specs: list[TaskSpec], traceparents: list[str] | None = None) -> list[Any]:
    """submit.lua's arguments for one chunk: 14 fields per task, 15 (the roles) when any
    task of the chunk is a multi-device one, 16 (roles and timeout) when any has a timeout,
    17 (and not_before, ms) when any has a not_before, 18 (and retry_of) when any has a
    retry_of, 19 (and by) when any names who submitted it, 20 (and traceparent, one per
    task) with ``traceparents`` (deviceq.core.tracing), 21 (and the priority class) when any
    names one."""
    classed = any(s.priority_class for s in specs)
    traced = classed or traceparents is not None
    signed = traced or any(s.by is not None for s in specs)
    linked = signed or any(s.retry_of is not None for s in specs)
    later = linked or any(s.not_before is not None for s in specs)
    timed = later or any(s.timeout is not None for s in specs)
    gang = timed or any(s.roles for s in specs)
    args: list[Any] = [len(specs)]
    for i, spec in enumerate(specs):
        args += submit_args(spec, new_task_id())
        if gang:
            args.append(encode_roles(spec.roles) if spec.roles else "")
        if timed:
            args.append("" if spec.timeout is None else f"{spec.timeout:.3f}")
        if later:
            # (rounded up: never a millisecond before the time asked)
            args.append("" if spec.not_before is None else str(math.ceil(spec.not_before * 1000)))
        if linked:
            args.append(spec.retry_of or "")
        if signed:
            args.append(spec.by or "")
        if traced:
            args.append(traceparents[i] if traceparents is not None else "")
        if classed:
            args.append(spec.priority_class or "")
    return args
