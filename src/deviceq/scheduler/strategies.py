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
idle-devices + 100 tasks. The README's "Writing a strategy" example is the same code, and
``tests/test_api_hardening.py`` runs it.

A strategy in another installed package is found by name through the entry-point group
``deviceq.strategies`` (``name = "package.module:Class"``); no edit to the scheduler needed.

Built-in strategies (every one assigns each device at most once per pass, never proposes a pair
whose constraints do not hold, and never lets a task nobody can serve delay other tasks: only
tasks with a matching idle device are considered at all):

``fifo_match`` (default)
    Tasks oldest first (submission order, the ``seq`` counter, across all constraint buckets);
    each gets the *first* matching idle device, "first" meaning the smallest ``device_id`` in
    plain string order. Deterministic: the same snapshot always gives the same pairs.
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
    an optional cap on the devices a tenant holds at once, on top of priority and aging (see
    `FairShare`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from operator import attrgetter
from typing import Any, Protocol, runtime_checkable

from ..core.errors import ConfigError
from ..core.models import Constraints, satisfies

ENTRY_POINT_GROUP = "deviceq.strategies"
DEFAULT_STRATEGY = "fifo_match"

Pair = tuple[str, str]


@dataclass(frozen=True)
class QueuedTask:
    """A queued task near the head of its bucket: id, submission order, bucket, priority, and
    the devices and hosts it lost an attempt on (a retry prefers others: see `avoid_rank`).
    ``effective_priority`` is ``priority`` raised by aging (one level per ``aging_seconds``
    waited, at most 9): what priority strategies order by (`aged_priority`)."""

    task_id: str
    seq: int
    sig: str
    priority: int = 0
    avoid_devices: frozenset[str] = frozenset()
    avoid_hosts: frozenset[str] = frozenset()
    effective_priority: int = -1  # -1: not aged (the snapshot sets it; see aged_priority)
    tenant: str | None = None  # who it is for (its bucket's tenant; fair_share)

    @property
    def aged_priority(self) -> int:
        """The priority to order by: the effective one when the snapshot set it."""
        return self.effective_priority if self.effective_priority >= 0 else self.priority

    def avoid_rank(self, device: IdleDevice) -> int:
        """0: a device and host this task has not failed on; 1: a new device on a host it
        failed on; 2: a device it failed on."""
        if device.device_id in self.avoid_devices:
            return 2
        return 1 if device.host_id in self.avoid_hosts else 0


@dataclass(frozen=True)
class IdleDevice:
    """An assignable device: idle, unreserved, not quarantined, on a live, non-draining host.
    ``idle_since`` is the Redis time (ms) it joined the ``idle`` index; ``faults`` its
    consecutive device faults (infrastructure, runner_error, timeout) since its last success:
    every strategy's choice is corrected to offer such a device last (`plan.respect_avoid`)."""

    device_id: str
    host_id: str
    driver_type: str
    tags: frozenset[str]
    idle_since: int = 0
    faults: int = 0

    @property
    def device_class(self) -> tuple[str, frozenset[str]]:
        return (self.driver_type, self.tags)


@dataclass(frozen=True)
class TenantShare:
    """A tenant as fair share sees it: its ``weight`` (share of contended devices, default 1),
    ``max_devices`` (cap on devices held at once; 0 = none) and the devices it ``held`` when
    the snapshot was read (leases of its tasks, assigned or running)."""

    weight: int = 1
    max_devices: int = 0
    held: int = 0


@dataclass(frozen=True)
class Bucket:
    """One constraint bucket of the queue: its signature, constraints (driver type, tags) and
    priority. In a strategy's snapshot it carries its oldest queued tasks (``heads``) and the
    head's submission order; in ``status`` its ``depth`` and its head task's submit time."""

    sig: str
    driver_type: str | None
    tags: frozenset[str]
    priority: int
    heads: tuple[QueuedTask, ...] = ()
    head_seq: int = 0
    depth: int | None = None
    head_task: str | None = None
    head_submitted_at: int | None = None
    tenant: str | None = None

    def accepts(self, device: IdleDevice) -> bool:
        """True if a device satisfies this bucket's constraints (the one rule, `satisfies`)."""
        return satisfies(self.driver_type, self.tags, device.driver_type, device.tags)

    @property
    def constraints(self) -> Constraints:
        return Constraints(driver_type=self.driver_type, tags=tuple(sorted(self.tags)))


@dataclass
class Snapshot:
    """What a strategy sees: the buckets (only those some idle device can serve, each with at
    most ``limit`` head tasks, oldest first) and the assignable idle devices (by device id).
    ``matching[sig]`` lists the idle devices that satisfy bucket ``sig``, by device id.
    At most ``limit`` pairs are committed per pass; extra proposals are dropped."""

    buckets: list[Bucket]
    devices: list[IdleDevice]
    limit: int
    now_ms: int = 0
    matching: dict[str, list[IdleDevice]] = field(default_factory=dict)
    signatures: int = 0  # non-empty buckets in the pool (read or not)
    # the tenants of the buckets, with their weight, cap and the devices they hold now (read
    # only for a strategy with ``uses_tenants = True``)
    tenants: dict[str, TenantShare] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        buckets: Sequence[Bucket],
        devices: Sequence[IdleDevice],
        limit: int,
        now_ms: int = 0,
    ) -> Snapshot:
        """Build a snapshot and its ``matching`` index (matching is done per device class,
        i.e. per distinct (driver_type, tags), so it costs buckets x classes, not x devices)."""
        devs = sorted(devices, key=attrgetter("device_id"))
        classes: dict[tuple[str, frozenset[str]], list[IdleDevice]] = {}
        for d in devs:
            classes.setdefault(d.device_class, []).append(d)
        matching: dict[str, list[IdleDevice]] = {}
        # buckets of one constraint (e.g. tenants x priorities of one driver type) share it
        by_constraint: dict[tuple[str | None, frozenset[str]], list[IdleDevice]] = {}
        for b in buckets:
            got = by_constraint.get((b.driver_type, b.tags))
            if got is None:
                ms = [c for key, c in classes.items() if _class_accepts(b, key)]
                got = ms[0] if len(ms) == 1 else sorted((d for c in ms for d in c), key=_by_id)
                by_constraint[(b.driver_type, b.tags)] = got
            matching[b.sig] = got
        return cls(list(buckets), devs, limit, now_ms, matching)

    def tasks(self) -> Iterator[QueuedTask]:
        """Every head task, in no particular order."""
        for b in self.buckets:
            yield from b.heads

    def tasks_by_seq(self) -> Iterator[QueuedTask]:
        """Every head task, oldest first (a merge of the buckets, each already oldest first)."""
        return heapq.merge(*(b.heads for b in self.buckets), key=lambda t: t.seq)

    def greedy(
        self,
        order: Iterable[QueuedTask],
        device_key: Callable[[IdleDevice], Any],
    ) -> list[Pair]:
        """Walk tasks in ``order``; give each the matching, still unused device with the
        smallest ``(device_key, device_id)``. Tasks with no device left are skipped (never
        block others). Stops at ``limit`` pairs. Devices are grouped by class (driver type and
        tags); each class is ordered once (only its ``limit`` best can ever be used), so the
        cost is devices + tasks x matching classes."""
        ranked: dict[tuple[str, frozenset[str]], list[tuple[Any, str]]] = {}
        for d in self.devices:
            ranked.setdefault(d.device_class, []).append((device_key(d), d.device_id))
        for key, devs in ranked.items():
            ranked[key] = (
                heapq.nsmallest(self.limit, devs) if len(devs) > 4 * self.limit else sorted(devs)
            )
        pos = dict.fromkeys(ranked, 0)
        by_sig = {b.sig: b for b in self.buckets}
        by_id = {d.device_id: d for d in self.devices}
        sig_classes: dict[str, list[tuple[str, frozenset[str]]]] = {}
        used: set[str] = set()
        pairs: list[Pair] = []
        for task in order:
            if len(pairs) >= self.limit:
                break
            cands = sig_classes.get(task.sig)
            if cands is None:
                bucket = by_sig.get(task.sig)
                cands = [] if bucket is None else [c for c in ranked if _class_accepts(bucket, c)]
                sig_classes[task.sig] = cands
            best_item: tuple[Any, str] | None = None
            if task.avoid_devices or task.avoid_hosts:
                # anti-affinity: the best device by (avoid rank, key); a rare, slower path
                best_rank = 3
                for c in cands:
                    for item in ranked[c][pos[c] :]:
                        if item[1] in used:
                            continue
                        rank = task.avoid_rank(by_id[item[1]])
                        if rank < best_rank or (
                            rank == best_rank and best_item and item < best_item
                        ):
                            best_rank, best_item = rank, item
            else:
                for c in cands:
                    i = pos[c]
                    while i < len(ranked[c]) and ranked[c][i][1] in used:
                        i += 1
                    pos[c] = i
                    if i < len(ranked[c]) and (best_item is None or ranked[c][i] < best_item):
                        best_item = ranked[c][i]
            if best_item is None:
                continue
            used.add(best_item[1])
            pairs.append((task.task_id, best_item[1]))
        return pairs


