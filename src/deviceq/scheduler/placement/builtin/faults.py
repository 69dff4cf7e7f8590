"""Faulty devices last: the fewer consecutive device faults (infrastructure, runner error,
timeout since the device's last success), the better."""

from __future__ import annotations

from dataclasses import dataclass

from ..rows import IdleDevice
from ..view import View


@dataclass(frozen=True)
class FaultCount:
    name: str = "faults"
    needs: frozenset[str] = frozenset({"faults"})

    def device_key(self, view: View, device: IdleDevice) -> int:
        return view.faults.get(device.device_id, 0) if view.faults else 0
