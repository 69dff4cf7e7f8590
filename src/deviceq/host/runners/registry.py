"""Naming runners: `RunnerSpec` (a built-in name, an import path ``package.module:callable`` or
an entry point in ``deviceq.runners``) and resolving it to a callable in this process
(`load_runner`). Where the runner then runs (this process or a child) is `isolation`'s call."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from ...core.errors import ConfigError
from .base import GoalRunner
from .command import AsyncCommandRunner, CommandRunner
from .sim import AsyncSimRunner, SimRunner
from .steps import run_steps

ENTRY_POINT_GROUP = "deviceq.runners"


@dataclass(frozen=True)
class RunnerSpec:
    """Names a runner: a built-in name, ``package.module:callable`` or an entry point name in
    group ``deviceq.runners``; ``options`` configure built-ins and instantiated classes."""

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.name


BUILTIN_GOAL: dict[str, Callable[..., GoalRunner]] = {"command": CommandRunner, "sim": SimRunner}
BUILTIN_ASYNC_GOAL: dict[str, Callable[..., Any]] = {
    "command": AsyncCommandRunner,
    "sim": AsyncSimRunner,
}
"""The built-in goal runners' async kinds, chosen by the option ``async`` (``--async``)."""
ASYNC_OPTION = "async"
BUILTIN_WORKFLOW: dict[str, Any] = {"steps": run_steps, "sequential": run_steps}


def _flag(value: Any) -> bool:
    """An on/off option given as a bool or as text (``--runner-option async=true``)."""
    if isinstance(value, str):
        if value.strip().lower() not in ("true", "false", "yes", "no", "on", "off", "1", "0", ""):
            raise ConfigError(f"option {ASYNC_OPTION!r} must be true or false, not {value!r}")
        return value.strip().lower() in ("true", "yes", "on", "1")
    return bool(value)


def is_builtin(spec: RunnerSpec) -> bool:
    return spec.name in BUILTIN_GOAL or spec.name in BUILTIN_WORKFLOW


def _import(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import runner module {module_name!r}: {exc}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"module {module_name!r} has no {attr!r}") from None
    return obj


def _entry_point(name: str) -> Any:
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            try:
                return ep.load()
            except Exception as exc:  # a broken plugin must name itself
                raise ConfigError(f"entry point {name!r} failed to load: {exc}") from None
    known = sorted({*BUILTIN_GOAL, *BUILTIN_WORKFLOW})
    raise ConfigError(
        f"unknown runner {name!r}: not built in ({', '.join(known)}), not an import path "
        f"'package.module:callable' and not an entry point in group {ENTRY_POINT_GROUP!r}"
    )


def load_runner(spec: RunnerSpec, kind: str = "goal") -> Callable[..., Any]:
    """Resolve ``spec`` to a callable runner of ``kind`` (``goal`` or ``workflow``), in this
    process. Raises ConfigError naming the problem."""
    options = dict(spec.options)
    asynchronous = _flag(options.pop(ASYNC_OPTION, False))
    if asynchronous and not (kind == "goal" and spec.name in BUILTIN_ASYNC_GOAL):
        raise ConfigError(
            f"--async applies to the built-in runners ({', '.join(sorted(BUILTIN_ASYNC_GOAL))}), "
            f"not {spec.name!r}: a Python runner is async when it is an `async def`"
        )
    if kind == "goal" and spec.name in BUILTIN_GOAL:
        made = BUILTIN_ASYNC_GOAL if asynchronous else BUILTIN_GOAL
        try:
            return made[spec.name](**options)
        except TypeError as exc:
            raise ConfigError(f"bad options for runner {spec.name!r}: {exc}") from None
    if kind == "workflow" and spec.name in BUILTIN_WORKFLOW:
        return BUILTIN_WORKFLOW[spec.name]
    if spec.name in BUILTIN_GOAL or spec.name in BUILTIN_WORKFLOW:
        raise ConfigError(f"{spec.name!r} is not a {kind} runner")
    obj = _import(spec.name) if ":" in spec.name else _entry_point(spec.name)
    if isinstance(obj, type):
        try:
            obj = obj(**options)
        except TypeError as exc:
            raise ConfigError(f"cannot create runner {spec.name!r}: {exc}") from None
    if not callable(obj):
        raise ConfigError(f"runner {spec.name!r} is not callable")
    return obj
