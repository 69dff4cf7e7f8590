"""The constraint filter: a device class serves a requirement when the one rule says so
(`deviceq.core.models.satisfies`: no driver type asked or the same one, and every tag). It
says why it rejects a class: ``driver_type_mismatch``, else ``missing_tag:TAG`` per tag the
class lacks (sorted)."""

from __future__ import annotations

from dataclasses import dataclass

from ....core.models import satisfies
from ..plugins import Requirement
from ..view import DeviceClass

DRIVER_TYPE_MISMATCH = "driver_type_mismatch"
MISSING_TAG = "missing_tag:"
"""The prefix of a missing tag's reason (``missing_tag:gpu``)."""


@dataclass(frozen=True)
class Match:
    name: str = "match"
    needs: frozenset[str] = frozenset()

    def feasible(self, need: Requirement, device_class: DeviceClass) -> bool:
        return satisfies(need.driver_type, need.tags, device_class[0], device_class[1])

    def why(self, need: Requirement, device_class: DeviceClass) -> tuple[str, ...]:
        """Why the class does not serve ``need`` (empty when it does)."""
        if need.driver_type and need.driver_type != device_class[0]:
            return (DRIVER_TYPE_MISMATCH,)
        return tuple(MISSING_TAG + t for t in sorted(need.tags - device_class[1]))
