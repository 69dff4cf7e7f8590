"""Option values that live in heavy modules, read on first use: `LazyChoice` (the choices of an
option, e.g. the task statuses of the models) and `Lazy` (a default, e.g. the scheduler's
tick). Every command module is imported whenever ``deviceq`` starts (``deviceq --help`` lists
them all), so a command's options must not import the models, the scheduler or rich; the
values are resolved when an option is parsed or its help is shown."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import click


def resolve(path: str) -> Any:
    """``package.module:name`` (``name`` may be dotted: ``TaskStatus.done``) -> the object."""
    module, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Lazy:
    """A default read from ``package.module:name`` when the option needs it: click calls it
    for the value, and shows ``str()`` of it in ``--help`` (with ``show_default=True``)."""

    def __init__(self, path: str, convert: Callable[[Any], Any] | None = None) -> None:
        self.path = path
        self.convert = convert

    def __call__(self) -> Any:
        value = resolve(self.path)
        return self.convert(value) if self.convert is not None else value

    def __str__(self) -> str:
        return str(self())

    def __repr__(self) -> str:
        return f"Lazy({self.path!r})"


class _LazyChoices(Sequence[str]):
    """The choices, loaded on first access."""

    def __init__(self, load: Callable[[], Sequence[str]]) -> None:
        self._load = load
        self._values: tuple[str, ...] | None = None

    def _all(self) -> tuple[str, ...]:
        if self._values is None:
            self._values = tuple(self._load())
        return self._values

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...
    def __getitem__(self, i: int | slice) -> str | Sequence[str]:
        return self._all()[i]

    def __len__(self) -> int:
        return len(self._all())

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __contains__(self, value: object) -> bool:
        return value in self._all()


class LazyChoice(click.Choice):
    """`click.Choice` whose choices come from ``load()`` the first time they are needed."""

    def __init__(self, load: Callable[[], Sequence[str]], case_sensitive: bool = True) -> None:
        self.case_sensitive = case_sensitive
        self._choices = _LazyChoices(load)

    @property  # type: ignore[override]
    def choices(self) -> Sequence[str]:
        return self._choices

    @choices.setter
    def choices(self, value: Sequence[str]) -> None:
        self._choices = _LazyChoices(lambda: value)


def values_of(path: str) -> Callable[[], list[str]]:
    """The values of the enum at ``package.module:Name``, for a `LazyChoice`."""
    return lambda: [member.value for member in resolve(path)]


TASK_STATUSES = values_of("deviceq.core.vocabulary:TaskStatus")


class DurationRange(click.FloatRange):
    """`click.FloatRange` of seconds that reads the one duration syntax
    (`deviceq.core.validation.parse_duration_s`: ``90``, ``90s``, ``5m``, ``1h30m``, ``1d``),
    with an upper bound read from ``max_from`` (``package.module:name``) when given."""

    name = "duration"

    def __init__(self, max_from: str | None = None, **kwargs: Any) -> None:
        self._max_from = max_from
        super().__init__(**kwargs)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            from ..core.errors import InvalidInput
            from ..core.validation import parse_duration_s

            try:
                value = parse_duration_s(value)
            except InvalidInput as exc:
                self.fail(str(exc), param, ctx)
        if self._max_from is not None:
            self.max = float(resolve(self._max_from))
        return super().convert(value, param, ctx)

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str | None:
        return "DURATION"
