"""The constraint filter: a device class serves a requirement when the one rule says so
(`deviceq.core.models.satisfies`: no driver type asked or the same one, and every tag)."""

from __future__ import annotations

from dataclasses import dataclass

from ...core.models import satisfies
from ..plugins import Requirement
from ..view import DeviceClass


@dataclass(frozen=True)
class Match:
    name: str = "match"
    needs: frozenset[str] = frozenset()

    def feasible(self, need: Requirement, device_class: DeviceClass) -> bool:
        return satisfies(need.driver_type, need.tags, device_class[0], device_class[1])
