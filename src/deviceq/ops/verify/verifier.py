"""The entry points: `PoolVerifier.verify` runs one pass (read, every check), a second one to
confirm what the first found, and `verify` makes the connection for it."""

from __future__ import annotations

from collections import Counter
from typing import Any

import redis

from ...core.connection import PoolConnection
from ...core.errors import InvalidInput, NotFound
from .devices import check_bookings, check_devices, check_idle, check_idle_classes
from .history import History
from .leases import check_leases, check_limits, check_reservations
from .model import DEFAULT_BATCH, MAX_BATCH, MIN_BATCH, STATUSES, PoolState
from .preemption import check_preemption
from .provenance import check_attempt_ends, check_attempt_hosts
from .queues import check_buckets
from .reader import Reader, read_state
from .results import Findings, Progress, VerifyResult, Violation
from .tasks import (
    check_attempts,
    check_status_indexes,
    check_task_entries,
    check_task_hosts,
    orphans,
)


class PoolVerifier(PoolConnection):
    """Audits one pool (read-only); see `deviceq.ops.verify` for what it checks."""

    def verify(
        self,
        *,
        batch: int = DEFAULT_BATCH,
        progress: Progress | None = None,
        confirm: bool = True,
    ) -> VerifyResult:
        """Read the pool and its event stream in bounded batches and report every violation
        of its invariants. With ``confirm``, a pass that finds violations is followed by a
        second one, and only what both find is reported (a transition that happened between
        two reads of a busy pool is counted in ``skipped["transient"]`` instead). Raises
        NotFound when the pool has no keys at all."""
        if not isinstance(batch, int) or not MIN_BATCH <= batch <= MAX_BATCH:
            raise InvalidInput(f"batch must be an integer {MIN_BATCH}-{MAX_BATCH}")
        if not self.redis.get_encoder().decode_responses:
            raise InvalidInput("verify needs a Redis client made with decode_responses=True")
        self.pin()  # on a cluster: SCAN the node that serves this pool
        first = self._pass(Reader(self, batch, progress))
        if first.ok or not confirm:
            return first
        return _confirmed(first, self._pass(Reader(self, batch, progress)))

    def _pass(self, rd: Reader) -> VerifyResult:
        """One read of the pool and every check on it."""
        end = rd.last_event_id()  # events up to here are older than every state read below
        st = read_state(rd)
        if st.space.total == 0:
            raise NotFound(f"pool {self.pool} has no keys ({self.keys.prefix}*): nothing to verify")
        f = Findings()
        _check_state(st, f)
        history = History(f)
        for eid, fields in rd.events(end):
            history.feed(eid, fields)
        history.check_against(st, rd)
        history.check_deadlines(st)
        _recheck_orphans(st, rd, f)
        for key, error in sorted(rd.errors.items()):
            f.add("wrong_type", error, key=key)
        return VerifyResult(
            pool=self.pool,
            violations=f.violations,
            checked={
                "keys": st.space.total,
                "tasks": len(st.tasks),
                "attempts": sum(len(t.records) for t in st.tasks.values()),
                "devices": len(st.devices),
                "hosts": len(st.space.hosts),
                "buckets": sum(1 for e in st.buckets.values() if e),
                "index_entries": st.index_entries(),
                "events": history.events,
                "passes": 1,
            },
            skipped=dict(sorted(f.skipped.items())),
        )


def _confirmed(first: VerifyResult, second: VerifyResult) -> VerifyResult:
    """The second pass's violations that the first found too (same kind and subjects)."""

    def ident(v: Violation) -> tuple[str | None, ...]:
        return (v.kind, v.task, v.device, v.host, v.key)

    before = {ident(v) for v in first.violations}
    after = {ident(v) for v in second.violations}
    skipped = Counter(second.skipped)
    skipped["transient"] += len(before ^ after)
    return VerifyResult(
        pool=second.pool,
        violations=[v for v in second.violations if ident(v) in before],
        checked={**second.checked, "passes": 2},
        skipped=dict(sorted(skipped.items())),
    )


def _check_state(st: PoolState, f: Findings) -> None:
    """Every check that needs the state alone."""
    check_status_indexes(st, f)
    for s in STATUSES:
        orphans(st, f, f"status:{s}", st.status[s])
    orphans(st, f, "leases", st.leases)
    check_leases(st, f)
    check_reservations(st, f)
    check_attempts(st, f)
    check_task_hosts(st, f)
    check_buckets(st, f)
    check_task_entries(st, f)
    check_devices(st, f)
    check_idle(st, f)
    check_idle_classes(st, f)
    check_bookings(st, f)
    check_limits(st, f)
    check_attempt_hosts(st, f)
    check_attempt_ends(st, f)
    check_preemption(st, f)


def _recheck_orphans(st: PoolState, rd: Reader, f: Findings) -> None:
    """Drop orphan reports whose task appeared after the scan (a busy pool)."""
    candidates = sorted({v.task for v in f.violations if v.kind == "orphan_index_entry" and v.task})
    back = rd.existing([rd.keys.task(tid) for tid in candidates])
    late = {tid for tid in candidates if rd.keys.task(tid) in back}
    if late:
        kept = [v for v in f.violations if not (v.kind == "orphan_index_entry" and v.task in late)]
        f.skip("changed_during_check", len(f.violations) - len(kept))
        f.violations[:] = kept


def verify(
    target: PoolConnection | redis.Redis | str | None = None,
    pool: str | None = None,
    *,
    batch: int = DEFAULT_BATCH,
    progress: Progress | None = None,
    confirm: bool = True,
) -> VerifyResult:
    """Check a pool's invariants; returns a `VerifyResult` (``.ok``, ``.violations``,
    ``.checked``, ``.skipped``).

    ``target`` is a `PoolConnection` (a `PoolAdmin`, `Client`, ...) or, like every client, a
    Redis client or URL with ``pool`` (both default to ``DEVICEQ_REDIS_URL`` and
    ``DEVICEQ_POOL``). Every read is bounded by ``batch`` (commands per round trip, entries per
    reply); ``progress(stage, done, total)`` is called as it reads. With ``confirm`` (the
    default) violations are reported only when a second pass finds them again. Raises
    NotFound for a pool without keys, ConfigError for a malformed URL."""
    options: dict[str, Any] = {"batch": batch, "progress": progress, "confirm": confirm}
    if isinstance(target, PoolConnection):
        if pool is not None and pool != target.pool:
            raise InvalidInput(f"pool {pool!r} given with a connection to pool {target.pool!r}")
        return PoolVerifier(target.redis, target.pool).verify(**options)
    own = not isinstance(target, redis.Redis)
    verifier = PoolVerifier(target, pool)
    try:
        return verifier.verify(**options)
    finally:
        if own:
            verifier.close()
