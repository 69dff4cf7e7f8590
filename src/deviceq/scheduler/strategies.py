"""Assignment strategies: named, registered policies that pair queued tasks with idle devices.

A strategy is pure Python policy. It receives a bounded :class:`Snapshot` that the
``TaskScheduler`` read from Redis (the heads of the queued buckets that some idle device can
serve, and the assignable idle devices) and returns proposed ``(task_id, device_id)`` pairs.
The scheduler commits them with ``lua/assign.lua``, which re-validates every pair, so a strategy
can never cause a double booking: a wrong or stale proposal only costs a rejected pair.

Registering a strategy::

    from deviceq import Snapshot, register_strategy

    @register_strategy("newest_first")  # also sets NewestFirst.name = "newest_first"
    class NewestFirst:
        lookahead = 100  # see 100 more tasks per bucket than there are idle devices for it

        def propose(self, snapshot: Snapshot) -> list[tuple[str, str]]:
            order = sorted(snapshot.tasks(), key=lambda t: -t.seq)
            return snapshot.greedy(order, device_key=lambda d: d.device_id)

    TaskScheduler(url, "lab", strategy="newest_first")

Without ``lookahead`` this example would assign the *oldest* task: a snapshot holds, per
bucket, only as many head (oldest) tasks as there are idle devices able to serve it (see
:class:`AssignmentStrategy`). With it, it assigns the newest of a bucket's oldest
idle-devices + 100 tasks. The "Writing a strategy" example of docs/how-to/priorities.md is
the same code, and ``tests/api/test_api_hardening.py`` runs it.

A strategy in another installed package is found by name through the entry-point group
``deviceq.strategies`` (``name = "package.module:Class"``); no edit to the scheduler needed.

Built-in strategies are placement profiles (`placement.profiles`: lists of plugins run
by `placement.pipeline.place`; `ProfileStrategy` here). Every one assigns each device at
most once per pass, never proposes a pair whose constraints do not hold, never lets a task
nobody can serve delay other tasks (only tasks with a matching idle device are considered at
all), prefers devices and hosts a retry has not failed on, and offers devices with recent
device faults last:

``fifo_match`` (default)
    Tasks oldest first (submission order, the ``seq`` counter, across all constraint buckets);
    each gets the *first* matching idle device, "first" meaning the smallest ``device_id`` in
    plain string order among the idle devices the pass read (of each device class a bucket
    can use, its longest idle ones, a few times as many as the pass can place:
    `deviceq.scheduler.idle_classes`). Deterministic: the same snapshot always gives the
    same pairs. A strategy whose policy needs every idle device sets ``reads_all_idle =
    True`` (each pass then reads every usable class whole).
``priority_match``
    Tasks by effective priority (0..9, higher first: ``priority`` raised one level per
    ``aging_seconds`` waited, see `aged`), oldest first within a priority; device choice as
    in ``fifo_match``.
``lru_device``
    Tasks oldest first as in ``fifo_match``; each gets the matching device that has been idle the
    longest (smallest idle-since time in the ``idle`` zset; ties by ``device_id``). Spreads work
    evenly over devices (and hence hosts), so no device sits unused while another is hammered.
``fair_share``
    Tenants (``submit --tenant``) get contended devices in proportion to their weights, with
    an optional cap on the devices a tenant holds at once, on top of priority and aging
    (`placement.builtin.fair_share`, `placement.builtin.tenant_cap`).

A registered strategy may declare what it reads beyond what every snapshot carries:
``needs = {"tenants"}`` (or the older ``uses_tenants = True``) has the tenants' weights, caps
and held devices read for it (`Snapshot.tenants`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from ..core.errors import ConfigError
from .placement.builtin.fair_share import FairShareSort
from .placement.builtin.ordering import PrioritySort
from .placement.pipeline import place
from .placement.profiles import PROFILES, Profile
from .placement.rows import (
    MAX_PRIORITY,
    Bucket,
    IdleDevice,
    Pair,
    QueuedTask,
    Snapshot,
    TenantShare,
    aged,
)
from .placement.view import View

__all__ = [
    "DEFAULT_STRATEGY",
    "MAX_PRIORITY",
    "AssignmentStrategy",
    "Bucket",
    "IdleDevice",
    "Pair",
    "ProfileStrategy",
    "QueuedTask",
    "Snapshot",
    "TenantShare",
    "aged",
    "get_strategy",
    "register_strategy",
    "registered_strategies",
    "strategy_needs",
]

ENTRY_POINT_GROUP = "deviceq.strategies"
DEFAULT_STRATEGY = "fifo_match"


@runtime_checkable
class AssignmentStrategy(Protocol):
    """A policy that pairs queued tasks with idle devices.

    ``propose`` must be a pure function of the snapshot (no Redis access): it returns
    ``(task_id, device_id)`` pairs, each task and device at most once, every device satisfying
    its task's constraints (``Snapshot.matching`` and ``Snapshot.greedy`` help). The scheduler
    drops pairs that break these rules and the assign script re-validates the rest.

    By default a bucket's snapshot holds as many head tasks as there are idle devices able to
    serve it (enough for any policy that keeps submission order within a bucket). A strategy
    that wants to look deeper may define an int attribute ``lookahead``: that many more heads
    per servable bucket (capped at 1000; each pass then costs that much more)."""

    name: str

    def propose(self, snapshot: Snapshot) -> Sequence[Pair]: ...


StrategyFactory = Callable[[], AssignmentStrategy]
_REGISTRY: dict[str, StrategyFactory] = {}
_ENTRY_POINTS_LOADED = {"done": False}


def register_strategy(name: str) -> Callable[[Any], Any]:
    """Class (or zero-argument factory, or ready object) decorator registering a strategy
    under ``name``. Registering a name again replaces the earlier strategy.

    The decorator also sets the strategy's ``name`` attribute to ``name`` when it is missing
    or different (on the class, or on the object; a factory's instances get it when made),
    so ``strategy.name`` is always the name it is registered and selected by (it appears in
    the scheduler's log lines). A class registered under several names keeps the last one as
    its class attribute, and each name's instances carry their own."""
    if not name or not isinstance(name, str):
        raise ConfigError("a strategy name must be a non-empty string")

    def deco(obj: Any) -> Any:
        factory = _factory(obj, name)  # sets an object's name; refuses one without propose
        if isinstance(obj, type) and getattr(obj, "name", None) != name:
            cls: Any = obj
            cls.name = name
        _REGISTRY[name] = factory
        return obj

    return deco


def _factory(obj: Any, name: str | None = None) -> StrategyFactory:
    """A zero-argument factory for a class, factory function or ready strategy object; with
    ``name``, every strategy it makes has ``name`` as its ``name`` attribute."""

    def named(strategy: Any) -> Any:
        if name is not None and getattr(strategy, "name", None) != name:
            try:
                strategy.name = name
            except (AttributeError, TypeError):
                try:  # a frozen dataclass and the like
                    object.__setattr__(strategy, "name", name)
                except (AttributeError, TypeError):
                    raise ConfigError(
                        f"strategy {name!r}: cannot set the name attribute of {strategy!r}"
                    ) from None
        return strategy

    if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "propose")):
        if name is None:
            return obj  # type: ignore[no-any-return,unused-ignore]
        return lambda: named(obj())
    if hasattr(obj, "propose"):
        named(obj)
        return lambda: obj
    raise ConfigError(f"{obj!r} is not an AssignmentStrategy (no propose method)")


