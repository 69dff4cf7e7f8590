"""Profiles: a built-in strategy as an ordered list of placement plugins, stage by stage.

Every built-in strategy name of `deviceq.scheduler.strategies` has a profile here that
`deviceq.scheduler.placement.pipeline.place` runs to the same pairs as the old path (the strategy's
``propose`` and then ``plan``'s checks and anti-affinity correction, ``respect_avoid``); the
golden tests (tests/placement/test_golden.py) hold them equal.

Two parts reproduce the old path rather than a clean design, and are the first candidates for
a deliberate change once the scheduler runs profiles:

- ``refine``: faults and anti-affinity are applied after every task has its device (the old
  ``respect_avoid``), not while choosing, so a faulty device a task was given first is swapped
  for an unused one (which may give other pairs than choosing with faults as a score);
- ``window``: the greedy strategies rank a device class larger than 4 x ``limit`` by keeping
  only its ``limit`` best devices, which a retry with an anti-affinity record also chooses
  among (fair share looks at every device)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from ...core.errors import ConfigError
from .builtin import (
    LIMIT_CAPS,
    AgingSort,
    AntiAffinity,
    FairShareSort,
    FaultCount,
    FifoSort,
    LeastRecentlyUsed,
    Match,
    RetryElsewhere,
)
from .builtin.prefer import Prefer
from .builtin.where_match import WhereMatch
from .plugins import Filter, Permit, Plugin, QueueSort, Score


@dataclass(frozen=True)
class Profile:
    """The plugins of one placement policy, by stage (each stage's in order).

    ``scores`` rank a task's feasible devices (compared in order, then ``device_id``);
    ``refine`` scores are applied once every task has its device: a pair whose device is not
    ideal (some refine key above 0) moves to the unused feasible device with the smallest
    refine keys (then ``device_id``) when that is strictly better. ``window``: see the module
    doc."""

    name: str
    sort: QueueSort
    filters: tuple[Filter, ...] = (Match(),)
    scores: tuple[Score, ...] = ()
    permits: tuple[Permit, ...] = ()
    refine: tuple[Score, ...] = ()
    window: bool = False

    @cached_property
    def plugins(self) -> tuple[Plugin, ...]:
        """Every plugin, in stage order (sort, filters, scores, permits, refine); computed
        once per profile (its fields never change)."""
        return (self.sort, *self.filters, *self.scores, *self.permits, *self.refine)

    @cached_property
    def needs(self) -> frozenset[str]:
        """The optional view inputs the plugins read (the union of their ``needs``), computed
        once per profile (every pass asks)."""
        out: frozenset[str] = frozenset()
        for p in self.plugins:
            out |= p.needs
        return out


REFINE: tuple[Score, ...] = (AntiAffinity(), FaultCount())
"""Anti-affinity, then faulty devices last: the refine stage of every built-in profile (and
the correction of a registered whole-pass strategy's pairs)."""
LIMITS: tuple[Permit, ...] = tuple(c for c in LIMIT_CAPS if not c.limit.per_tenant)
"""The declared limits (`deviceq.core.limits`) bounded by a pool setting (each allows every
pair while its bound is unset). A tenant's own cap (``max_devices``) is judged in the pass by
``fair_share`` only; the commit enforces every limit whatever the strategy."""
PREFER = Prefer()
"""The pool's ``prefer`` setting, a score of every built-in profile (after anti-affinity)."""
PERMITS: tuple[Permit, ...] = (WhereMatch(), RetryElsewhere(), *LIMITS)
"""A task's --where clauses (`WhereMatch`), a retry's wait for a device it did not fail on
(`RetryElsewhere`) and the limits: the permits of every built-in profile."""
FAIR_SHARE_PERMITS: tuple[Permit, ...] = (
    *(c for c in LIMIT_CAPS if c.limit.per_tenant),
    *PERMITS,
)

PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "fifo_match",
            FifoSort(),
            scores=(AntiAffinity(), PREFER),
            permits=PERMITS,
            refine=REFINE,
            window=True,
        ),
        Profile(
            "priority_match",
            AgingSort(),
            scores=(AntiAffinity(), PREFER),
            permits=PERMITS,
            refine=REFINE,
            window=True,
        ),
        Profile(
            "lru_device",
            FifoSort(),
            scores=(AntiAffinity(), PREFER, LeastRecentlyUsed()),
            permits=PERMITS,
            refine=REFINE,
            window=True,
        ),
        Profile(
            "fair_share",
            FairShareSort(),
            scores=(AntiAffinity(), PREFER),
            permits=FAIR_SHARE_PERMITS,
            refine=REFINE,
        ),
    )
}
"""The built-in strategies as profiles, by strategy name."""


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ConfigError(
            f"no placement profile {name!r}; built in: " + ", ".join(sorted(PROFILES))
        ) from None
