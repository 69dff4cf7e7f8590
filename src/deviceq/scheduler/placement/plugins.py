"""The kinds of placement plugins, as protocols. A pass runs them in stage order:

- `QueueSort`: the order tasks are offered in (`TaskOrder`: it may depend on what was placed
  so far, as fair share does);
- `Filter`: which device classes (driver type, tags) can serve a requirement at all (an
  `ExplainingFilter` also says why it rejects one);
- `Score` (`DeviceScore`, `TaskScore`): which feasible device is best, smallest key first;
  the scores of a profile are compared in order, then ``device_id``;
- `Permit`: whether a task may take the device it was given (per pass state, e.g. a tenant's
  or a host's cap);
- `GangPermit`: whether a multi-device task may take the devices its roles were given, all of
  them or none, or keep them while it waits for the rest (`deviceq.scheduler.placement.gang`).

Every plugin names the optional view inputs it reads in ``needs`` (a subset of
`view.INPUTS`), so a snapshot can read the union of a profile's needs and
nothing more. A filter judges a `Requirement`: a bucket or a gang's role (both are a driver
type and tags)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from enum import Enum
from typing import Protocol, runtime_checkable

from .rows import IdleDevice, QueuedTask
from .view import DeviceClass, View


class Plugin(Protocol):
    """What every plugin has: a name and the optional view inputs it reads."""

    @property
    def name(self) -> str: ...

    @property
    def needs(self) -> frozenset[str]: ...


class TaskOrder(Protocol):
    """One pass's task order. ``placed`` is called for every task given a device, before the
    next task is asked for."""

    def __iter__(self) -> Iterator[QueuedTask]: ...

    def placed(self, task: QueuedTask, device: IdleDevice) -> None: ...


class QueueSort(Plugin, Protocol):
    def order(self, view: View) -> TaskOrder: ...


class Requirement(Protocol):
    """What a task (a bucket's) or a gang's role asks of a device."""

    @property
    def driver_type(self) -> str | None: ...

    @property
    def tags(self) -> frozenset[str]: ...


class Filter(Plugin, Protocol):
    """Feasibility per device class: the pass asks once per (requirement, class), so a filter
    must depend on nothing else (per-device preferences are scores)."""

    def feasible(self, need: Requirement, device_class: DeviceClass) -> bool: ...


class ExplainingFilter(Filter, Protocol):
    """A filter that says why it rejects (for a `deviceq.scheduler.placement.recorder.Recorder` and
    ``explain``): ``why`` is asked only of a class ``feasible`` rejected, and names its
    reasons as short codes (``missing_tag:gpu``); a filter without it is recorded by name."""

    def why(self, need: Requirement, device_class: DeviceClass) -> tuple[str, ...]: ...


@runtime_checkable
class DeviceScore(Plugin, Protocol):
    """A key of the device alone (never negative; smaller is better, 0 is ideal): the pass
    ranks each device class by it once."""

    def device_key(self, view: View, device: IdleDevice) -> int: ...


@runtime_checkable
class TaskScore(Plugin, Protocol):
    """A key of a (task, device) pair (never negative; smaller is better, 0 is ideal: a scan
    stops at a device whose task keys are all 0). ``applies`` is False
    when the key is 0 for every device for this task: the pass then uses the classes' ranked
    order and never calls ``task_key`` for it."""

    def applies(self, view: View, task: QueuedTask) -> bool: ...

    def task_key(self, view: View, task: QueuedTask, device: IdleDevice) -> int: ...


Score = DeviceScore | TaskScore


class PassPermit(Protocol):
    """A permit's state for one pass. ``allows`` may depend on the task (a tenant's cap: the
    task gets nothing this pass) or on the device (a host's cap): a device no task may take
    any more is best named in ``closed`` (asked at the start and after every ``placed``), so
    the pass offers the next best device instead. ``refine`` moves a pair as ``unplaced`` from
    its device, then ``allows`` and ``placed`` on the new one (or the old one again)."""

    def allows(self, task: QueuedTask, device: IdleDevice) -> bool: ...

    def placed(self, task: QueuedTask, device: IdleDevice) -> None: ...

    def unplaced(self, task: QueuedTask, device: IdleDevice) -> None: ...

    def closed(self) -> Iterable[str]:
        """Device ids closed since the last call (no task may take them in this pass)."""
        ...


@runtime_checkable
class TaskClosingPermit(PassPermit, Protocol):
    """A pass permit whose answer depends on the task and the device together (a tenant's
    limit on one host): ``closed_for`` names the devices ``task`` may not take now, so the
    pass offers it its best device among the others instead of skipping it."""

    def closed_for(self, task: QueuedTask) -> Iterable[str]: ...


@runtime_checkable
class GangPassPermit(PassPermit, Protocol):
    """A pass permit that judges a multi-device task's devices together: ``devices`` has one
    entry per role (None for a role no device was found for yet, which still counts as a
    device the task will take). A pass permit without it is asked ``allows`` per device."""

    def allows_gang(self, task: QueuedTask, devices: Sequence[IdleDevice | None]) -> bool: ...


class Permit(Plugin, Protocol):
    """``start`` returns the permit's state for a pass over ``view``, or None when it allows
    every pair of that view (the pass then never asks it)."""

    def start(self, view: View) -> PassPermit | None: ...


class GangDecision(Enum):
    ALLOW = "allow"  # commit every role's device
    DENY = "deny"  # take nothing
    WAIT = "wait"  # keep the devices picked so far out of other tasks' reach, for now


class GangPermit(Plugin, Protocol):
    """Whether a multi-device task may take ``picks``: one (role name, device or None when
    no feasible device was left) per role, in role order; each role's device was filtered and
    scored by the same `Filter` and `Score` plugins as a single task's. ``waited_ms``: how long
    the task has been seen queued."""

    def permit(
        self,
        view: View,
        gang_id: str,
        picks: Sequence[tuple[str, IdleDevice | None]],
        waited_ms: int,
    ) -> GangDecision: ...
