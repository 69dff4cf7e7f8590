"""`verify`: audit one pool's Redis state and event stream against deviceq's invariants.

It reads, never writes, and every read is bounded: keys are found with ``SCAN`` over the
pool's own pattern (``COUNT batch``); hashes are read with pipelined ``HMGET`` of at most
``batch`` commands per round trip (the task hashes inside ``MULTI``/``EXEC``, so each task,
its attempt count and its attempt records are one snapshot); sorted sets and lists with
``ZCARD``/``LLEN`` and then ``ZRANGE``/``LRANGE`` windows packed so that one round trip asks
for at most ``batch`` entries; small hashes and sets with ``HSCAN``/``SSCAN``; the event stream
with ``XRANGE ... COUNT batch``. Nothing blocks and no single command is O(N) on a big key.

What is checked (each violation has a ``kind``, see `KINDS`):

- a device is reserved by at most one live lease, and a reservation agrees with the active
  task naming the device;
- a task holds at most one live lease (one status index, one open attempt, its open attempt
  is its lease, no assignment while a lease is live), reaches a terminal state once (two
  terminal events in the stream) and closes its attempt when it ends;
- a task names the host of its device or of its current attempt (``host_id`` decides whose
  token may report it);
- no report from a superseded lease was accepted: every terminal or ``released`` event carries
  the lease of the task's latest ``assigned`` event before it;
- the attempt history is whole: one record per attempt, one per ``assigned`` event;
- every task is in exactly the status index its hash names; every index entry (status, queue
  bucket, ``leases``, ``deadlines``, ``avoid``, host inboxes, ``devices``) has its task or
  device; a ``leases`` entry is a live lease with the task's expiry as its score, and every
  live lease has one; a task whose submission is in the stream and that never ended still
  exists;
- the counters agree with what they count: ``caps``/``drivers``/``qdrivers`` with the
  registered devices, each declared limit's count hash (``tenant_held``, ``host_held``, ...:
  `deviceq.core.limits`) with the leases under it, the queue depth with the buckets,
  ``queues`` with the buckets' heads, ``sig:SIG`` with the non-empty buckets, and the
  ``idle`` index holds only idle, unreserved, unquarantined, unheld, unbooked devices whose
  health check neither runs nor failed;
- a multi-device task holds all its devices or none (every part's lease while it is active,
  none otherwise), and ``gangs`` holds exactly the queued ones;
- a device is held by at most one lease *or* one person's reservation (``deviceq reserve``:
  the device fields ``booked_*``), never both, and ``bookings`` indexes exactly the reserved
  devices, scored by their reservation's end.

The event stream is capped (``event_maxlen``): history checks judge a task only from its
``submitted`` event on (a resubmitted id starts a new history); tasks whose submission was
trimmed away are counted in ``skipped["history_trimmed"]`` and not judged by the
history-only rules. Terminal tasks (and their index entries) past the ``retention`` window
are waiting for the expiry scan's trim and are counted in ``skipped["past_retention"]``.

The reads are not one snapshot of the whole pool: on a pool that is busy while it is checked,
a transition between two round trips can show as a violation. Entities missing from one read
are re-checked before they are reported, and a pass that finds violations is repeated: only
what both passes find is reported (a real violation stays, a race does not), the rest is
counted in ``skipped["transient"]``.

The package, by what each part checks: `tasks` (status indexes, attempts, a task's host, avoid
and inbox entries), `leases` (``leases``, one lease per device, the limits'
counts), `queues` (buckets, ``retries``, heads), `gangs` (multi-device tasks),
`devices` (counters, ``idle``, person's reservations), `history` (the event stream); `reader`
does the bounded reads into `model`'s shapes, `results` holds the kinds and what is reported,
`verifier` the entry points.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .model import (
    ACTIVE,
    ATTEMPTS_HEAD,
    DEFAULT_BATCH,
    DEVICE_FIELDS,
    MAX_BATCH,
    MIN_BATCH,
    STATUSES,
    TASK_FIELDS,
    TERMINAL,
)
from .results import KINDS, Progress, VerifyResult, Violation

if TYPE_CHECKING:
    from .verifier import PoolVerifier, verify


def __getattr__(name: str) -> Any:
    """`PoolVerifier` and `verify` are imported on first use: the command line reads this
    package's bounds (`model`) without the verifier's imports."""
    if name in ("PoolVerifier", "verify"):
        from . import verifier

        value = getattr(verifier, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ACTIVE",
    "ATTEMPTS_HEAD",
    "DEFAULT_BATCH",
    "DEVICE_FIELDS",
    "KINDS",
    "MAX_BATCH",
    "MIN_BATCH",
    "STATUSES",
    "TASK_FIELDS",
    "TERMINAL",
    "PoolVerifier",
    "Progress",
    "VerifyResult",
    "Violation",
    "verify",
]
