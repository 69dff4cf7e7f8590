"""Least recently used device first: the one idle the longest (smallest idle-since time),
which spreads work over devices and hence hosts."""

from __future__ import annotations

from dataclasses import dataclass

from ..rows import IdleDevice
from ..view import View


@dataclass(frozen=True)
class LeastRecentlyUsed:
    name: str = "lru"
    needs: frozenset[str] = frozenset()

    def device_key(self, view: View, device: IdleDevice) -> int:
        return device.idle_since
