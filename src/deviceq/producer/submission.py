"""A submission checked and encoded: `spec_from` validates a task spec (one clear
InvalidInput), `chunk_args` makes submit.lua's arguments for a chunk of them (the tasks packed
by `deviceq.core.script_args.SUBMIT`), with fresh task ids; the argument checks the producer
shares."""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from ..core.bounds import (
    SUBMIT_CALL_US,
    SUBMIT_MOST_TASKS,
    SUBMIT_TASK_US,
    SUBMIT_TESTS_NS,
    SUBMIT_TEXT_NS,
)
from ..core.errors import InvalidInput
from ..core.models import TaskSpec, encode_role_where, encode_roles
from ..core.pacing import Pacer, pacer_for
from ..core.script_args import SUBMIT
from ..core.validation import tests_text
from ..core.where import compiled_of


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


def task_item(spec: TaskSpec, task_id: str, traceparent: str | None = None) -> dict[str, Any]:
    """submit.lua's fields of one task (`deviceq.core.script_args.SUBMIT`; None: not given)."""
    return {
        "id": task_id,
        "kind": "workflow" if spec.workflow else "goal",
        "goal": spec.goal or "",
        "workflow": spec.workflow or "",
        "driver_type": spec.driver_type or "",
        "tags": ",".join(spec.tags),
        "priority": spec.priority,
        "max_attempts": spec.max_attempts,
        "idempotency_key": spec.idempotency_key or None,
        "queue_timeout": None if spec.queue_timeout is None else f"{spec.queue_timeout:.3f}",
        "reject_unmatched": None if spec.reject_unmatched is None else int(spec.reject_unmatched),
        "retry_on": spec.retry_on or None,
        "retry_backoff": spec.retry_backoff or None,
        "tenant": spec.tenant or None,
        "roles": encode_roles(spec.roles) if spec.roles else None,
        "timeout": None if spec.timeout is None else f"{spec.timeout:.3f}",
        # (rounded up: never a millisecond before the time asked)
        "not_before": None if spec.not_before is None else math.ceil(spec.not_before * 1000),
        "retry_of": spec.retry_of or None,
        "by": spec.by or None,
        "traceparent": traceparent or None,
        "pin": spec.pin or None,
        "class": spec.priority_class or None,
        "where": compiled_of(spec.where) if spec.where else None,
        "tests": None if spec.tests is None else tests_text(spec.tests),
        "role_where": encode_role_where(spec.roles) if spec.roles else None,
    }


def task_items(
    specs: list[TaskSpec], traceparents: list[str] | None = None
) -> list[dict[str, Any]]:
    """submit.lua's items for one chunk, each with a fresh task id (``traceparents``: one per
    task, `deviceq.core.tracing`)."""
    return [
        task_item(spec, new_task_id(), traceparents[i] if traceparents is not None else None)
        for i, spec in enumerate(specs)
    ]


def chunk_args(specs: list[TaskSpec], traceparents: list[str] | None = None) -> list[Any]:
    """submit.lua's arguments for one chunk: the count and the tasks packed
    (`deviceq.core.script_args.SUBMIT`), each with a fresh task id."""
    return items_args(task_items(specs, traceparents))


def _text_bytes(value: object) -> int:
    if not isinstance(value, str):
        return 0
    return len(value) if value.isascii() else len(value.encode())


_FIXED = frozenset({"id", "kind", "tests"})  # (the id and kind: in the per-task cost)


def task_cost_us(item: Mapping[str, Any]) -> float:
    """A task's declared cost in a ``submit.lua`` call (`deviceq.core.bounds`): the per-task
    cost plus its text's bytes (its list of tests at the tests' rate) at the declared rates."""
    text = sum(_text_bytes(v) for k, v in item.items() if k not in _FIXED)
    tests = _text_bytes(item.get("tests"))
    return SUBMIT_TASK_US + (text * SUBMIT_TEXT_NS + tests * SUBMIT_TESTS_NS) / 1000


def chunk_end(
    items: list[dict[str, Any]], start: int, most: int, budget_us: float = SUBMIT_CALL_US
) -> int:
    """The end of the ``submit.lua`` call that starts at ``items[start]``: at most ``most``
    tasks and at most ``budget_us`` of declared cost (`task_cost_us`), but at least one task
    (a task alone over the budget goes alone)."""
    cost, i = 0.0, start
    while i < len(items):
        c = task_cost_us(items[i])
        if i > start and (i - start >= most or cost + c > budget_us):
            break
        cost += c
        i += 1
    return i


def submit_chunks(
    items: list[dict[str, Any]], most: int = SUBMIT_MOST_TASKS, budget_us: float = SUBMIT_CALL_US
) -> list[tuple[int, int]]:
    """``items`` (`task_item` fields) cut into consecutive chunks ``(start, end)``, one
    ``submit.lua`` call each (`chunk_end`): at most ``most`` tasks and ``budget_us`` of
    declared cost a chunk. At the declared budget (``SUBMIT_CALL_US``): short tasks ~120 a
    call (``SUBMIT_MOST_TASKS``: 125 at most); 16 KiB goals: 4."""
    out: list[tuple[int, int]] = []
    start = 0
    while start < len(items):
        end = chunk_end(items, start, most, budget_us)
        out.append((start, end))
        start = end
    return out


def submit_pacer(owner: object) -> Pacer:
    """The pacer of ``owner``'s (a client's) ``submit.lua`` calls, in declared microseconds:
    the first call carries half of ``SUBMIT_CALL_US``; then each call's measured time sizes
    the next toward `deviceq.core.pacing.TARGET_MS`, never past ``SUBMIT_CALL_US`` of declared
    cost. On a machine slower than the declared costs assume, the calls carry less, so a
    call's Redis time stays near the target whatever the machine."""
    return pacer_for(owner, "submit", SUBMIT_CALL_US // 2)


def declared_cost_us(items: list[dict[str, Any]]) -> int:
    """The declared cost of one call's tasks (`task_cost_us`), whole microseconds."""
    return max(1, int(sum(task_cost_us(t) for t in items)))


def items_args(items: list[dict[str, Any]]) -> list[Any]:
    """submit.lua's arguments for tasks given as `task_item` fields."""
    return [len(items), SUBMIT.pack(items)]
