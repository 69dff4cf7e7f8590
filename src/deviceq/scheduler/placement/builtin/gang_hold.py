"""The gang permit: a multi-device task whose every role has a device takes them all; one
that lacks some takes nothing, unless it has waited ``reserve_after_ms``: then it keeps the
devices picked for it (out of other tasks' reach) for at most ``hold_ms``, after which it lets
them go and may not keep any again for another ``reserve_after_ms``.

The hold state of each task lives across passes in ``holds`` (a dict the caller keeps and
hands to each pass's permit, built with that pass's settings)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..plugins import GangDecision
from ..rows import IdleDevice
from ..view import View


@dataclass
class HoldState:
    """One task's keeping of devices: since when (ms; None: it keeps none) and, after a hold
    ran out, the time before which it may not keep devices again."""

    hold_from: int | None = None
    no_hold_until: int = 0


@dataclass(frozen=True)
class ReserveThenHold:
    """Allow a complete pick; keep a partial one past ``reserve_after_ms`` of waiting, for at
    most ``hold_ms`` (0: never keep); deny otherwise."""

    reserve_after_ms: int
    hold_ms: int
    holds: dict[str, HoldState] = field(default_factory=dict)
    name: str = "reserve_then_hold"
    needs: frozenset[str] = frozenset()

    def permit(
        self,
        view: View,
        gang_id: str,
        picks: Sequence[tuple[str, IdleDevice | None]],
        waited_ms: int,
    ) -> GangDecision:
        if picks and all(d is not None for _, d in picks):
            return GangDecision.ALLOW
        if self.hold_ms <= 0 or waited_ms < self.reserve_after_ms:
            return GangDecision.DENY
        if not any(d is not None for _, d in picks):
            return GangDecision.DENY
        now = view.now_ms
        h = self.holds.setdefault(gang_id, HoldState())
        if now < h.no_hold_until:
            return GangDecision.DENY
        if h.hold_from is None:
            h.hold_from = now
        if now - h.hold_from < self.hold_ms:
            return GangDecision.WAIT
        # kept long enough: let go, and not again before reserve_after has passed
        h.hold_from, h.no_hold_until = None, now + self.reserve_after_ms
        return GangDecision.DENY

    def until(self, gang_id: str) -> int:
        """When the devices ``gang_id`` keeps now are let go (ms; 0 when it keeps none)."""
        h = self.holds.get(gang_id)
        return 0 if h is None or h.hold_from is None else h.hold_from + self.hold_ms
