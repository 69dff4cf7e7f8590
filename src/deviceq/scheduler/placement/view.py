"""Immutable views of one pass's snapshot: what the placement plugins read.

A `View` holds the servable buckets (with their head tasks, oldest first), the assignable idle
devices (by ``device_id``), the pass's pair limit and time, and the optional inputs a plugin may
declare it needs (`INPUTS`): ``tenants`` (weights, caps and held devices), ``submit_times``
(for aging, with ``aging_ms``), ``avoid`` (the devices and hosts a task lost an attempt on),
``faults`` (a device's consecutive device faults), ``attributes`` (each device's, for
``--where``) and ``limits`` (each declared limit's bound and
the leases it counts now: `LimitLoad`, `deviceq.core.limits`). An input that was not read is
``None``; a profile's plugins name what they need, so a snapshot can read just the union of those.

The task, device, bucket and tenant rows are the scheduler's own dataclasses
(`deviceq.scheduler.strategies`): a view adds no copy of them, only the optional inputs as
read-only mappings beside them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType

from ...core.attributes import Value
from .rows import Bucket, IdleDevice, QueuedTask, Snapshot, TenantShare

INPUTS = frozenset({"tenants", "submit_times", "avoid", "faults", "limits", "attributes"})
"""The optional inputs of a view, by the names plugins declare in their ``needs``."""

DeviceClass = tuple[str, frozenset[str]]
"""What a device offers to a filter: its driver type and tags (`IdleDevice.device_class`)."""


@dataclass(frozen=True)
class Avoid:
    """A task's anti-affinity record: devices and hosts it lost an attempt on."""

    devices: frozenset[str] = frozenset()
    hosts: frozenset[str] = frozenset()


def _frozen(m: Mapping[str, object] | None) -> Mapping[str, object] | None:
    return None if m is None else MappingProxyType(dict(m))


@dataclass(frozen=True)
class LimitLoad:
    """One declared limit (`deviceq.core.limits.Limit`) in a pass: the bound on each count
    field (``bounds``, else ``bound``: a setting's, the same for every field) and the leases
    counted now per field (a field holding none may be missing)."""

    held: Mapping[str, int] = field(default_factory=dict)
    bound: int = 0
    bounds: Mapping[str, int] = field(default_factory=dict)

    def cap(self, key: str) -> int:
        """The bound on count field ``key`` (0 = none)."""
        return self.bounds.get(key, self.bound)


@dataclass(frozen=True)
class View:
    """One pass's inputs, read-only. ``devices`` are in ``device_id`` order and ``buckets``
    are those some device can serve, each with its heads oldest first (the contract of
    `Snapshot`)."""

    buckets: tuple[Bucket, ...]
    devices: tuple[IdleDevice, ...]
    limit: int
    now_ms: int = 0
    tenants: Mapping[str, TenantShare] | None = None
    submit_times: Mapping[str, int] | None = None
    aging_ms: int = 0
    avoid: Mapping[str, Avoid] | None = None
    faults: Mapping[str, int] | None = None
    limits: Mapping[str, LimitLoad] | None = None
    """Limit name -> its bound and counts when the snapshot was read
    (`deviceq.scheduler.limit_load.read_limits`); a limit with no bound set may be missing."""
    attributes: Mapping[str, Mapping[str, Value]] | None = None
    """Device id -> its attributes (read only when a bucket has --where clauses or the pool
    prefers by an attribute)."""
    prefer: tuple[str, str] = ("none", "")
    """The pool's ``prefer`` setting (`deviceq.core.attributes.parse_prefer`)."""
    runs: Mapping[str, int] | None = None
    """Device id -> its runs in the last 24 h (read only with ``prefer`` least_used)."""
    # ``devices`` grouped by class, each group in device_id order, when the reader has it
    # already (then ``devices`` must be in device_id order: they are not checked)
    classes: Mapping[DeviceClass, Sequence[IdleDevice]] | None = field(
        default=None, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        for name in INPUTS:
            object.__setattr__(self, name, _frozen(getattr(self, name)))
        if self.classes is not None:
            return
        ids = [d.device_id for d in self.devices]
        if ids != sorted(ids):
            object.__setattr__(self, "devices", tuple(sorted(self.devices, key=_device_id)))

    @property
    def inputs(self) -> frozenset[str]:
        """The optional inputs this view holds."""
        return frozenset(n for n in INPUTS if getattr(self, n) is not None)

    def tasks(self) -> Iterator[QueuedTask]:
        """Every head task, bucket by bucket (each bucket's oldest first)."""
        for b in self.buckets:
            yield from b.heads

    @cached_property
    def by_sig(self) -> Mapping[str, Bucket]:
        return MappingProxyType({b.sig: b for b in self.buckets})

    @classmethod
    def from_snapshot(
        cls,
        snap: Snapshot,
        *,
        submit_times: Mapping[str, int] | None = None,
        aging_ms: int = 0,
        limits: Mapping[str, LimitLoad] | None = None,
    ) -> View:
        """The view of a whole-pass `Snapshot`: its tenants, the anti-affinity records of its
        heads and its devices' fault counts are taken from it. Without ``submit_times`` the
        snapshot's priorities count as already aged (the reader sets a whole-pass
        strategy's effective priorities), so an aging plugin orders by them as they are. The
        limits' loads are not in a snapshot either: without ``limits`` no limit is set."""
        avoid = {
            t.task_id: Avoid(t.avoid_devices, t.avoid_hosts)
            for t in snap.tasks()
            if t.avoid_devices or t.avoid_hosts
        }
        faults = {d.device_id: d.faults for d in snap.devices if d.faults}
        return cls(
            tuple(snap.buckets),
            tuple(snap.devices),
            snap.limit,
            snap.now_ms,
            tenants=snap.tenants,
            submit_times={} if submit_times is None else submit_times,
            aging_ms=aging_ms if submit_times is not None else 0,
            avoid=avoid,
            faults=faults,
            limits=limits if limits is not None else {},
            attributes={},  # (a whole-pass strategy's pairs meet --where at the commit)
        )


def _device_id(d: IdleDevice) -> str:
    return d.device_id
