"""What `verify` reports: the violation kinds (`KINDS`), a `Violation`, the `VerifyResult`, and
the `Findings` the checks add to while they run."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...core.limits import LIMITS

KINDS: dict[str, str] = {
    "device_two_leases": "two active tasks hold a lease on the same device",
    "reservation_mismatch": "a device's reserved_by/lease_id disagrees with the active task "
    "naming it (or names a task that holds no lease on it)",
    "task_two_leases": "a task with two live leases: in two active status indexes, two open "
    "attempts, an open attempt that is not its lease, or assigned while a lease was live",
    "terminal_twice": "two terminal events for one task in the event stream",
    "unclosed_attempt": "a task that is not active (terminal or queued) with an attempt record "
    "still 'active'",
    "superseded_report": "a terminal or released event whose lease is not the lease of the "
    "task's latest assignment",
    "attempt_missing": "the attempt history lacks an attempt: record count != attempt, an "
    "assigned lease without a record, or a live lease without an open record",
    "task_lost": "a task whose submission is in the stream, that never ended, is gone",
    "task_unindexed": "a task in no status index",
    "task_in_two_indexes": "a task in two status indexes",
    "status_index_mismatch": "a task indexed under another status than its hash names, or "
    "scored other than its submission seq",
    "orphan_index_entry": "an index entry whose task or device does not exist",
    "stale_index_entry": "an avoid or host inbox entry whose task is not in the state that "
    "index is for",
    "lease_entry_stale": "a leases entry for a task without a live lease, or scored other "
    "than its lease_expires_at",
    "lease_entry_missing": "an active task without a leases entry (its lease never expires)",
    "device_counts": "caps/drivers/qdrivers disagree with the registered devices",
    "queue_depth": "ZCARD status:queued differs from the sum of the queue buckets and the "
    "retries waiting out their backoff",
    "retry_index": "retries holds a task that is not queued, or that is also in a bucket",
    **{
        lim.counter: f"{lim.counter} disagrees with the leases it counts (the {lim.name} limit, "
        f"{lim.summary}, would be wrong)"
        for lim in LIMITS
    },
    "bucket_mismatch": "a queue bucket holds a task that is not queued in it, or a queued "
    "task is missing from its bucket",
    "queue_head": "the queues index disagrees with the buckets' heads",
    "bucket_constraints": "sig:SIG exists while its bucket is empty, or is missing while it is not",
    "idle_not_assignable": "an idle index entry that is reserved, quarantined, held, not idle, "
    "under or failing a health check, or not a registered device",
    "idle_classes": "the idle sets per device class (idle:c:CLASS) disagree with idle: a "
    "device missing from its class's set or in another's, or scored other than in idle",
    "lease_and_booking": "a device held by a task's lease and a person's reservation at once",
    "booking_index": "bookings disagrees with the devices' reservations: an entry for a device "
    "that is not reserved (or not registered), a reserved device without an entry, or an "
    "entry scored other than the reservation's end",
    "gang_partial": "a multi-device task holding only some of its devices: it is active while "
    "a part holds no lease (or holds one of another attempt), or a part holds a lease while "
    "the task is not active",
    "gang_index": "gangs holds a task that is not a queued multi-device task, or a queued "
    "multi-device task is neither in gangs nor waiting out a retry",
    "task_host_mismatch": "a task whose host_id is neither its device's host nor the host of "
    "its current attempt (its hash was rewritten to let another host report it)",
    "attempt_host_mismatch": "an attempt record naming a host other than its device's owner "
    "(the record was rewritten: a host making another host's task its own)",
    "attempt_end_unrecorded": "an ended attempt whose end is not in its device's history (or "
    "is there with another outcome): it was closed by a hand-written script, not by a report, "
    "a cancel or an expiry",
    "report_host_mismatch": "an event of a task's lease (claimed, done, failed, released...) "
    "naming a host other than the one its lease was assigned to (the task's host was "
    "rewritten before it was reported)",
    "preemptible_not_running": "preemptible (the running tasks a preemption may stop) holds "
    "a task that is not running",
    "preempt_hold_given_away": "a device held for the queued task that preempted its run is "
    "reserved by another task than the preempted one (the device moved on before the "
    "hand-over: invariant 7)",
    "wrong_type": "a key of the pool holds another Redis type than the layout says (it could "
    "not be read)",
}
CHECKS: tuple[str, ...] = (
    "one live lease per device, and each device's reservation agrees with the task holding it "
    "(design invariant 1)",
    "one live lease per task, held in one status index with one open attempt (2)",
    "a terminal state reached once, and no report of a superseded lease accepted, as far as "
    "the event stream reaches back (3)",
    "nothing lost: every task in its status index, every attempt recorded, a submitted task "
    "that never ended still exists (4)",
    "indexes and counters agree with what they count: queue buckets and heads, leases, "
    "deadlines, retries, idle sets, inboxes, bookings, caps/drivers, tenant_held, host_held",
    "a multi-device task holds all its devices or none",
    "a task and each attempt record name the host owning its device, and each event of a "
    "lease names the host it was assigned to (a task rewritten to be reported by another "
    "host)",
    "each ended attempt is in its device's history, as a transition script leaves it (an "
    "attempt closed by a hand-written script), while that history reaches back to it",
    "preemption: preemptible holds only running tasks, and a device held for the task that "
    "preempted its run is reserved by no other task meanwhile",
)
"""What `verify` checks, from the records Redis holds (``deviceq verify --scope``)."""

CANNOT_CHECK: tuple[str, ...] = (
    "who wrote a record: a user with direct Redis access (the producer and host ACL users "
    "included: Redis runs a script with its caller's rights) that repeats every write of a "
    "transition (a report's, device history included) leaves records identical to the "
    "real transition's; only the HTTP API confines producers and hosts",
    "what the stream no longer holds: events trimmed by event_maxlen, or a stream deleted "
    "or rewritten by a user that may write it, leave earlier transitions unjudged "
    "(skipped: history_trimmed)",
    "attempt ends older than a device's history (its last 20 ends; skipped: "
    "attempt_ends_past_device_history), or on a device removed and registered again since",
    "that a run really happened, or that a result is what the device produced: a host's "
    "report is taken as it comes (its token and session are checked when it is made)",
    "whether a device ran two things at once physically (invariant 7: the host daemon's "
    "runner locks, not Redis) or a preempted run stopped before its device moved on (11)",
    "where secrets can be read: ACL users and tokens are configured outside the pool (10)",
)
"""What `verify` cannot see from Redis, said so that its ``ok`` is not taken for more."""

Progress = Callable[[str, int, int | None], None]
"""``progress(stage, done, total)``: called as the verifier reads (total None: unknown)."""


@dataclass(frozen=True)
class Violation:
    """One broken invariant: its ``kind`` (a key of `KINDS`), what it concerns and why."""

    kind: str
    detail: str
    task: str | None = None
    device: str | None = None
    host: str | None = None
    key: str | None = None
    """The index or counter concerned, relative to the pool prefix (``status:done``)."""

    def as_dict(self) -> dict[str, str]:
        """``kind``, the subjects that are set, and ``detail``."""
        out = {"kind": self.kind}
        for name in ("task", "device", "host", "key"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        out["detail"] = self.detail
        return out

    def line(self) -> str:
        """One readable line: kind, subject, detail."""
        subject = " ".join(
            f"{name} {getattr(self, name)}"
            for name in ("task", "device", "host", "key")
            if getattr(self, name) is not None
        )
        return f"{self.kind}: {subject + ': ' if subject else ''}{self.detail}"


@dataclass
class VerifyResult:
    """What `verify` found: the violations, how much it checked and what it could not judge."""

    pool: str
    violations: list[Violation] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No violation found."""
        return not self.violations

    def kinds(self) -> set[str]:
        """The kinds of the violations found."""
        return {v.kind for v in self.violations}

    def as_dict(self) -> dict[str, Any]:
        """The JSON form: ``{pool, violations, checked, skipped}``."""
        return {
            "pool": self.pool,
            "violations": [v.as_dict() for v in self.violations],
            "checked": dict(self.checked),
            "skipped": dict(self.skipped),
        }


class Findings:
    """Collects violations and skip counts while the checks run."""

    def __init__(self) -> None:
        self.violations: list[Violation] = []
        self.skipped: Counter[str] = Counter()

    def add(self, kind: str, detail: str, **subjects: str | None) -> None:
        assert kind in KINDS, kind
        self.violations.append(Violation(kind, detail, **subjects))

    def skip(self, what: str, n: int = 1) -> None:
        self.skipped[what] += n
