"""The rows of one pass's snapshot: a queued head task, an assignable idle device, a tenant's
share, a constraint bucket, and the `Snapshot` a whole-pass strategy's ``propose`` receives
(with its ``greedy`` helper). Pure data, no Redis: what the snapshot reader fills and the
placement plugins (and any registered strategy) read."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from ...core.models import Constraints, satisfies
from ...core.where import Clause

Pair = tuple[str, str]
"""A proposed ``(task_id, device_id)`` pair."""


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
    # a retry after a device-blamed failure: until this Redis time (ms) it takes none of the
    # devices it failed on (`RetryElsewhere`); 0 when it may (or the pool has no other match)
    avoid_until: int = 0

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
    pin: str | None = None  # its tasks run on this device only (and wait for it)
    where: tuple[Clause, ...] = ()  # --where clauses (per device: the where permit)

    def accepts(self, device: IdleDevice) -> bool:
        """True if a device satisfies this bucket's constraints (the one rule, `satisfies`)
        and, for a pinned bucket, is its device."""
        if self.pin is not None and device.device_id != self.pin:
            return False
        return satisfies(self.driver_type, self.tags, device.driver_type, device.tags)

    @property
    def constraints(self) -> Constraints:
        return Constraints(driver_type=self.driver_type, tags=tuple(sorted(self.tags)),
                           where=tuple(str(c) for c in self.where))  # fmt: skip


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
    # the devices grouped by class (driver type, tags), each group in device_id order (`build`)
    classes: dict[tuple[str, frozenset[str]], list[IdleDevice]] | None = None

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
            if b.pin is not None:  # (its own device only)
                got = [d for d in got if d.device_id == b.pin]
            matching[b.sig] = got
        return cls(list(buckets), devs, limit, now_ms, matching, classes=classes)

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