_by_id = attrgetter("device_id")


MAX_PRIORITY = 9


def aged(priority: int, submitted_at: int, now_ms: int, aging_ms: int) -> int:
    """``priority`` raised one level per ``aging_ms`` waited since ``submitted_at``, at most
    9 (``aging_ms`` 0: no aging)."""
    if aging_ms <= 0 or submitted_at <= 0 or priority >= MAX_PRIORITY:
        return priority
    return min(MAX_PRIORITY, priority + max(0, now_ms - submitted_at) // aging_ms)


def _class_accepts(bucket: Bucket, key: tuple[str, frozenset[str]]) -> bool:
    return satisfies(bucket.driver_type, bucket.tags, key[0], key[1])


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


# -- built-in strategies ---------------------------------------------------------------------
@register_strategy("fifo_match")
class FifoMatch:
    """Oldest queued task that has a matching idle device first; the matching device with the
    smallest ``device_id`` (string order)."""

    name = "fifo_match"

    def propose(self, snapshot: Snapshot) -> list[Pair]:
        return snapshot.greedy(snapshot.tasks_by_seq(), device_key=lambda d: d.device_id)


@register_strategy("priority_match")
class PriorityMatch:
    """Highest effective priority (9..0: ``priority`` raised by aging, see the pool setting
    ``aging_seconds``) first, oldest first within a priority; the matching device with the
    smallest ``device_id``."""

    name = "priority_match"

    def propose(self, snapshot: Snapshot) -> list[Pair]:
        order = sorted(snapshot.tasks(), key=lambda t: (-t.aged_priority, t.seq))
        return snapshot.greedy(order, device_key=lambda d: d.device_id)


@register_strategy("lru_device")
class LeastRecentlyUsedDevice:
    """Oldest task first; the matching device idle the longest (spreads load over devices)."""

    name = "lru_device"

    def propose(self, snapshot: Snapshot) -> list[Pair]:
        return snapshot.greedy(
            snapshot.tasks_by_seq(), device_key=lambda d: (d.idle_since, d.device_id)
        )


@register_strategy("fair_share")
class FairShare:
    """Tenants share contended devices in proportion to their weights (pool setting per
    tenant: `PoolAdmin.set_tenant`, ``deviceq tenant set``), on top of priority and aging.

    A pass hands out devices one at a time: to the next task (highest effective priority,
    then oldest) of the tenant whose tasks hold the fewest devices per unit of weight
    (``held / weight``, counting what this pass already gave it), so, like deficit round
    robin, a tenant of weight 3 ends up holding three devices for every one a tenant of
    weight 1 holds while both have work waiting. A higher effective priority still goes
    first across tenants. A tenant at its ``max_devices`` cap gets nothing more (the commit
    enforces the cap too: ``tenant_cap``). Tasks without a tenant form one tenant of weight 1.
    A task with no free matching device is skipped and never blocks its tenant's others.
    Device choice as in ``fifo_match`` (smallest ``device_id``), preferring devices and hosts
    a retry has not failed on."""

    name = "fair_share"
    uses_tenants = True  # the snapshot reads the tenants' weights, caps and held devices

    def propose(self, snapshot: Snapshot) -> list[Pair]:
        none = TenantShare()
        queues: dict[str, list[QueuedTask]] = {}
        for t in snapshot.tasks():
            queues.setdefault(t.tenant or "", []).append(t)
        for q in queues.values():  # best last: popped from the end
            q.sort(key=lambda t: (t.aged_priority, -t.seq))
        held = {n: snapshot.tenants.get(n, none).held for n in queues}
        heap: list[tuple[int, float, int, str]] = []

        def push(name: str) -> None:
            share = snapshot.tenants.get(name, none)
            if not queues[name] or (share.max_devices and held[name] >= share.max_devices):
                return
            t = queues[name][-1]
            heapq.heappush(heap, (-t.aged_priority, held[name] / max(1, share.weight), t.seq, name))

        for name in queues:
            push(name)
        used: set[str] = set()
        pos: dict[int, int] = {}
        pairs: list[Pair] = []
        while heap and len(pairs) < snapshot.limit:
            name = heapq.heappop(heap)[3]
            task = queues[name].pop()
            device = self._device(snapshot, task, used, pos)
            if device is not None:
                used.add(device)
                pairs.append((task.task_id, device))
                held[name] += 1
            push(name)
        return pairs

    @staticmethod
    def _device(
        snap: Snapshot, task: QueuedTask, used: set[str], pos: dict[int, int]
    ) -> str | None:
        """The unused matching device with the smallest id (the best anti-affinity rank
        first for a retry). ``pos`` is kept per matching list (buckets of one device class
        share theirs), so the used devices at its front are skipped once, not per bucket."""
        devs = snap.matching.get(task.sig, [])
        if task.avoid_devices or task.avoid_hosts:
            free = [d for d in devs if d.device_id not in used]
            best = min(free, key=lambda d: (task.avoid_rank(d), d.device_id), default=None)
            return None if best is None else best.device_id
        i = pos.get(id(devs), 0)
        while i < len(devs) and devs[i].device_id in used:
            i += 1
        pos[id(devs)] = i
        return devs[i].device_id if i < len(devs) else None