def _load_entry_points() -> None:
    if _ENTRY_POINTS_LOADED["done"]:
        return
    _ENTRY_POINTS_LOADED["done"] = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _REGISTRY:
            continue
        try:
            _REGISTRY[ep.name] = _factory(ep.load(), ep.name)
        except Exception as exc:  # a broken plugin must not hide the others
            _REGISTRY[ep.name] = _broken(ep.name, exc)


def _broken(name: str, exc: Exception) -> StrategyFactory:
    def fail() -> AssignmentStrategy:
        raise ConfigError(f"strategy {name!r} (entry point) failed to load: {exc}")

    return fail


def registered_strategies() -> list[str]:
    """Names of every registered strategy (built-in, decorated and entry points), sorted."""
    _load_entry_points()
    return sorted(_REGISTRY)


def get_strategy(name: str) -> AssignmentStrategy:
    """A fresh instance of the strategy registered as ``name``. Raises ConfigError naming the
    registered strategies for an unknown name; there is no fallback."""
    if name not in _REGISTRY:
        _load_entry_points()
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ConfigError(
            f"unknown assignment strategy {name!r}; registered: "
            + ", ".join(registered_strategies())
        )
    strategy = factory()
    if not callable(getattr(strategy, "propose", None)):
        raise ConfigError(f"strategy {name!r} has no propose(snapshot) method")
    return strategy


# -- built-in strategies: placement profiles ------------------------------------------------
class ProfileStrategy:
    """A built-in strategy: a placement profile (`placement.profiles`) run by the
    pipeline. The scheduler gives it a view holding just what its plugins ``needs``;
    ``propose`` runs it on a whole-pass `Snapshot` too (whose priorities are already aged)."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.name = profile.name
        self.needs = profile.needs

    def propose(self, snapshot: Snapshot) -> list[Pair]:
        return place(self.profile, View.from_snapshot(snapshot))

    def __repr__(self) -> str:
        return f"ProfileStrategy({self.name!r})"


def _builtin(profile: Profile) -> StrategyFactory:
    return lambda: ProfileStrategy(profile)


for _name, _profile in PROFILES.items():
    _REGISTRY[_name] = _builtin(_profile)


def orders_by_priority(strategy: Any) -> bool:
    """Whether a strategy orders tasks by priority: a profile whose queue sort does (priority
    with aging, fair share); a registered whole-pass strategy says so with its
    ``honors_priority`` attribute (taken as True when it has none: it gets every priority)."""
    if isinstance(strategy, ProfileStrategy):
        return isinstance(strategy.profile.sort, PrioritySort | FairShareSort)
    return bool(getattr(strategy, "honors_priority", True))


def strategy_needs(strategy: Any) -> frozenset[str]:
    """The optional snapshot inputs a strategy reads (`placement.view.INPUTS`): a
    profile's plugins' ``needs``; for a registered whole-pass strategy its own ``needs``
    attribute, or ``tenants`` when it sets ``uses_tenants``, plus what every `Snapshot`
    carries (effective priorities from submit times, anti-affinity records, fault counts)."""
    if isinstance(strategy, ProfileStrategy):
        return strategy.needs
    own = frozenset(getattr(strategy, "needs", ()) or ())
    if getattr(strategy, "uses_tenants", False):
        own |= {"tenants"}
    return own | {"submit_times", "avoid", "faults"}
