"""`AssignResult`: what one scheduler pass did (`TaskScheduler.assign` fills it, the daemon
loop logs and sums it)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class AssignResult:
    """What one pass did."""

    expired: dict[str, int] = field(default_factory=dict)
    signatures: int = 0
    buckets: int = 0
    heads: int = 0
    idle_devices: int = 0
    proposed: int = 0
    assigned: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    assignments: list[tuple[str, str, str]] = field(default_factory=list)
    fenced: bool = False
    more: bool = False
    duration_ms: float = 0.0
    retry_in_ms: int | None = None  # until the earliest retry backoff ends (None: none waits)
    gangs_assigned: int = 0  # multi-device tasks placed (all roles each; not in ``assigned``)
    gangs_waiting: int = 0  # multi-device tasks still queued among those read
    paused: bool = False  # the pool is paused (``deviceq pause``): no snapshot, no commit
    preempted: int = 0  # running tasks told to stop for urgent ones (`preemption`)
    preemptions: list[tuple[str, str, str]] = field(default_factory=list)  # urgent, victim, dev
    handed_over: int = 0  # devices given to the tasks that preempted their runs
    hinted: int = 0  # next-task hints written: busy devices' next tasks (`plan_ahead`)
    hint_wanted: int = 0  # devices whose hint a report used, taken from ``ahead:want``
    hints: list[tuple[str, str]] = field(default_factory=list)  # (task, device) hints written

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    @property
    def busy(self) -> bool:
        """True if this pass changed something (the daemon sums it into its INFO summary)."""
        return bool(
            self.assigned
            or self.gangs_assigned
            or self.preempted
            or self.handed_over
            or self.hinted
            or self.rejected
            or any(self.expired.values())
            or self.more
        )

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("assignments")
        d.pop("preemptions")
        d.pop("hints")
        return d

    def log_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "requeued": self.expired.get("requeued", 0),
            "expired_failed": self.expired.get("failed", 0),
            "expired_cancelled": self.expired.get("cancelled", 0),
            "unschedulable": self.expired.get("unschedulable", 0),
            "retried": self.expired.get("retried", 0),
            "signatures": self.signatures,
            "buckets": self.buckets,
            "heads": self.heads,
            "idle": self.idle_devices,
            "proposed": self.proposed,
            "assigned": self.assigned,
            "rejected": self.rejected_total,
            "ms": round(self.duration_ms, 2),
        }
        if self.gangs_assigned or self.gangs_waiting:
            fields["gangs_assigned"] = self.gangs_assigned
            fields["gangs_waiting"] = self.gangs_waiting
        if self.hinted or self.hint_wanted:
            fields["hinted"] = self.hinted
            fields["hint_wanted"] = self.hint_wanted
        if self.rejected:
            fields["reasons"] = ",".join(f"{k}:{v}" for k, v in sorted(self.rejected.items()))
        if self.fenced:
            fields["fenced"] = 1
        return fields
