"""What a pass did and why, recorded (after Nomad's ``AllocMetric``): per task, which device
classes each filter rejected and why (with the devices of those classes), the device it was
given with that device's score keys, or the permit that denied it.

A `Recorder` is handed to `deviceq.scheduler.placement.pipeline.place`; without one the pass records
nothing and runs as it always does. `judge` is the filter stage alone over any devices (the
pass's own record of a task's requirement is made by it): ``explain`` judges every
registered device with it, so what it says of driver types and tags is what the filters
decide.

Reasons: a filter rejecting a class names why when it can (`ExplainingFilter.why`: the
built-in `Match` says ``driver_type_mismatch`` or one ``missing_tag:TAG`` per tag the class
lacks); a filter without ``why`` is named by its ``name``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .plugins import Filter, Requirement
from .rows import IdleDevice
from .view import DeviceClass

OUTCOMES = ("placed", "no_feasible_class", "exhausted", "denied")
"""What became of a task the pass offered a device to: placed; no device class passed the
filters; every feasible device was used (or outside the window); a permit denied the device.
A watched task the pass never reached (the pair limit) has no record (`Recorder.outcome`
says ``not_reached``)."""


@dataclass(frozen=True)
class Need:
    """A requirement (`Requirement`): a driver type (None: any) and the tags asked for."""

    driver_type: str | None
    tags: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Rejection:
    """One device class a filter rejected: the filter's name, its reasons, the devices."""

    filter: str
    reasons: tuple[str, ...]
    device_class: DeviceClass
    devices: tuple[str, ...]


@dataclass(frozen=True)
class FilterRecord:
    """The filter stage for one requirement over some devices: the feasible classes and their
    devices, and every rejected class (by the first filter that rejected it, in profile
    order)."""

    feasible: tuple[DeviceClass, ...] = ()
    feasible_devices: tuple[str, ...] = ()
    rejected: tuple[Rejection, ...] = ()

    def reasons(self) -> Counter[str]:
        """Devices rejected per reason (a device lacking two tags counts under both)."""
        out: Counter[str] = Counter()
        for r in self.rejected:
            for why in r.reasons:
                out[why] += len(r.devices)
        return out

    def by_filter(self) -> Counter[str]:
        """Devices rejected per filter name."""
        out: Counter[str] = Counter()
        for r in self.rejected:
            out[r.filter] += len(r.devices)
        return out

    def devices_with(self, reason: str) -> frozenset[str]:
        """The devices rejected with ``reason`` among their reasons."""
        return frozenset(d for r in self.rejected if reason in r.reasons for d in r.devices)


def rejects(f: Filter, need: Requirement, c: DeviceClass) -> tuple[str, ...] | None:
    """None when filter ``f`` accepts class ``c`` for ``need`` (its ``feasible``, the very call
    a pass makes), else why: its ``why`` when it has one (and it names a reason), else its
    name."""
    if f.feasible(need, c):
        return None
    why = getattr(f, "why", None)
    got = tuple(why(need, c)) if why is not None else ()
    return got or (f.name,)


def judge(
    filters: Sequence[Filter], need: Requirement, devices: Iterable[IdleDevice]
) -> FilterRecord:
    """The filter stage for ``need`` over ``devices``, recorded: each class asked once, as a
    pass asks (a class passes when every filter accepts it)."""
    by_class: dict[DeviceClass, list[str]] = {}
    for d in devices:
        by_class.setdefault((d.driver_type, d.tags), []).append(d.device_id)
    feasible: list[DeviceClass] = []
    ids: list[str] = []
    rejected: list[Rejection] = []
    for c, members in by_class.items():
        for f in filters:
            why = rejects(f, need, c)
            if why is not None:
                rejected.append(Rejection(f.name, why, c, tuple(members)))
                break
        else:
            feasible.append(c)
            ids += members
    return FilterRecord(tuple(feasible), tuple(sorted(ids)), tuple(rejected))


@dataclass
class TaskRecord:
    """What one pass did with one task: its filter record (over the pass's devices), its
    `OUTCOMES` word, the device it got (after refine) with that device's keys by score name
    (``scores``; ``refine``: the refine keys, when the profile refines), the permit that
    denied it, the device refine moved it from."""

    task_id: str
    filters: FilterRecord
    outcome: str = "placed"
    device_id: str | None = None
    scores: dict[str, int] = field(default_factory=dict)
    refine: dict[str, int] = field(default_factory=dict)
    denied_by: str | None = None
    refined_from: str | None = None


class Recorder:
    """Collects `TaskRecord`s during a pass: of the tasks in ``watch`` (every task when None).
    ``offered``: how many tasks the pass offered a device to."""

    def __init__(self, watch: Iterable[str] | None = None) -> None:
        self.watch = None if watch is None else frozenset(watch)
        self.tasks: dict[str, TaskRecord] = {}
        self.offered = 0

    def wants(self, task_id: str) -> bool:
        return self.watch is None or task_id in self.watch

    def outcome(self, task_id: str) -> str:
        """The task's `OUTCOMES` word, or ``not_reached`` when the pass did not offer it."""
        got = self.tasks.get(task_id)
        return "not_reached" if got is None else got.outcome
