"""The scheduler: ``TaskScheduler.assign()`` (one pass) and the highly available daemon loop.

One pass (``assign``):

1. **Expire** due leases and queue deadlines with ``lua/expire.lua`` in bounded batches
   (``expire_batch`` per call, at most ``expire_rounds`` calls per pass): stale-lease recovery.
2. **Snapshot** (bounded, a few pipelined round trips): the assignable idle devices (the
   ``idle`` zset, at most ``max_devices``; a device's hash is read only when it is new to this
   scheduler or re-entered the index, so that part costs O(devices freed since the last pass)),
   their hosts' heartbeat and drain flag, the non-empty constraint buckets (the ``queues``
   zset, at most ``max_buckets``), and for each bucket that some idle device can serve only a
   few head tasks: a fair share of ``batch`` (at least ``MIN_HEADS``), never more than its
   matching idle devices, read deeper (x4 per round) only where the strategy used up every head
   it was given (see ``_grow``); plus the strategy's optional ``lookahead``. Buckets that no
   idle device matches are not read at all. A pass therefore costs O(assignments + distinct
   signatures + idle devices), never O(queue length).
3. **Plan**: the configured ``AssignmentStrategy`` proposes pairs; pairs naming a task or
   device not in the snapshot, a device twice or a task twice, or a device that does not satisfy
   the task's constraints are dropped as ``strategy_invalid``.
4. **Commit** the pairs in one call of ``lua/assign.lua`` (``PoolAdmin.commit``), which
   re-validates each pair and, when the scheduler leads, checks its fencing epoch. A stale
   snapshot only costs rejected pairs (counted by reason), never a double booking.

The daemon (``run``): several schedulers may run on one pool. Each tries to take the leader
lease (``lua/leader.lua``, TTL = pool setting ``leader_ttl``); the leader renews it before every
pass, works, and otherwise blocks on ``BLPOP dq:{POOL}:sched:wake`` (pushed by submit, report,
heartbeat, undrain, requeue...) in slices of at most ``MAX_BLOCK`` seconds, running a pass when
woken or every ``tick`` seconds (expiry), and at once again after a pass that filled its batch.
Standbys do not touch the wake list; they sleep until the leader lease would lapse (polling at
most every ``tick`` seconds, capped to a third of ``leader_ttl``) and try again, so a standby
takes over right after a dead leader's lease lapses, i.e. within one ``leader_ttl``. A deposed
leader's commits are refused by the fence (``Fenced``: it steps down). SIGTERM stops the loop
between passes and releases the lease. Each pass logs one structured line with its counts
(INFO when it did something or with ``once``, DEBUG for an idle tick). All state is in Redis:
a restarted scheduler just continues.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import redis

from .errors import ConfigError, DeviceqError, Fenced
from .logs import log
from .pool import PoolAdmin
from .strategies import (
    DEFAULT_STRATEGY,
    AssignmentStrategy,
    Bucket,
    IdleDevice,
    Pair,
    QueuedTask,
    Snapshot,
    get_strategy,
)

logger = logging.getLogger("deviceq.scheduler")

DEFAULT_BATCH = 200
DEFAULT_TICK = 2.0
MAX_LOOKAHEAD = 1000  # cap of a strategy's optional ``lookahead`` (extra heads per bucket)
MAX_BLOCK = 1.0  # longest single BLPOP: bounds how long a stop request waits
MIN_HEADS = 8  # heads first read per servable bucket (at least)
MAX_ROUNDS = 6  # head-reading rounds per pass (each reads 4x deeper where needed)
DEVICE_REASONS = ("device_", "driver_type_mismatch", "missing_tag")
EXPIRE_KINDS = ("requeued", "failed", "cancelled", "unschedulable", "trimmed", "more")


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

    @property
    def rejected_total(self) -> int:
        return sum(self.rejected.values())

    @property
    def busy(self) -> bool:
        """True if this pass changed something (its log line is INFO, else DEBUG)."""
        return bool(self.assigned or self.rejected or any(self.expired.values()) or self.more)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("assignments")
        return d

    def log_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "requeued": self.expired.get("requeued", 0),
            "expired_failed": self.expired.get("failed", 0),
            "expired_cancelled": self.expired.get("cancelled", 0),
            "unschedulable": self.expired.get("unschedulable", 0),
            "signatures": self.signatures,
            "buckets": self.buckets,
            "heads": self.heads,
            "idle": self.idle_devices,
            "proposed": self.proposed,
            "assigned": self.assigned,
            "rejected": self.rejected_total,
            "ms": round(self.duration_ms, 2),
        }
        if self.rejected:
            fields["reasons"] = ",".join(f"{k}:{v}" for k, v in sorted(self.rejected.items()))
        if self.fenced:
            fields["fenced"] = 1
        return fields


@dataclass
class _Base:
    """The part of a snapshot read before any heads: devices, hosts, bucket constraints."""

    now: int
    shells: list[Bucket]
    devices: list[IdleDevice]
    matching: dict[str, list[IdleDevice]]
    signatures: int


def default_owner() -> str:
    """A scheduler identity unique per process: ``HOSTNAME-PID-RANDOM`` (id characters only)."""
    host = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname())
    return f"{host.strip('.-_') or 'sched'}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class TaskScheduler:
    """Matches queued tasks to idle devices with a named ``AssignmentStrategy``.

    >>> sched = TaskScheduler("redis://localhost:6379/0", "lab", strategy="fifo_match")
    >>> result = sched.assign()          # one pass
    >>> sched.run()                      # the daemon: leader election, wake-ups, expiry

    An unknown strategy name raises ConfigError here, at construction (no fallback)."""

    def __init__(
        self,
        redis_or_url: redis.Redis | str | PoolAdmin | None,
        pool: str | None = None,
        strategy: str | AssignmentStrategy = DEFAULT_STRATEGY,
        *,
        owner: str | None = None,
        batch: int = DEFAULT_BATCH,
        max_devices: int = 20_000,
        max_buckets: int = 10_000,
        expire_batch: int = 500,
        expire_rounds: int = 10,
        device_refresh: float = 30.0,
    ) -> None:
        if isinstance(redis_or_url, PoolAdmin):
            self.admin = redis_or_url
        else:
            self.admin = PoolAdmin(redis_or_url, pool)
        if batch < 1 or max_devices < 1 or max_buckets < 1 or expire_batch < 1:
            raise ConfigError("batch, max_devices, max_buckets and expire_batch must be >= 1")
        if isinstance(strategy, str):
            self.strategy_name = strategy
            self.strategy: AssignmentStrategy = get_strategy(strategy)
        else:
            if not callable(getattr(strategy, "propose", None)):
                raise ConfigError(f"{strategy!r} is not an AssignmentStrategy")
            self.strategy = strategy
            self.strategy_name = str(getattr(strategy, "name", type(strategy).__name__))
        self.owner = owner or default_owner()
        self.batch = batch
        self.max_devices = max_devices
        self.max_buckets = max_buckets
        self.expire_batch = expire_batch
        self.expire_rounds = max(1, expire_rounds)
        self.epoch: int | None = None  # fencing token while this scheduler leads
        self.device_refresh = device_refresh
        self._sig_cache: dict[str, tuple[str | None, frozenset[str], int]] = {}
        # device id -> (idle score as read, read at (monotonic), the device)
        self._dev_cache: dict[str, tuple[Any, float, IdleDevice]] = {}
        self._suspect: set[str] = set()
        self._avoiding = 0  # queued tasks with an anti-affinity record (``avoid`` hash)
        self._devgen: str | None = None  # the pool's ``devgen`` the device cache belongs to
        self._host_timeout_ms = 0
        self._stop = threading.Event()
        self.passes = 0

    # -- accessors -------------------------------------------------------------------------------
    @property
    def redis(self) -> redis.Redis:
        return self.admin.redis

    @property
    def keys(self) -> Any:
        return self.admin.keys

    @property
    def pool(self) -> str:
        return self.admin.pool

    @property
    def is_leader(self) -> bool:
        return self.epoch is not None

    # -- one pass --------------------------------------------------------------------------------
    def assign(self, fence: int | str | None = None, *, expire: bool = True) -> AssignResult:
        """One pass: expire, snapshot, plan, commit. Returns counts; never raises for "no match"
        (tasks simply stay queued). ``expire=False`` skips the expiry step (the daemon runs it
        on its tick, not on every wake-up). ``fence`` defaults to this scheduler's leader
        epoch when it leads, else none (an unfenced commit, like a manual dispatch: still
        fully validated). Raises Fenced if the fence is stale (another scheduler leads now)."""
        started = time.perf_counter()
        res = AssignResult()
        res.expired = self.expire() if expire else dict.fromkeys(EXPIRE_KINDS, 0)
        base, want, heads = self._read()
        for _ in range(MAX_ROUNDS):
            snap = self._make_snapshot(base, want, heads)
            pairs, dropped = self.plan(snap)
            grow = self._grow(base, snap, pairs, want)
            if not grow:
                break
            want.update(grow)
            heads, _ = self._read_heads(want, heads)
        res.signatures = snap.signatures
        res.buckets = len(snap.buckets)
        res.heads = sum(len(b.heads) for b in snap.buckets)
        res.idle_devices = len(snap.devices)
        res.proposed = len(pairs) + dropped
        if dropped:
            res.rejected["strategy_invalid"] = dropped
        if pairs:
            f = fence if fence is not None else (self.epoch if self.epoch is not None else "")
            outcome = self.commit(pairs, f)
            reasons: Counter[str] = Counter()
            for (task_id, device_id), r in zip(pairs, outcome, strict=True):
                if r.startswith("ok:"):
                    res.assignments.append((task_id, device_id, r[3:]))
                else:
                    why = r[4:] if r.startswith("err:") else r
                    reasons[why] += 1
                    if why.startswith(DEVICE_REASONS):
                        self._suspect.add(device_id)  # re-read its state next pass
            res.assigned = len(res.assignments)
            for k, v in reasons.items():
                res.rejected[k] = res.rejected.get(k, 0) + v
            # another pass at once if the batch was full, or if stale pairs were rejected while
            # others went through (progress is made each time, so this cannot spin)
            res.more = res.assigned >= self.batch or (bool(reasons) and res.assigned > 0)
        res.more = res.more or bool(res.expired.get("more"))
        res.duration_ms = (time.perf_counter() - started) * 1000
        self.passes += 1
        return res

    def expire(self) -> dict[str, int]:
        """Run the expiry script in bounded batches (at most ``expire_rounds`` calls)."""
        total: Counter[str] = Counter()
        more = 0
        for _ in range(self.expire_rounds):
            r = self.admin.expire(self.expire_batch)
            more = r.pop("more", 0)
            total.update(r)
            if not more:
                break
        out = {k: int(total.get(k, 0)) for k in EXPIRE_KINDS}
        out["more"] = int(more)
        return out

    def snapshot(self) -> Snapshot:
        """Read the bounded snapshot the strategy plans on (see the module docstring), with
        the initial number of heads per bucket (``assign`` may read deeper, see ``_grow``)."""
        base, want, heads = self._read()
        return self._make_snapshot(base, want, heads)

    def _read_base(self) -> tuple[_Base, list[str]]:
        """Idle devices (attributes cached, see ``_device_rows``) and the non-empty buckets'
        constraints: one pipelined round trip, plus one only when device or bucket
        attributes must be (re-)read. No queue scan. Returns the base (devices not yet
        filtered by host health, see ``_host_filter``) and the hosts of its devices."""
        k = self.keys
        pipe = self.redis.pipeline(transaction=False)
        pipe.time()
        pipe.hget(k.config, "host_timeout")
        pipe.get(k.devgen)
        # raw WITHSCORES (no ``withscores=`` option): skips redis-py's per-score re-encoding
        pipe.execute_command("ZRANGE", k.idle, 0, self.max_devices - 1, "WITHSCORES")
        pipe.execute_command("ZRANGE", k.queues, 0, self.max_buckets - 1, "WITHSCORES")
        pipe.hlen(k.avoid)
        (sec, usec), host_timeout_raw, devgen, idle_raw, queues_raw, avoiding = pipe.execute()
        self._avoiding = int(avoiding or 0)
        now = int(sec) * 1000 + int(usec) // 1000
        self._host_timeout_ms = int(float(host_timeout_raw or self._default_host_timeout()) * 1000)
        if devgen != self._devgen:  # a device registered, changed or was removed
            self._dev_cache.clear()
            self._devgen = devgen
        idle = _pairs(idle_raw)
        queues = _pairs(queues_raw)

        if len(self._sig_cache) > 2 * len(queues) + 1000:  # forget buckets that emptied
            live = {s for s, _ in queues}
            self._sig_cache = {s: v for s, v in self._sig_cache.items() if s in live}
        new_sigs = [s for s, _ in queues if s not in self._sig_cache]
        cached, sig_rows = self._device_rows(idle, [k.sig(s) for s in new_sigs])
        for s, (drv, tags, prio) in zip(new_sigs, sig_rows, strict=True):
            self._sig_cache[s] = (drv or None, _tagset(tags), int(prio or 0))
        shells = [Bucket(s, *self._sig_cache[s], head_seq=int(float(score))) for s, score in queues]
        pre = Snapshot.build(shells, cached, self.batch, now)
        hosts = sorted({d.host_id for d in pre.devices})
        return _Base(now, shells, pre.devices, pre.matching, len(queues)), hosts

    def _host_filter(self, base: _Base, hosts: list[str], rows: list[Any]) -> _Base:
        """Drop the devices of hosts that cannot take work (``rows``: HMGET last_heartbeat,
        draining, stopping, suspect per host, read together with the first heads). The rule is
        ``host_placeable`` in ``lua/_lib.lua``, which the commit applies again."""
        bad = set()
        for h, (hb, draining, stopping, suspect) in zip(hosts, rows, strict=True):
            hb_ms = int(hb or 0)
            if (
                draining == "1"
                or stopping == "1"
                or suspect
                or hb_ms <= 0
                or base.now - hb_ms > self._host_timeout_ms
            ):
                bad.add(h)
        if not bad:
            return base
        devices = [d for d in base.devices if d.host_id not in bad]
        pre = Snapshot.build(base.shells, devices, self.batch, base.now)
        return _Base(base.now, base.shells, pre.devices, pre.matching, base.signatures)

    def _device_rows(
        self, idle: list[Any], sig_keys: list[str]
    ) -> tuple[list[IdleDevice], list[Any]]:
        """The assignable idle devices with their static attributes (host, driver type, tags),
        and the rows of ``sig_keys`` (read in the same round trip).

        The ``idle`` zset is maintained by the scripts (a device is in it only while idle,
        unreserved and not quarantined; its score is the time it became idle), and the
        ``devgen`` counter is bumped whenever a device registers, changes its driver type or
        tags, or is removed (the whole cache is dropped then). So a device hash is read only
        when the device is new to this scheduler, after a ``devgen`` change, or when it was
        named in a rejected pair (then its state is checked too): in a steady pool no device
        row is read at all, whatever the number of devices freed since the last pass. As a
        safety net, entries older than ``device_refresh`` seconds are re-read too, at most
        ``max(64, batch)`` per pass."""
        k = self.keys
        mono = time.monotonic()
        cache = self._dev_cache
        fetch: list[str] = []
        stale: list[str] = []
        suspect = self._suspect
        for did, _ in idle:
            c = cache.get(did)
            if c is None or did in suspect:
                fetch.append(did)
            elif mono - c[1] > self.device_refresh:
                stale.append(did)
        fetch += stale[: max(64, self.batch)]
        scores = dict(idle)
        res: list[Any] = []
        if fetch or sig_keys:
            pipe = self.redis.pipeline(transaction=False)
            for did in fetch:
                pipe.hmget(
                    k.device(did), "host_id", "state", "reserved_by", "quarantined",
                    "driver_type", "tags",
                )  # fmt: skip
            for sk in sig_keys:
                pipe.hmget(sk, "driver_type", "tags", "priority")
            res = pipe.execute()
        for did, d in zip(fetch, res[: len(fetch)], strict=True):
            host_id, state, reserved, quarantined = d[0], d[1], d[2], d[3]
            if not host_id or state != "idle" or reserved or quarantined == "1":
                cache.pop(did, None)  # a stale idle entry: excluded, re-checked next pass
                suspect.add(did)
                continue
            suspect.discard(did)
            score = scores[did]
            dev = IdleDevice(did, host_id, d[4] or "", _tagset(d[5]), int(float(score)))
            cache[did] = (score, mono, dev)
        if len(cache) > 2 * len(idle) + 1000:  # forget devices that left the index
            for did in set(cache) - set(scores):
                del cache[did]
        devices: list[IdleDevice] = []
        for did, score in idle:
            c = cache.get(did)
            if c is None:
                continue
            if c[0] != score:  # re-entered the idle index: same attributes, new idle_since
                dev = c[2]
                dev = IdleDevice(did, dev.host_id, dev.driver_type, dev.tags, int(float(score)))
                cache[did] = (score, c[1], dev)
                devices.append(dev)
            else:
                devices.append(c[2])
        return devices, res[len(fetch) :]

    def _initial_want(self, base: _Base) -> dict[str, int]:
        """Heads to read per servable bucket: a fair share of the batch (at least
        ``MIN_HEADS``), never more than its matching idle devices; plus ``lookahead``."""
        servable = [b for b in base.shells if base.matching[b.sig]]
        if not servable:
            return {}
        share = max(MIN_HEADS, -(-2 * self.batch // len(servable)))
        extra = self._lookahead()
        return {b.sig: min(len(base.matching[b.sig]), self.batch, share) + extra for b in servable}

    def _cap(self, base: _Base, sig: str) -> int:
        return min(len(base.matching[sig]), self.batch) + self._lookahead()

    def _lookahead(self) -> int:
        return min(max(0, int(getattr(self.strategy, "lookahead", 0) or 0)), MAX_LOOKAHEAD)

    def _read_heads(
        self,
        want: dict[str, int],
        have: dict[str, tuple[QueuedTask, ...]],
        hosts: list[str] | None = None,
    ) -> tuple[dict[str, tuple[QueuedTask, ...]], list[Any]]:
        """Read each bucket's heads up to ``want`` (only the part not in ``have``); in the same
        round trip the health (last heartbeat, draining) of ``hosts``. Returns the heads and
        the host rows."""
        out = dict(have)
        todo = [(s, len(have.get(s, ())), n) for s, n in want.items() if n > len(have.get(s, ()))]
        hosts = hosts or []
        if not todo and not hosts:
            return out, []
        k = self.keys
        pipe = self.redis.pipeline(transaction=False)
        for h in hosts:
            pipe.hmget(k.host(h), "last_heartbeat", "draining", "stopping", "suspect")
        for s, start, n in todo:
            pipe.execute_command("ZRANGE", k.queue(s), start, n - 1, "WITHSCORES")
        res = pipe.execute()
        for (s, _, _), raw in zip(todo, res[len(hosts) :], strict=True):
            prio = self._sig_cache[s][2]
            got = _pairs(raw)
            if s in out:
                seen = {t.task_id for t in out[s]}
                got = [(t, seq) for t, seq in got if t not in seen]
            fresh = tuple(QueuedTask(t, int(float(seq)), s, prio) for t, seq in got)
            if self._avoiding:
                fresh = self._with_avoid(fresh)
            out[s] = out.get(s, ()) + fresh
        return out, res[: len(hosts)]

    def _with_avoid(self, heads: tuple[QueuedTask, ...]) -> tuple[QueuedTask, ...]:
        """Heads with their anti-affinity (devices and hosts they lost an attempt on), read
        from the ``avoid`` hash: one more round trip, only while some queued task has one."""
        if not heads:
            return heads
        rows = self.redis.hmget(self.keys.avoid, [t.task_id for t in heads])
        out = []
        for t, row in zip(heads, rows, strict=True):
            if row:
                devs, _, hosts = str(row).partition("|")
                t = replace(t, avoid_devices=_tagset(devs), avoid_hosts=_tagset(hosts))
            out.append(t)
        return tuple(out)

    def _read(self) -> tuple[_Base, dict[str, int], dict[str, tuple[QueuedTask, ...]]]:
        """The base, the initial head counts and the heads: two round trips (three when
        device or bucket attributes must be read). The heads are chosen before the hosts'
        health is known (read in the same round trip); devices of dead or draining hosts are
        dropped afterwards, so a few heads may be read for nothing, never too few."""
        base, hosts = self._read_base()
        want = self._initial_want(base)
        heads, rows = self._read_heads(want, {}, hosts)
        base = self._host_filter(base, hosts, rows)
        want = {s: n for s, n in want.items() if base.matching.get(s)}
        return base, want, heads

    def _make_snapshot(
        self, base: _Base, want: dict[str, int], heads: dict[str, tuple[QueuedTask, ...]]
    ) -> Snapshot:
        buckets = [
            Bucket(b.sig, b.driver_type, b.tags, b.priority, heads[b.sig], b.head_seq)
            for b in base.shells
            if heads.get(b.sig) and base.matching.get(b.sig)
        ]
        return Snapshot(
            buckets,
            base.devices,
            self.batch,
            base.now,
            {b.sig: base.matching[b.sig] for b in buckets},
            signatures=base.signatures,
        )

    def _grow(
        self, base: _Base, snap: Snapshot, pairs: list[Pair], want: dict[str, int]
    ) -> dict[str, int]:
        """Buckets the strategy used up: every head read was paired and the bucket may hold
        more, while a device that could serve it is unused or went to another bucket's task
        (which a deeper, maybe older, task of this bucket might deserve). Returns their new
        (larger) head counts; empty when the plan is final. For any policy that keeps
        submission order within a bucket, the final plan equals the plan on unbounded heads.
        With interleaved buckets a strategy rarely uses up a bucket, so this seldom reads
        more (a bucket whose heads are not all paired never grows)."""
        task_sig = {t.task_id: b.sig for b in snap.buckets for t in b.heads}
        dev_sig = {d: task_sig.get(t) for t, d in pairs}
        taken = Counter(task_sig.get(t) for t, _ in pairs)
        grow: dict[str, int] = {}
        for b in snap.buckets:
            n = want.get(b.sig, 0)
            if len(b.heads) < n or n >= self._cap(base, b.sig):
                continue  # bucket exhausted, or already read as deep as useful
            if taken[b.sig] < len(b.heads):
                continue  # some head left unpaired: deeper tasks would not be chosen either
            if any(dev_sig.get(d.device_id, "") != b.sig for d in snap.matching[b.sig]):
                grow[b.sig] = min(self._cap(base, b.sig), n * 4)
        return grow

    def plan(self, snap: Snapshot) -> tuple[list[Pair], int]:
        """Ask the strategy for pairs; keep the valid ones (at most ``batch``). Returns the
        pairs and the number dropped as invalid."""
        proposed = list(self.strategy.propose(snap)) if snap.buckets and snap.devices else []
        tasks = {t.task_id: b for b in snap.buckets for t in b.heads}
        devices = {d.device_id: d for d in snap.devices}
        used_t: set[str] = set()
        used_d: set[str] = set()
        pairs: list[Pair] = []
        dropped = 0
        for pair in proposed:
            try:
                task_id, device_id = pair
            except (TypeError, ValueError):
                dropped += 1
                continue
            b = tasks.get(task_id)
            d = devices.get(device_id)
            if (
                b is None
                or d is None
                or task_id in used_t
                or device_id in used_d
                or not b.accepts(d)
                or len(pairs) >= snap.limit
            ):
                dropped += 1
                continue
            used_t.add(task_id)
            used_d.add(device_id)
            pairs.append((task_id, device_id))
        if self._avoiding:
            pairs = self._respect_avoid(snap, pairs, used_d)
        return pairs, dropped

    @staticmethod
    def _respect_avoid(snap: Snapshot, pairs: list[Pair], used: set[str]) -> list[Pair]:
        """Anti-affinity for every strategy: a task paired with a device (or host) it lost an
        attempt on gets an unused matching device it has not failed on instead, when the
        snapshot has one (the same device only when nothing else matches)."""
        heads = {t.task_id: (b, t) for b in snap.buckets for t in b.heads}
        out: list[Pair] = []
        for task_id, device_id in pairs:
            b, t = heads[task_id]
            if t.avoid_devices or t.avoid_hosts:
                cur = next(d for d in snap.matching[b.sig] if d.device_id == device_id)
                rank = t.avoid_rank(cur)
                if rank:
                    better = min(
                        (d for d in snap.matching[b.sig] if d.device_id not in used),
                        key=t.avoid_rank,
                        default=None,
                    )
                    if better is not None and t.avoid_rank(better) < rank:
                        used.discard(device_id)
                        used.add(better.device_id)
                        device_id = better.device_id
            out.append((task_id, device_id))
        return out

    def commit(self, pairs: list[Pair], fence: int | str = "") -> list[str]:
        """Commit pairs through ``lua/assign.lua``; per pair ``ok:LEASE`` or ``err:REASON``."""
        return self.admin.commit(pairs, fence)

    def _default_host_timeout(self) -> float:
        from .config import PoolConfig

        return float(PoolConfig.model_fields["host_timeout"].default)

    # -- leadership ------------------------------------------------------------------------------
    def leader_ttl_ms(self) -> int:
        return max(100, int(self.admin.config().leader_ttl * 1000))

    def try_lead(self, ttl_ms: int | None = None) -> bool:
        """Acquire or renew the leader lease. Sets ``epoch`` (the fencing token) when this
        scheduler leads, clears it otherwise."""
        ttl = ttl_ms if ttl_ms is not None else self.leader_ttl_ms()
        res = self.admin._run("leader", [self.owner, ttl, "acquire"])
        epoch, leads = int(res[0]), int(res[1])
        if leads:
            if self.epoch != epoch:
                log(
                    logger,
                    logging.INFO,
                    "leader elected",
                    pool=self.pool,
                    owner=self.owner,
                    epoch=epoch,
                )
            self.epoch = epoch
            return True
        if self.epoch is not None:
            log(
                logger,
                logging.WARNING,
                "lost leadership",
                pool=self.pool,
                owner=self.owner,
                epoch=self.epoch,
                leader=res[2] if len(res) > 2 else None,
            )
        self.epoch = None
        return False

    def release(self) -> bool:
        """Step down if leading (a standby takes over at its next attempt)."""
        was = self.epoch is not None
        self.epoch = None
        try:
            return bool(int(self.admin._run("leader", [self.owner, 1, "release"]))) and was
        except redis.RedisError:
            return False

    def leader(self) -> tuple[str, int] | None:
        """The current leader's (owner, epoch), or None."""
        raw = self.redis.get(self.keys.leader)
        if not raw:
            return None
        owner, _, epoch = str(raw).rpartition(":")
        return owner, int(epoch)

    # -- daemon ----------------------------------------------------------------------------------
    def stop(self, wake: bool = False) -> None:
        """Ask ``run`` to stop after the current pass. From a signal handler call it with
        ``wake=False`` (the loop notices within ``MAX_BLOCK`` seconds); from another thread
        ``wake=True`` also pushes the wake list so a blocked leader returns at once."""
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

        def handler(signum: int, frame: Any) -> None:
            self.stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def run(self, *, tick: float = DEFAULT_TICK, once: bool = False) -> int:
        """The daemon loop (see the module docstring). Returns the number of passes run.
        With ``once``: take the lease, run one pass, release it (no pass if another leads).

        The leader runs a pass when woken (``sched:wake``), when ``tick`` seconds passed since
        the last one, or at once after a pass that filled its batch. It blocks on the wake list
        in slices of at most ``MAX_BLOCK`` seconds (and a third of ``leader_ttl``), renewing
        its lease in between, so a stop request is honoured within a slice."""
        if tick <= 0:
            raise ConfigError("tick must be positive")
        log(
            logger,
            logging.INFO,
            "scheduler starting",
            pool=self.pool,
            owner=self.owner,
            strategy=self.strategy_name,
            tick=tick,
        )
        passes = 0
        backoff = 0.1
        last_pass = float("-inf")
        last_expire = float("-inf")
        last_lead = float("-inf")
        ttl_ms = 0
        due = True
        try:
            while not self.stopping:
                try:
                    now = time.monotonic()
                    # renew the lease a few times per ttl, not before every pass: a lapsed
                    # lease only costs a fenced (refused) commit, never a double booking
                    if not self.is_leader or now - last_lead >= ttl_ms / 3000:
                        ttl_ms = self.leader_ttl_ms()
                        if not self.try_lead(ttl_ms):
                            if once:
                                cur = self.leader()
                                log(
                                    logger,
                                    logging.INFO,
                                    "standby: another scheduler leads",
                                    pool=self.pool,
                                    owner=self.owner,
                                    leader=cur[0] if cur else None,
                                )
                                return passes
                            self._standby_wait(ttl_ms, tick)
                            due = True  # on taking over, work at once
                            continue
                        last_lead = now
                    if due or now - last_pass >= tick:
                        # expiry runs on the tick (and while it has a backlog), not on every
                        # wake-up: a steady submit stream then costs no expiry round trips
                        expire = once or now - last_expire >= tick
                        res = self._pass(always_info=once, expire=expire)
                        passes += 1
                        last_pass = time.monotonic()
                        if expire:
                            last_expire = now if not res.expired.get("more") else float("-inf")
                        backoff = 0.1
                        if once:
                            return passes
                        if res.more and not res.fenced:
                            continue  # a full batch (or expiry backlog): go again now
                    left = tick - (time.monotonic() - last_pass)
                    wait = max(0.01, min(left, MAX_BLOCK, ttl_ms / 3000))
                    due = self._wait_wake(wait)
                except redis.AuthenticationError as exc:
                    # never transient by itself: a one-shot run fails, the daemon keeps trying
                    # (slowly) so that fixing the credentials or the ACL revives it
                    log(
                        logger,
                        logging.ERROR,
                        "redis refused the credentials",
                        pool=self.pool,
                        owner=self.owner,
                        error=str(exc),
                    )
                    self.epoch = None
                    if once:
                        raise
                    due = True
                    self._sleep(5.0)
                except (redis.ConnectionError, redis.TimeoutError) as exc:
                    log(
                        logger,
                        logging.WARNING,
                        "redis unreachable",
                        pool=self.pool,
                        owner=self.owner,
                        error=str(exc),
                        retry_in=round(backoff, 2),
                    )
                    self.epoch = None
                    due = True
                    self._sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
                except (redis.RedisError, DeviceqError) as exc:
                    # a refused script or command (a bad argument, a permission, a bug): the
                    # daemon logs it and goes on with the next pass, backing off
                    log(
                        logger,
                        logging.ERROR,
                        "pass failed",
                        pool=self.pool,
                        owner=self.owner,
                        error=f"{type(exc).__name__}: {exc}",
                        retry_in=round(backoff, 2),
                    )
                    due = True
                    if once:
                        raise
                    self._sleep(backoff)
                    backoff = min(backoff * 2, 5.0)
        finally:
            if self.epoch is not None:
                self.release()
            log(
                logger,
                logging.INFO,
                "scheduler stopped",
                pool=self.pool,
                owner=self.owner,
                passes=passes,
            )
        return passes

    def _pass(self, always_info: bool = False, expire: bool = True) -> AssignResult:
        try:
            res = self.assign(fence=self.epoch if self.epoch is not None else "", expire=expire)
        except Fenced:
            log(
                logger,
                logging.WARNING,
                "fenced: another scheduler leads",
                pool=self.pool,
                owner=self.owner,
                epoch=self.epoch,
            )
            self.epoch = None
            return AssignResult(fenced=True)
        level = logging.INFO if res.busy or always_info else logging.DEBUG
        log(
            logger,
            level,
            "pass",
            pool=self.pool,
            owner=self.owner,
            epoch=self.epoch,
            strategy=self.strategy_name,
            **res.log_fields(),
        )
        return res

    def _wait_wake(self, timeout: float) -> bool:
        """Block on the wake list (leader only). Returns True if woken."""
        secs = max(0.01, timeout)
        # BLPOP takes fractional seconds on Redis >= 6
        got = self.redis.blpop([self.keys.sched_wake], timeout=secs)
        return bool(got)

    def _standby_wait(self, ttl_ms: int, tick: float) -> None:
        """Sleep until the leader lease could have lapsed (capped), then try again."""
        cap = min(tick, ttl_ms / 3000)
        try:
            pttl = int(self.redis.pttl(self.keys.leader))
        except redis.RedisError:
            pttl = -1
        if pttl == -2:  # the leader stepped down meanwhile: try again at once
            delay = 0.0
        elif pttl < 0:
            delay = cap
        else:
            delay = min(cap, pttl / 1000 + 0.005)
        self._sleep(max(0.01, delay))

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.stopping:
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.1))


def _pairs(raw: list[Any]) -> list[Any]:
    """(member, score) pairs of a raw ZRANGE WITHSCORES reply: RESP3 pairs them already
    (float scores); a RESP2 reply is flat (string scores) and is paired here."""
    if not raw or isinstance(raw[0], (list, tuple)):
        return raw
    it = iter(raw)
    return list(zip(it, it, strict=True))


def _tagset(csv: str | None) -> frozenset[str]:
    return frozenset(t for t in (csv or "").split(",") if t)
