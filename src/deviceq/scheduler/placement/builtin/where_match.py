"""``--where``: a task takes only a device whose attributes satisfy its bucket's clauses (the
one rule, `deviceq.core.where`; ``assign.lua`` checks it again with ``lua/lib/where.lua``).
A permit, not a filter: filters judge device classes (driver type, tags), and attributes
differ device by device. Per pass, the devices each bucket with clauses may not take are
worked out once (`closed_for`), so the pass offers the task its best device among the
others."""

from __future__ import annotations

from collections.abc import Iterable

from ....core.where import matches_all
from ..rows import IdleDevice, QueuedTask
from ..view import View

WHERE_MISMATCH = "where_mismatch"


class _Pass:
    def __init__(self, view: View) -> None:
        self.view = view
        self.attrs = view.attributes or {}
        self.closed_by_sig: dict[str, frozenset[str]] = {}

    def _closed(self, sig: str) -> frozenset[str]:
        closed = self.closed_by_sig.get(sig)
        if closed is None:
            b = self.view.by_sig.get(sig)
            if b is None or not b.where:
                closed = frozenset()
            else:
                attrs = self.attrs
                closed = frozenset(
                    d.device_id
                    for d in self.view.devices
                    if not matches_all(b.where, attrs.get(d.device_id, {}))
                )
            self.closed_by_sig[sig] = closed
        return closed

    def closed_for(self, task: QueuedTask) -> Iterable[str]:
        return self._closed(task.sig)

    def allows(self, task: QueuedTask, device: IdleDevice) -> bool:
        return device.device_id not in self._closed(task.sig)

    def placed(self, task: QueuedTask, device: IdleDevice) -> None:
        return None

    def unplaced(self, task: QueuedTask, device: IdleDevice) -> None:
        return None

    def closed(self) -> Iterable[str]:
        return ()


class WhereMatch:
    """The permit: None (no work) for a pass with no bucket that has clauses."""

    name = "where"
    # (its input, the view's ``attributes``, is read by every snapshot reader whenever a
    # servable bucket has clauses: `deviceq.scheduler.inputs.ALWAYS_READ`; a view without it
    # gives a bucket with clauses no device)
    needs: frozenset[str] = frozenset()

    def start(self, view: View) -> _Pass | None:
        if not any(b.where for b in view.buckets):
            return None
        return _Pass(view)
