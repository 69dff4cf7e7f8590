"""``TaskScheduler``: matches queued tasks to idle devices with a named
``AssignmentStrategy``. One pass (``assign``):

1. **Expire** due leases, queue deadlines and retention with ``lua/expire.lua`` in bounded
   batches (at most ``expire_batch`` per call and only what fits in ``expire_budget_ms`` of
   Redis time, at most ``expire_rounds`` calls per pass).
2. **Snapshot**: a bounded read of idle devices, their hosts' health and the heads of the
   buckets they can serve (`snapshot.SnapshotReader`; never a queue scan).
3. **Plan**: a built-in strategy's placement profile chooses the pairs over a view of the
   snapshot (`deviceq.scheduler.placement`); a registered whole-pass strategy proposes them, invalid
   ones are dropped and anti-affinity is enforced (`plan`).
4. **Commit** the pairs in one call of ``lua/assign.lua`` (`client.SchedulerClient.commit`),
   which re-validates each pair and checks the leader's fencing epoch. A stale snapshot only
   costs rejected pairs (counted by reason), never a double booking.
5. **Hint** (only with ``plan_ahead=True``): choose the next task of the devices just made busy
   (and of those whose hint a report used) with a second plan of the same strategy, and write
   it on them with ``lua/plan_ahead.lua``: the report that frees such a device starts that task
   at once (`plan_ahead`). Idle devices are always served first, by steps 3 and 4.

``run`` is the highly available daemon loop (`daemon`); leadership is `leadership`."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence

import redis

from ..core import tracing
from ..core.connection import PoolConnection, record_strategy
from ..core.errors import ConfigError
from ..core.keys import Keys
from ..core.replies import parse
from .client import EXPIRE_KINDS, SchedulerClient
from .daemon import DEFAULT_TICK, Daemon, install_signal_handlers
from .gangs import GangPlanner
from .idle_classes import Base
from .inputs import with_wait
from .leadership import Leadership
from .pass_result import AssignResult
from .placement.pipeline import place
from .plan import plan
from .plan_ahead import AheadHints
from .preemption import Preemptor
from .snapshot import SnapshotReader
from .strategies import (
    DEFAULT_STRATEGY,
    AssignmentStrategy,
    Bucket,
    IdleDevice,
    Pair,
    ProfileStrategy,
    QueuedTask,
    Snapshot,
    get_strategy,
    orders_by_priority,
)

DEFAULT_BATCH = 200
EXPIRE_BUDGET_MS = 2.5  # Redis time per expiry call: it stops between items once spent
MAX_ROUNDS = 6  # head-reading rounds per pass (each reads 4x deeper where needed)

logger = logging.getLogger("deviceq.scheduler")


class TaskScheduler:
    """Matches queued tasks to idle devices with a named ``AssignmentStrategy``.

    >>> sched = TaskScheduler("redis://localhost:6379/0", "lab", strategy="fifo_match")
    >>> result = sched.assign()          # one pass
    >>> sched.run()                      # the daemon: leader election, wake-ups, expiry
    >>> TaskScheduler(url, "lab", plan_ahead=True)  # also hints each busy device's next task

    ``redis_or_url`` may also be any client of the pool (a ``PoolAdmin``, a
    ``SchedulerClient``): its connection is shared. An unknown strategy name raises
    ConfigError here, at construction (no fallback)."""

    def __init__(
        self,
        redis_or_url: redis.Redis | str | PoolConnection | None,
        pool: str | None = None,
        strategy: str | AssignmentStrategy = DEFAULT_STRATEGY,
        *,
        owner: str | None = None,
        batch: int = DEFAULT_BATCH,
        max_buckets: int = 10_000,
        expire_batch: int = 500,
        expire_rounds: int = 10,
        expire_budget_ms: float | None = EXPIRE_BUDGET_MS,
        device_refresh: float = 30.0,
        plan_ahead: bool = False,
    ) -> None:
        if isinstance(redis_or_url, PoolConnection):
            self.store = SchedulerClient(redis_or_url.redis, redis_or_url.pool)
        else:
            self.store = SchedulerClient(redis_or_url, pool)
        if batch < 1 or max_buckets < 1 or expire_batch < 1:
            raise ConfigError("batch, max_buckets and expire_batch must be >= 1")
        if expire_budget_ms is not None and not 0 < expire_budget_ms <= 10_000:
            raise ConfigError("expire_budget_ms must be > 0 and at most 10000 (or None)")
        if isinstance(strategy, str):
            self.strategy_name = strategy
            self.strategy: AssignmentStrategy = get_strategy(strategy)
        else:
            if not callable(getattr(strategy, "propose", None)):
                raise ConfigError(f"{strategy!r} is not an AssignmentStrategy")
            self.strategy = strategy
            self.strategy_name = str(getattr(strategy, "name", type(strategy).__name__))
        self.batch = batch
        self.expire_batch = expire_batch
        self.expire_rounds = max(1, expire_rounds)
        self.expire_budget_ms = expire_budget_ms
        # multi-device tasks go through the same profile (a whole-pass strategy: the default's)
        profile = self.strategy.profile if isinstance(self.strategy, ProfileStrategy) else None
        self.gangs = GangPlanner(self.store.redis, self.store.keys, profile)
        self.reader = SnapshotReader(
            self.store.redis,
            self.store.keys,
            self.strategy,
            batch=batch,
            max_buckets=max_buckets,
            device_refresh=device_refresh,
            scripts=self.store.scripts,
            also_needs=self.gangs.profile.needs,
            plan_ahead=plan_ahead,
        )
        # next-task hints: each busy device's next task, chosen ahead (`plan_ahead`); off: None
        self.hints: AheadHints | None = AheadHints() if plan_ahead else None
        # a new leadership reads every bucket's heads afresh (another leader worked meanwhile)
        self.leadership = Leadership(self.store, owner, on_elected=self._elected)
        self.preemptor = Preemptor(self.store)
        self._stop = threading.Event()
        self.passes = 0

    def _elected(self) -> None:
        self.reader.forget_all()
        self.gangs.forget_all()
        if self.hints is not None:
            self.hints.forget_all()
        try:  # (what `status` and a command setting a priority name as in force)
            record_strategy(
                self.redis, self.keys, self.strategy_name, orders_by_priority(self.strategy)
            )
        except redis.RedisError as exc:
            logger.warning("could not record the strategy in force: %s", exc)

    # -- accessors -------------------------------------------------------------------------------
    @property
    def redis(self) -> redis.Redis:
        return self.store.redis

    @property
    def keys(self) -> Keys:
        return self.store.keys

    @property
    def pool(self) -> str:
        return self.store.pool

    @property
    def owner(self) -> str:
        return self.leadership.owner

    @property
    def epoch(self) -> int | None:
        """The fencing token while this scheduler leads, else None."""
        return self.leadership.epoch

    @property
    def is_leader(self) -> bool:
        return self.leadership.leads

    # -- one pass --------------------------------------------------------------------------------
    def assign(self, fence: int | str | None = None, *, expire: bool = True) -> AssignResult:
        """One pass: expire, snapshot, plan, commit (and with plan_ahead on, hint). Returns
        counts; never raises for "no match" (tasks simply stay queued). ``expire=False``
        skips the expiry step (the daemon runs it on its tick, not on every wake-up).
        ``fence`` defaults to this scheduler's leader epoch when it leads, else none (an
        unfenced commit, like a manual dispatch: still fully validated). Raises Fenced if
        the fence is stale (another scheduler leads now)."""
        started = time.perf_counter()
        res = AssignResult()
        res.expired = self.expire() if expire else dict.fromkeys(EXPIRE_KINDS, 0)
        f = fence if fence is not None else (self.epoch if self.epoch is not None else "")
        base, want, heads = self.reader.read(unless_paused=True)
        if self.reader.paused:  # expiry and retries go on; nothing is placed
            res.paused = True
            res.duration_ms = (time.perf_counter() - started) * 1000
            return res
        res.retry_in_ms = self.reader.retry_in_ms
        read_idle = base.devices  # (before hand-overs and multi-device tasks take some)
        if base.shells and self.reader.handovers:  # (a task waiting for a hand-over is queued)
            # devices whose preempted runs have ended go to the tasks that preempted them first
            handed = self.preemptor.hand_over(f, self.reader.handovers)
            res.handed_over = len(handed)
            res.assignments.extend(handed)
            base = self.reader.without(base, {d for _, d, _ in handed})
        if self.reader.gang_ids or self.gangs.kept:
            # multi-device tasks first: what they take or keep is not offered to other tasks
            base = self.reader.without(base, self.assign_gangs(base.devices, base.now, f, res))
        buckets, pairs, dropped = self.plan_deep(base, want, heads)
        committed: dict[str, str] = {}  # device -> task committed by this plan
        res.signatures = base.signatures
        res.buckets = len(buckets)
        res.heads = sum(len(b.heads) for b in buckets)
        res.idle_devices = len(base.devices)
        res.proposed = len(pairs) + dropped
        if dropped:
            res.rejected["strategy_invalid"] = dropped
        if pairs:
            outcome = self.commit(pairs, f)
            reasons: Counter[str] = Counter()
            task_sig = {t.task_id: b.sig for b in buckets for t in b.heads}
            # their heads changed: read them again (a task of theirs may come back later with
            # the same seq, as a retry, with a record of where it failed)
            self.reader.forget_heads({task_sig[t] for t, _ in pairs})
            for (task_id, device_id), r in zip(pairs, map(parse, outcome), strict=True):
                if r.ok:
                    res.assignments.append((task_id, device_id, r.value))
                    committed[device_id] = task_id
                else:
                    reasons[r.value] += 1
                    if r.device_refusal:
                        self.reader.rejected(device_id)  # re-read its state next pass
            res.assigned = len(res.assignments)
            for k, v in reasons.items():
                res.rejected[k] = res.rejected.get(k, 0) + v
            # another pass at once if the batch was full, or if stale pairs were rejected while
            # others went through (progress is made each time, so this cannot spin)
            res.more = res.assigned >= self.batch or (bool(reasons) and res.assigned > 0)
        placed = {t for t, _, _ in res.assignments}
        taken = {d for _, d, _ in res.assignments}
        idle = [d for d in base.devices if d.device_id not in taken]
        res.preemptions = self.preemptor.decide(base.shells, idle, placed, f) if base.shells else []
        res.preempted = len(res.preemptions)
        if self.hints is not None:
            task_sig = {t.task_id: b.sig for b in buckets for t in b.heads}
            placed_sig = {t: task_sig.get(t) for t in placed}
            self.hint(base, read_idle, committed, placed_sig, f, res)
        res.more = res.more or bool(res.expired.get("more"))
        res.duration_ms = (time.perf_counter() - started) * 1000
        self.passes += 1
        return res

    def hint(
        self,
        base: Base,
        read_idle: list[IdleDevice],
        committed: dict[str, str],
        placed: dict[str, str | None],
        fence: int | str,
        res: AssignResult,
    ) -> None:
        """Next-task hints (`plan_ahead`): choose the next task of the busy devices to hint (the
        ``committed`` ones: device -> task, of ``base``; those whose hint a report used; those
        left without one earlier; those hinted a task this pass placed) with a plan of the
        strategy over a base of them alone, the tasks ``placed`` by this pass (task -> bucket)
        and those hinted to other devices left out, and write the pairs
        (``lua/plan_ahead.lua``). The other devices of ``read_idle`` (the pass's idle devices:
        left idle, handed over to a preempting task, taken or kept for a multi-device task)
        and the devices of the runs this pass preempts are not hinted. Nothing is read or
        written when no device is to be hinted."""
        assert self.hints is not None
        wanted = self.reader.take_ahead_wants()
        res.hint_wanted = len(wanted)
        self.hints.observe(read_idle)
        rows = [d for d in base.devices if d.device_id in committed]
        skip = {d.device_id for d in read_idle} - committed.keys()
        skip.update(dev for _, _, dev in res.preemptions)
        candidates = self.hints.candidates(rows, wanted, skip, placed)
        if not candidates:
            return
        exclude, extra = self.hints.excluded(placed)
        only = self.reader.only(base, candidates)
        want, heads = self.reader.hint_heads(only, extra)
        buckets, pairs, _ = self.plan_deep(only, want, heads, exclude)
        if pairs:
            res.hinted = self.store.plan_ahead(pairs, fence)
            res.hints = list(pairs)
        self.hints.wrote(pairs, candidates, {t.task_id: b.sig for b in buckets for t in b.heads})

    def assign_gangs(
        self, devices: list[IdleDevice], now: int, fence: int | str, res: AssignResult
    ) -> set[str]:
        """Place the waiting multi-device tasks that fit the idle ``devices`` now (one
        ``gang_assign`` call each, all roles or none) and keep devices for those waiting past
        ``gang_reserve_after`` (`gangs.GangPlanner`). Returns the devices taken or kept."""
        r = self.reader
        gp = self.gangs.plan(
            r.gang_ids, devices, now, r.gang_reserve_ms, r.gang_hold_ms, r.settings, r.aging_ms
        )
        for gid, devs in gp.place:
            out = parse(self.store.commit_gang(gid, devs, fence))
            if out.ok:
                res.gangs_assigned += 1
                continue
            res.rejected[out.value] = res.rejected.get(out.value, 0) + 1
            if out.device_refusal:
                for d in devs:
                    r.rejected(d)
        self.gangs.publish(gp.kept)
        res.gangs_waiting = len(r.gang_ids) - res.gangs_assigned
        return gp.used

    def expire(self) -> dict[str, int]:
        """Run the expiry script in bounded batches (at most ``expire_rounds`` calls, each
        stopped by ``expire_budget_ms`` of Redis time; None: by ``expire_batch`` only)."""
        self.reader.drop_prefetched()  # (a base read before the expiry may miss its changes)
        total: Counter[str] = Counter()
        more = 0
        for _ in range(self.expire_rounds):
            r = self.store.expire(self.expire_batch, self.expire_budget_ms)
            more = r.pop("more", 0)
            total.update(r)
            if not more:
                break
        out = {k: int(total.get(k, 0)) for k in EXPIRE_KINDS}
        out["more"] = int(more)
        # devices a cooldown gate held whose time is up take work again (deviceq gate)
        self.store.release_cooled()
        return out

    def snapshot(self) -> Snapshot:
        """Read the bounded snapshot the strategy plans on, with the initial number of heads
        per bucket (``assign`` may read deeper). It reads every device class, as a pass with a
        full batch queued would, even when nothing is queued."""
        base, want, heads = self.reader.read(every=True)
        return self.reader.make_snapshot(base, want, heads)

    def plan(self, snap: Snapshot) -> tuple[list[Pair], int]:
        """The strategy's valid pairs for ``snap`` (see `deviceq.scheduler.plan.plan`)."""
        return plan(self.strategy, snap, avoiding=bool(self.reader.avoiding))

    def plan_deep(
        self,
        base: Base,
        want: dict[str, int],
        heads: dict[str, tuple[QueuedTask, ...]],
        exclude: frozenset[str] | set[str] = frozenset(),
    ) -> tuple[Sequence[Bucket], list[Pair], int]:
        """`plan_pass`, reading deeper (at most ``MAX_ROUNDS`` rounds) where the plan used a
        bucket's heads up (`SnapshotReader.grow`). The tasks of ``exclude`` are left out of
        the heads (a bucket's heads read then count without them)."""
        for _ in range(MAX_ROUNDS):
            seen, used = heads, want
            if exclude:
                seen = {
                    s: tuple(t for t in h if t.task_id not in exclude) for s, h in heads.items()
                }
                used = {
                    s: n - len(heads.get(s, ())) + len(seen.get(s, ())) for s, n in want.items()
                }
            buckets, pairs, dropped = self.plan_pass(base, used, seen)
            grow = self.reader.grow(base, buckets, pairs, used)
            if not grow:
                break
            want.update({s: n + want[s] - used[s] for s, n in grow.items()})
            heads, _ = self.reader.read_heads(want, heads)
            heads = with_wait(self.reader, heads, base.now)
        return buckets, pairs, dropped

    def plan_pass(
        self, base: Base, want: dict[str, int], heads: dict[str, tuple[QueuedTask, ...]]
    ) -> tuple[Sequence[Bucket], list[Pair], int]:
        """This pass's buckets (with the heads read), pairs and pairs dropped: a profile's
        pipeline over the view its plugins need, or a whole-pass strategy's checked proposal."""
        if isinstance(self.strategy, ProfileStrategy):
            view = self.reader.make_view(base, heads)
            return view.buckets, place(self.strategy.profile, view), 0
        snap = self.reader.make_snapshot(base, want, heads)
        pairs, dropped = self.plan(snap)
        return snap.buckets, pairs, dropped

    def commit(self, pairs: list[Pair], fence: int | str = "") -> list[str]:
        """Commit pairs through ``lua/assign.lua``; per pair ``ok:LEASE`` or ``err:REASON``
        (traced: each assigned task's ``deviceq.queued`` and ``deviceq.assign`` spans)."""
        trace = tracing.current().assign(self.store.redis, self.store.keys, pairs)
        answers = self.store.commit(pairs, fence)
        trace.committed(answers)
        return answers

    # -- leadership ------------------------------------------------------------------------------
    def try_lead(self, ttl_ms: int | None = None) -> bool:
        """Acquire or renew the leader lease (see `Leadership.try_lead`)."""
        return self.leadership.try_lead(ttl_ms)

    def release(self) -> bool:
        """Step down if leading (a standby takes over at its next attempt)."""
        return self.leadership.release()

    def leader(self) -> tuple[str, int] | None:
        """The current leader's (owner, epoch), or None."""
        return self.store.leader()

    # -- daemon ----------------------------------------------------------------------------------
    def run(self, *, tick: float = DEFAULT_TICK, once: bool = False) -> int:
        """The daemon loop (see `deviceq.scheduler.daemon`). Returns the number of passes run.
        With ``once``: take the lease, run one pass, release it (no pass if another leads)."""
        return Daemon(self, tick, once).run()

    def wait_wake(self, timeout: float) -> bool:
        """Block on the wake list for at most ``timeout`` seconds, reading the next pass's
        base in the same round trip (`SnapshotReader.wait_and_read`). Returns True if
        woken."""
        return self.reader.wait_and_read(self.keys.sched_wake, timeout)

    def stop(self, wake: bool = False) -> None:
        """Ask ``run`` to stop after the current pass. From a signal handler call it with
        ``wake=False`` (the loop notices within a second); from another thread ``wake=True``
        also pushes the wake list so a blocked leader returns at once."""
        self._stop.set()
        if wake:
            try:
                pipe = self.redis.pipeline(transaction=False)
                pipe.lpush(self.keys.sched_wake, "1")
                pipe.ltrim(self.keys.sched_wake, 0, 0)
                pipe.execute()
            except redis.RedisError:
                pass

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the daemon between passes."""
        install_signal_handlers(self)
