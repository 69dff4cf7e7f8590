"""The two kinds of runner a host runs, thread and async, for the guarantee tests that must
hold for both (``@pytest.mark.parametrize("kind", KINDS)``): the built-in runners of either
kind, a Python runner made async, runs awaited to their end, the host's option."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from deviceq.core.models import Assignment
from deviceq.host.dispatcher import DispatchOutcome, TaskDispatcher
from deviceq.host.runners import (
    AsyncCommandRunner,
    AsyncSimRunner,
    CommandRunner,
    Outcome,
    SimRunner,
    Task,
)

KINDS = ("thread", "async")


def host_flags(kind: str) -> tuple[str, ...]:
    """``deviceq host run``'s option for the built-in runner of ``kind``."""
    return ("--async",) if kind == "async" else ()


def run_to_end(value: Any) -> Any:
    """What a runner's call gave: its return value, an async runner's awaited here (on an
    event loop of this thread's own, as long as it runs)."""
    if inspect.isawaitable(value):

        async def wait() -> Any:
            return await value

        return asyncio.run(wait())
    return value


def command(kind: str, template: str, **options: Any) -> Callable[[Task], Outcome]:
    """The command runner of ``kind`` as a plain call (an async one run to its end)."""
    if kind == "async":
        runner = AsyncCommandRunner(template, **options)
        return lambda task: run_to_end(runner(task))
    return CommandRunner(template, **options)


def sim(kind: str, *args: Any, **options: Any) -> Callable[[Task], Outcome]:
    """The sim runner of ``kind`` as a plain call."""
    if kind == "async":
        runner = AsyncSimRunner(*args, **options)
        return lambda task: run_to_end(runner(task))
    return SimRunner(*args, **options)


def python(kind: str, fn: Callable[[Task], Any]) -> Callable[[Task], Any]:
    """``fn`` (a thread runner that never waits) as a runner of ``kind``: itself, or an
    ``async def`` returning what it returns."""
    if kind == "thread":
        return fn

    async def run(task: Task) -> Any:
        return fn(task)

    return run


def dispatch(d: TaskDispatcher, a: Assignment, *args: Any, **kwargs: Any) -> DispatchOutcome:
    """``d.dispatch``, or for an async runner ``d.dispatch_async`` awaited on a loop here."""
    if d.is_async(a):
        return asyncio.run(d.dispatch_async(a, *args, **kwargs))
    return d.dispatch(a, *args, **kwargs)
