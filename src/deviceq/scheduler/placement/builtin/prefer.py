"""The pool's ``prefer`` setting as a device score, in every strategy: ``max:ATTRIBUTE`` (the
device with the highest value first: ``max:battery``), ``min:ATTRIBUTE`` (the lowest first:
``min:temperature``), ``least_used`` (the fewest runs in the last 24 h first, from the device's
recent attempts), ``none``. A device without the attribute comes after those with it. A
score, after the constraints: it orders the devices a task may take, never adds one."""

from __future__ import annotations

from ....core.attributes import Value, Version
from ..rows import IdleDevice
from ..view import View


def _sort_key(v: Value) -> tuple[int, float | tuple[int, ...] | str]:
    if isinstance(v, bool):
        return (0, float(v))
    if isinstance(v, int | float):
        return (0, float(v))
    if isinstance(v, Version):
        return (1, v.parts)
    return (2, v)


class Prefer:
    name = "prefer"
    needs: frozenset[str] = frozenset()  # (view.prefer and its inputs: `inputs.ALWAYS_READ`)

    def __init__(self) -> None:
        self._view: View | None = None
        self._ranks: dict[str, int] = {}

    def device_key(self, view: View, device: IdleDevice) -> int:
        kind, key = view.prefer
        if kind == "least_used":
            return (view.runs or {}).get(device.device_id, 0)
        if kind not in ("max", "min"):
            return 0
        if self._view is not view:
            self._view, self._ranks = view, self._rank(view, kind, key)
        return self._ranks.get(device.device_id, len(self._ranks))

    @staticmethod
    def _rank(view: View, kind: str, key: str) -> dict[str, int]:
        """Device id -> its place by the attribute (0 best; equal values share a place)."""
        attrs = view.attributes or {}
        have = [(d.device_id, attrs[d.device_id][key]) for d in view.devices
                if key in attrs.get(d.device_id, {})]  # fmt: skip
        have.sort(key=lambda p: _sort_key(p[1]), reverse=kind == "max")
        ranks: dict[str, int] = {}
        place, last = -1, None
        for did, v in have:
            k = _sort_key(v)
            if k != last:
                place, last = place + 1, k
            ranks[did] = place
        return ranks
