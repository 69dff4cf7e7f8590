"""Reading the bounded snapshot a strategy plans on (``SnapshotReader``), in a few pipelined
round trips and never a queue scan:

- the assignable idle devices of the device classes some queued bucket can use, each class's
  longest idle ones, as many as the pass can place times a small factor (`idle_classes`: no
  device is out of sight, and a pass with nothing queued reads none; a device's hash is
  read only when it is new to this scheduler, after a ``devgen`` change or a rejected pair, so
  in a steady pool no device row is read at all), and the health of their hosts (the one
  liveness rule, `deviceq.core.liveness`);
- the non-empty constraint buckets (the ``queues`` zset, at most ``max_buckets``), with their
  constraints cached (``sig:SIG``; the cache is bounded to the live buckets);
- for each bucket that some idle device can serve, only a few head tasks (`head_counts`: a
  fair share of ``batch``, read deeper only where the plan used up every head it was given,
  plus the strategy's optional ``lookahead``); and, only while some queued task has one, the
  heads' anti-affinity (``avoid``: devices and hosts they lost an attempt on);
- the first waiting preemption hand-overs (``preempt_handover``: a pass gives devices to the
  tasks that preempted them, `preemption.Preemptor.hand_over`, only while one waits);
- with next-task hints on (`plan_ahead`), the devices whose hint a report used (``ahead:want``,
  at most ``WANT_POP`` popped a read, kept until a pass hints them: `take_ahead_wants`);
- what the strategy's plugins need beyond that (`strategies.strategy_needs`: the union of a
  profile's plugins' ``needs``): with aging on (``aging_seconds``) and buckets of different
  priorities among those read, the submission time of head tasks not seen before (cached
  while they stay heads); the tenants' weights, caps and held devices.

`make_view` gives a placement profile its `View`; `make_snapshot` gives a registered
whole-pass strategy its `Snapshot`, with each head's effective priority set
(`deviceq.scheduler.placement.rows.aged`).

A bucket's heads are cached between passes while its head score in ``queues`` (the head
task's ``seq``) is unchanged, for at most ``HEAD_CACHE_SECONDS``: with hundreds of buckets
(tenants x priorities) a pass reads the heads of the buckets whose head changed (those it
assigned from, new ones), not of every servable bucket. The buckets a pass committed pairs
from are read again at the next pass (`forget_heads`), and the whole cache is dropped when the
number of queued tasks with an anti-affinity record changes (a retry that comes back with its
old ``seq`` is read with its record). A cached head that left the queue otherwise (a cancel, a
queue timeout, a dispatch by another process) costs one rejected pair, and its bucket is read
again at the next pass.

Buckets no idle device matches are not read at all: a pass costs O(assignments + distinct
signatures + device classes), never O(queue length) nor O(idle devices)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import redis

from ..core import liveness
from ..core.config import PoolConfig
from ..core.errors import ConfigError
from ..core.keys import Keys
from ..core.lane import Batch, batch, lane_of
from ..core.script_args import HEADS
from ..core.scripts import Scripts, sha
from . import head_counts
from .device_cache import DeviceCache, tagset
from .gangs import GANG_SCAN
from .head_cache import HeadCache
from .idle_classes import (
    ALL,
    Base,
    IdleClasses,
    SigRow,
    deepen,
    forget_where,
    pairs,
    read_devices,
    read_new,
)
from .inputs import ALWAYS_READ, INPUTS, SubmitTimes, aging_applies, settings_needed, with_wait
from .placement.rows import Bucket, IdleDevice, Pair, QueuedTask, Snapshot, aged
from .placement.view import View
from .plan_ahead import WANT_POP, WANTS_KEPT
from .preemption import HANDOVER_SCAN
from .strategies import AssignmentStrategy, strategy_needs

MAX_LOOKAHEAD = 1000  # cap of a strategy's optional ``lookahead`` (extra heads per bucket)
SPECULATE = 32  # buckets and hosts whose heads and health a pass reads with its base
DEFAULT_HOST_TIMEOUT = float(PoolConfig.model_fields["host_timeout"].default)
DEFAULT_AGING = float(PoolConfig.model_fields["aging_seconds"].default)
GANG_SETTINGS = ("gang_reserve_after", "gang_hold_seconds")
DEFAULT_GANG_RESERVE = float(PoolConfig.model_fields["gang_reserve_after"].default)
DEFAULT_GANG_HOLD = float(PoolConfig.model_fields["gang_hold_seconds"].default)
TENANTS = frozenset({"tenants"})
RETRY_WAIT = "retry_elsewhere_wait"
DEFAULT_RETRY_WAIT = float(PoolConfig.model_fields[RETRY_WAIT].default)
HEADS_RANGE = 10_000  # longest range of one bucket in one lua/heads.lua triple


def _seconds_ms(raw: Any, default: float) -> int:
    """A duration setting as read from the config hash (seconds) in ms; the default when it
    is missing or not a number (the scripts treat a bad stored value the same way)."""
    try:
        v = float(raw) if raw not in (None, "") else default
    except (TypeError, ValueError):
        v = default
    return int(v * 1000) if v == v and v >= 0 else int(default * 1000)


class SnapshotReader:
    """Reads snapshots of one pool for one strategy, with bounded caches of device
    attributes and bucket constraints that survive between passes."""

    def __init__(
        self,
        r: redis.Redis,
        keys: Keys,
        strategy: AssignmentStrategy,
        *,
        batch: int,
        max_buckets: int,
        device_refresh: float,
        scripts: Scripts | None = None,
        also_needs: frozenset[str] = frozenset(),
        plan_ahead: bool = False,
    ) -> None:
        self.redis = r
        self.plan_ahead = plan_ahead  # pop ``ahead:want`` with each base (next-task hints)
        # devices whose next-task hint a report used, popped and not yet hinted again
        self.ahead_wants: dict[str, None] = {}
        self.scripts = scripts or Scripts(r)
        self.keys = keys
        self.strategy = strategy
        self.needs = strategy_needs(strategy)  # the optional inputs its plugins read
        self.also_needs = also_needs  # (multi-device tasks' profile's: their settings are read)
        unknown = self.needs - INPUTS.keys()
        if unknown:
            raise ConfigError(
                f"strategy {getattr(strategy, 'name', strategy)!r} needs view inputs nothing "
                f"reads: {', '.join(sorted(unknown))} (readable: {', '.join(sorted(INPUTS))})"
            )
        self.batch = batch
        self.idle = IdleClasses(
            keys, batch=batch, whole=bool(getattr(strategy, "reads_all_idle", False))
        )
        self.max_buckets = max_buckets
        self.device_refresh = device_refresh
        # bucket -> (driver type, tags, priority, tenant)
        self._sig_cache: dict[str, SigRow] = {}
        self._per_pass: dict[str, dict[str, Any]] = {}  # per-pass inputs read (`inputs`)
        self.settings: dict[str, Any] = {}  # the pool settings the inputs use, as read
        self.device_cache = DeviceCache(r, keys, batch=batch, refresh=device_refresh)
        self._host_timeout_ms = 0
        self.aging_ms = 0  # the pool's aging_seconds, as read with the last base
        self.submitted = SubmitTimes()  # head task id -> submitted_at (ms)
        self.faulty = False  # some device has consecutive device faults (last base)
        self.faults: dict[str, str] = {}  # their counts (the ``faults`` hash, last base)
        self.head_cache = HeadCache()  # bucket -> its heads (see HEAD_CACHE_SECONDS)
        self.avoiding = 0  # queued tasks with an anti-affinity record (``avoid`` hash)
        self.retry_in_ms: int | None = None  # until the earliest retry is due (last read)
        self._spec_want: dict[str, int] = {}  # heads and hosts to read with the next base
        self._want: dict[str, int] = {}  # the heads wanted by the last read
        self._shells: dict[str, Bucket] = {}  # the last base's buckets (without heads)
        self._from_cache: set[str] = set()  # buckets whose heads this pass took from the cache
        self._spec_hosts: list[str] = []
        self.gang_ids: list[str] = []  # queued multi-device tasks, oldest first (last read)
        self.paused = False  # the pool was paused (deviceq pause) at the last read
        # tasks whose preempted device is to be handed to them, oldest first (last read)
        self.handovers: list[str] = []
        # the settings the inputs use, read with every base
        self._extra = settings_needed(self.needs | self.also_needs | ALWAYS_READ)
        # the base read with the last wake-up (`wait_and_read`): its specs and replies
        self._prefetched: tuple[Any, list[Any]] | None = None
        self.gang_reserve_ms = int(DEFAULT_GANG_RESERVE * 1000)
        self.gang_hold_ms = int(DEFAULT_GANG_HOLD * 1000)
        self.retry_wait_ms = int(DEFAULT_RETRY_WAIT * 1000)
        # (task, devices it failed on) -> ms of a device-blamed last failure, else 0 (with_wait)
        self.blamed: dict[tuple[str, frozenset[str]], int] = {}

    def _queue_base(
        self,
        pipe: Any,
        spec_want: dict[str, int],
        spec_hosts: list[str],
        spec_classes: dict[str, int],
    ) -> None:
        """Queue the base's reads on ``pipe`` (see `read_base`)."""
        k = self.keys
        pipe.time()
        pipe.hmget(
            k.config, "host_timeout", "aging_seconds", *GANG_SETTINGS, RETRY_WAIT, *self._extra
        )
        pipe.get(k.devgen)
        pipe.zcard(k.status("queued"))  # what the pass may place bounds the devices read
        pipe.execute_command("ZRANGE", k.queues, 0, self.max_buckets - 1, "WITHSCORES")
        pipe.hlen(k.avoid)
        pipe.execute_command("ZRANGE", k.retries, 0, 0, "WITHSCORES")  # the next retry due
        pipe.execute_command("ZRANGE", k.gangs, 0, GANG_SCAN - 1)  # multi-device tasks waiting
        pipe.hgetall(k.faults)  # devices with consecutive device faults: offered last
        pipe.exists(k.paused)  # (a paused pool places nothing: see `read`)
        pipe.execute_command("ZRANGE", k.preempt_handover, 0, HANDOVER_SCAN - 1)
        for sig, n in spec_want.items():
            pipe.execute_command("ZRANGE", k.queue(sig), 0, n - 1, "WITHSCORES")
        for h in spec_hosts:
            pipe.hmget(k.host(h), *liveness.HOST_FIELDS)
        for key, n in spec_classes.items():
            # raw WITHSCORES (no ``withscores=`` option): skips redis-py's per-score re-encoding
            pipe.execute_command("ZRANGE", key, 0, n - 1 if n != ALL else -1, "WITHSCORES")
        if self.plan_ahead:  # last: `_keep_wants` takes its reply off whatever becomes of the rest
            pipe.execute_command("SPOP", k.ahead_want, WANT_POP)

    def _keep_wants(self, replies: list[Any]) -> list[Any]:
        """The base's replies without the ``ahead:want`` pop's (with next-task hints on),
        whose devices join `ahead_wants` (read or not, the base's reads never lose them)."""
        if not self.plan_ahead:
            return replies
        got = replies[-1]
        if not isinstance(got, Exception):
            for dev in got or ():
                self.ahead_wants.pop(str(dev), None)
                self.ahead_wants[str(dev)] = None
            while len(self.ahead_wants) > WANTS_KEPT:
                del self.ahead_wants[next(iter(self.ahead_wants))]
        return replies[:-1]

    def take_ahead_wants(self) -> list[str]:
        """The devices popped from ``ahead:want`` (their hint was used) since the last call,
        oldest first."""
        out = list(self.ahead_wants)
        self.ahead_wants.clear()
        return out

    def wait_and_read(self, key: str, timeout: float) -> bool:
        """Block on list ``key`` (``BLPOP``) for at most ``timeout`` seconds and, while the
        last base had tasks queued, in the same round trip where the connection allows it
        (`deviceq.core.lane`), read the base the next pass reads (Redis runs the reads the
        moment the wait ends): the next `read_base` uses it instead of reading, unless
        `drop_prefetched` is called first (something changed the pool since, e.g. an
        expiry). Returns True if woken. (An idle pool's waits, mostly timing out, read
        nothing more.)"""
        lane = lane_of(self.redis)
        if lane is None or not self._shells:
            return bool(self.redis.blpop([key], timeout=timeout))
        specs = (dict(self._spec_want), list(self._spec_hosts), dict(self.idle.spec))
        pipe = Batch(lane)
        self._queue_base(pipe, *specs)
        replies = lane.pipeline([("BLPOP", key, timeout), *pipe.commands], raise_on_error=False)
        woken, base = replies[0], self._keep_wants(replies[1:])
        if isinstance(woken, Exception):
            raise woken
        # (an error reply among the reads: the pass reads again, and meets it there)
        ok = not any(isinstance(r, Exception) for r in base)
        self._prefetched = (specs, base) if ok else None
        return bool(woken)

    def drop_prefetched(self) -> None:
        """Forget the base `wait_and_read` read: the next `read_base` reads its own."""
        self._prefetched = None

    def read_base(
        self,
        spec_want: dict[str, int] | None = None,
        spec_hosts: list[str] | None = None,
        every: bool = False,
    ) -> tuple[Base, list[str], dict[str, list[Any]], dict[str, Any]]:
        """Idle devices (attributes cached, see ``device_rows``) and the non-empty buckets'
        constraints: one pipelined round trip, plus one only when device or bucket
        attributes must be (re-)read. No queue scan. In the same round trip, speculatively,
        the heads of ``spec_want``'s buckets and the health of ``spec_hosts`` (what the last
        pass needed: in a steady pool the pass then needs no second read). Returns the base
        (devices not yet filtered by host health, see ``host_filter``), the hosts of its
        devices, and the speculative heads (raw pairs) and host rows."""
        spec_want = spec_want or {}
        spec_hosts = spec_hosts or []
        spec_classes = dict(self.idle.spec)  # the classes the last pass read, as deep
        specs = (spec_want, spec_hosts, spec_classes)
        pre, self._prefetched = self._prefetched, None
        if pre is not None and pre[0] == specs:  # read by `wait_and_read` with the same specs
            res = pre[1]
        else:
            pipe = batch(self.redis)
            self._queue_base(pipe, *specs)
            res = self._keep_wants(pipe.execute())
        extra = self._extra
        (sec, usec), cfg, devgen, queued, queues_raw, avoiding = res[:6]
        host_timeout_raw, aging_raw = cfg[0], cfg[1]
        self.gang_ids = [str(g) for g in res[7]]
        self.gang_reserve_ms = _seconds_ms(cfg[2], DEFAULT_GANG_RESERVE)
        self.gang_hold_ms = _seconds_ms(cfg[3], DEFAULT_GANG_HOLD)
        self.retry_wait_ms = _seconds_ms(cfg[4], DEFAULT_RETRY_WAIT)
        self.settings = dict(zip(extra, cfg[5:], strict=True))
        faults = res[8]
        self.faulty = bool(faults)
        self.paused = bool(res[9])
        self.handovers = [str(u) for u in res[10]]
        spec = res[11 : 11 + len(spec_want)]
        spec_heads = {sig: pairs(raw) for sig, raw in zip(spec_want, spec, strict=True)}
        at = 11 + len(spec_want) + len(spec_hosts)
        spec_rows = dict(zip(spec_hosts, res[11 + len(spec_want) : at], strict=True))
        spec_idle = {key: pairs(raw) for key, raw in zip(spec_classes, res[at:], strict=True)}
        if int(avoiding or 0) != self.avoiding:  # a task failed or left with its record
            self.head_cache.clear()
        self.avoiding = int(avoiding or 0)
        now = int(sec) * 1000 + int(usec) // 1000
        # ms until the earliest retry becomes eligible (<= 0: due now), None when none waits
        first_retry = pairs(res[6])
        self.retry_in_ms = int(float(first_retry[0][1])) - now if first_retry else None
        self._host_timeout_ms = int(float(host_timeout_raw or DEFAULT_HOST_TIMEOUT) * 1000)
        self.aging_ms = _seconds_ms(aging_raw, DEFAULT_AGING)
        self.device_cache.generation(devgen)
        queues = pairs(queues_raw)

        head_seq = {s: int(float(score)) for s, score in queues}
        self.head_cache.based_on(head_seq)
        if len(self._sig_cache) > 2 * len(queues) + 1000:  # forget buckets that emptied
            self._sig_cache = {s: v for s, v in self._sig_cache.items() if s in head_seq}
        new_sigs = [s for s, _ in queues if s not in self._sig_cache]
        self._sig_cache.update(read_new(self, new_sigs, devgen))
        cons = {self._sig_cache[s][:2] for s, _ in queues}
        want = self.idle.wanted(cons, int(queued or 0), bool(self.gang_ids), every)
        pinned = {self._sig_cache[s][:2] for s, _ in queues if self._sig_cache[s][4]}
        if pinned:  # a pinned task's device may be anywhere in its class: read those whole
            for c in self.idle.classes:
                if c.key in want and any(c.accepts(d, t) for d, t in pinned):
                    want[c.key] = ALL
        todo = self.idle.take(want, spec_idle)
        self.idle.read(self.redis, {key: (0, n - 1 if n != ALL else -1) for key, n in todo.items()})
        self.faults = faults
        shells = []
        old_shells, self._shells = self._shells, {}
        for s, seq in head_seq.items():
            b = old_shells.get(s)
            if b is None or b.head_seq != seq:  # (a bucket's constraints never change)
                drv, tags, prio, tenant, pin, where = self._sig_cache[s]
                b = Bucket(s, drv, tags, prio, head_seq=seq, tenant=tenant, pin=pin, where=where)
            self._shells[s] = b
            shells.append(b)
        base = read_devices(self, now, shells, len(queues))
        return base, sorted({d.host_id for d in base.devices}), spec_heads, spec_rows

    def without(self, base: Base, device_ids: set[str]) -> Base:
        """The base without ``device_ids`` (placed or kept for multi-device tasks)."""
        if not device_ids:
            return base
        return self.only(base, [d for d in base.devices if d.device_id not in device_ids])

    def only(self, base: Base, devices: list[IdleDevice]) -> Base:
        """The base with ``devices`` as its devices (e.g. busy devices to choose next-task hints
        for), matched against the same buckets."""
        pre = Snapshot.build(base.shells, devices, self.batch, base.now)
        return Base(base.now, base.shells, pre.devices, pre.matching, base.signatures, pre.classes)

    def hint_heads(
        self, base: Base, extra: Mapping[str, int]
    ) -> tuple[dict[str, int], dict[str, tuple[QueuedTask, ...]]]:
        """The initial head counts and the heads of a plan over ``base`` made after the
        pass's own (next-task hints: `TaskScheduler.hint`): each servable bucket's count plus
        ``extra`` (heads the plan leaves out), from the head cache where it holds them (the
        buckets the pass committed from are not in it any more), the rest in one round trip.
        The per-pass view inputs are read again for this base."""
        self._per_pass = {}
        want = self.initial_want(base)
        for sig in want:
            want[sig] += extra.get(sig, 0)
        have: dict[str, tuple[QueuedTask, ...]] = {}
        mono = time.monotonic()
        for sig, n in want.items():
            c = self.head_cache.get(sig, mono)
            if c is not None:
                self._from_cache.add(sig)
                if c.complete:
                    want[sig] = min(n, len(c.heads))
                have[sig] = c.heads[:n]
        heads, _ = self.read_heads(want, have)
        return want, with_wait(self, heads, base.now)

    def host_filter(self, base: Base, hosts: list[str], rows: list[Any]) -> Base:
        """Drop the devices of hosts that cannot take work (``rows``: HMGET of
        ``liveness.HOST_FIELDS`` per host, read together with the first heads), by the one
        liveness rule (`deviceq.core.liveness`), which the commit applies again in Lua."""
        bad = {
            h
            for h, row in zip(hosts, rows, strict=True)
            if liveness.unplaceable(liveness.row(row), base.now, self._host_timeout_ms)
        }
        return self.without(base, {d.device_id for d in base.devices if d.host_id in bad})

    def rejected(self, device_id: str) -> None:
        """A committed pair naming this device was refused for a device reason: re-read
        its state at the next pass."""
        self.device_cache.suspect.add(device_id)

    def read_heads(
        self,
        want: dict[str, int],
        have: dict[str, tuple[QueuedTask, ...]],
        hosts: list[str] | None = None,
    ) -> tuple[dict[str, tuple[QueuedTask, ...]], list[Any]]:
        """Read each bucket's heads up to ``want`` (only the part not in ``have``); in the same
        round trip the health (last heartbeat, draining) of ``hosts``. Returns the heads and
        the host rows."""
        out = dict(have)
        # a bucket served from the cache is read again from its head when it must be read
        # deeper: a task before the last cached one may have left (or come back) meanwhile
        todo = [
            (s, 0 if s in self._from_cache else len(have.get(s, ())), n)
            for s, n in want.items()
            if n > len(have.get(s, ()))
        ]
        hosts = hosts or []
        if not todo and not hosts:
            return out, []
        k = self.keys
        # flags of lua/heads.lua: +1 the heads' submit times (aging), +2 their anti-affinity
        flags = (1 if self.aging_ms > 0 and "submit_times" in self.needs else 0) | (
            2 if self.avoiding else 0
        )
        buckets = [
            {"sig": sig, "start": lo, "stop": min(n, lo + HEADS_RANGE) - 1}
            for sig, start, n in todo
            for lo in range(start, n, HEADS_RANGE)
        ]
        args: list[Any] = [flags, len(buckets), HEADS.pack(buckets)]
        rows: list[Any] = []
        replies: Any = None
        if hosts:  # one round trip: the hosts' rows and (EVALSHA) the heads
            pipe = batch(self.redis)
            for h in hosts:
                pipe.hmget(k.host(h), *liveness.HOST_FIELDS)
            if todo:
                pipe.evalsha(sha("heads"), 1, k.prefix, *args)
            res = pipe.execute(raise_on_error=False)
            rows = res[: len(hosts)]
            for row in rows:
                if isinstance(row, Exception):
                    raise row
            if todo and not isinstance(res[-1], Exception):
                replies = res[-1]
        if todo and replies is None:  # (NOSCRIPT after a restart: run answers it, typed errors)
            replies = self.scripts.run("heads", k.prefix, args)
        mono = time.monotonic()
        ranges = iter(replies or [])
        for s, start, n in todo:
            flat: list[Any] = []
            for _ in range(start, n, HEADS_RANGE):
                flat += next(ranges)
            complete = len(flat) < 4 * (n - start)
            got = self._head_tasks(s, flat)
            if start == 0:
                out[s] = got
                self._from_cache.discard(s)
            else:
                seen = {t.task_id for t in out.get(s, ())}
                out[s] = out.get(s, ()) + tuple(t for t in got if t.task_id not in seen)
            self.head_cache.remember(s, out[s], complete, mono)
        return out, rows

    def _head_tasks(self, sig: str, flat: list[Any]) -> tuple[QueuedTask, ...]:
        """Heads from lua/heads.lua's flat reply (task_id, seq, submitted_at, avoid, ...); the
        submit times go to the aging cache."""
        _, _, prio, tenant, _, _ = self._sig_cache[sig]
        out = []
        for i in range(0, len(flat), 4):
            tid, seq, sub, avoid = flat[i : i + 4]
            if sub:
                self.submitted.note(tid, int(float(sub)))
            t = QueuedTask(tid, int(float(seq)), sig, prio, tenant=tenant)
            if avoid:
                devs, _, hosts = str(avoid).partition("|")
                t = replace(t, avoid_devices=tagset(devs), avoid_hosts=tagset(hosts))
            out.append(t)
        return tuple(out)

    def forget_all(self) -> None:
        """Drop every cached head (e.g. on becoming the leader: another scheduler may have
        assigned, and its tasks come back, meanwhile)."""
        self.head_cache.clear()
        self._spec_want = {}
        self._prefetched = None

    def constraints(self, sig: str) -> tuple[str | None, frozenset[str]]:
        """The driver type and tags of bucket ``sig`` (read with its heads)."""
        drv, tags = self._sig_cache[sig][:2]
        return drv, tags

    def forget_heads(self, sigs: set[str]) -> None:
        """Pairs of these buckets were committed (or refused: a head may have left the queue
        meanwhile): read their heads again at the next pass."""
        self.head_cache.drop(sigs)
        # the next pass needs their new heads: read them with its base (a steady pool's few),
        # as deep as it may want them with as many servable buckets (devices freed meanwhile
        # want more heads than this pass read: a shallower read costs the next pass a round
        # trip for the rest)
        share = min(self.batch, head_counts.share(max(1, len(self._want)), self.batch))
        look = self.lookahead()
        self._spec_want = {
            s: max(n, min(share, self.idle.devices_for(*self.constraints(s))) + look)
            for s, n in self._want.items()
            if s in sigs
        }
        if len(self._spec_want) > SPECULATE:
            self._spec_want = dict(list(self._spec_want.items())[:SPECULATE])

    def with_avoid(self, heads: tuple[QueuedTask, ...]) -> tuple[QueuedTask, ...]:
        """Heads with their anti-affinity (devices and hosts they lost an attempt on), read
        from the ``avoid`` hash: one more round trip, only while some queued task has one."""
        if not heads:
            return heads
        rows = self.redis.hmget(self.keys.avoid, [t.task_id for t in heads])
        out = []
        for t, row in zip(heads, rows, strict=True):
            if row:
                devs, _, hosts = str(row).partition("|")
                t = replace(t, avoid_devices=tagset(devs), avoid_hosts=tagset(hosts))
            out.append(t)
        return tuple(out)

    def read(
        self, every: bool = False, unless_paused: bool = False
    ) -> tuple[Base, dict[str, int], dict[str, tuple[QueuedTask, ...]]]:
        """The base, the initial head counts and the heads: at most two round trips (three
        when device or bucket attributes must be read); none of its own when the base came
        with the wake-up (`wait_and_read`) and its speculative reads held the heads and hosts
        the pass needs. The heads are chosen before the hosts' health is known (read in the
        same round trip); devices of dead or draining hosts are
        dropped afterwards, so a few heads may be read for nothing, never too few. With
        ``unless_paused``, a paused pool (``paused`` is read with the base) ends the read
        there: no heads."""
        base, hosts, spec_heads, spec_rows = self.read_base(
            self._spec_want, self._spec_hosts, every
        )
        if unless_paused and self.paused:
            return base, {}, {}
        want = self.initial_want(base)
        have: dict[str, tuple[QueuedTask, ...]] = {}
        self._from_cache = set()
        mono = time.monotonic()
        for sig, n in want.items():
            got = spec_heads.get(sig)
            if got is None:
                c = self.head_cache.get(sig, mono)
                if c is not None:
                    self._from_cache.add(sig)
                    if c.complete:  # the bucket held only these (newer ones: next read)
                        want[sig] = min(n, len(c.heads))
                    have[sig] = c.heads[:n]
                continue
            complete = len(got) < self._spec_want[sig]
            if complete:  # the bucket holds only these
                want[sig] = min(n, len(got))
            have[sig] = self._queued(sig, got[:n])
            self.head_cache.remember(sig, have[sig], complete and len(got) <= n, mono)
        missing = [h for h in hosts if h not in spec_rows]
        heads, rows = self.read_heads(want, have, missing)
        rowmap = {**spec_rows, **dict(zip(missing, rows, strict=True))}
        read = len(self.idle.pairs())
        forget_where(self)  # (attributes change between passes)
        base, hosts = deepen(self, base, hosts, rowmap)
        more = {}
        if len(self.idle.pairs()) > read:  # read deeper: more devices than the heads were for
            more = {s: n for s, n in self.initial_want(base).items() if n > want.get(s, 0)}
        if more:
            want.update(more)
            heads, _ = self.read_heads(want, heads)
        want = {s: n for s, n in want.items() if base.matching.get(s)}
        # next pass, read these with the base (bounded: a steady pool's few buckets and hosts);
        # after a pass with tasks queued but no idle device, what the one before would have read
        if want or hosts or not base.shells:
            self._want = want  # the buckets the next pass reads speculatively: see forget_heads
            self._spec_want = {}
            self._spec_hosts = hosts[:SPECULATE]
        self._per_pass = {}
        return base, want, with_wait(self, heads, base.now)  # (retries waiting: avoid_until)

    def _queued(self, sig: str, got: list[Any]) -> tuple[QueuedTask, ...]:
        _, _, prio, tenant, _, _ = self._sig_cache[sig]
        fresh = tuple(QueuedTask(t, int(float(seq)), sig, prio, tenant=tenant) for t, seq in got)
        return self.with_avoid(fresh) if self.avoiding else fresh

    def buckets(self, base: Base, heads: dict[str, tuple[QueuedTask, ...]]) -> list[Bucket]:
        """The servable buckets with their heads (oldest first)."""
        return [
            Bucket(
                b.sig,
                b.driver_type,
                b.tags,
                b.priority,
                heads[b.sig],
                b.head_seq,
                tenant=b.tenant,
                pin=b.pin,
                where=b.where,
            )  # fmt: skip
            for b in base.shells
            if heads.get(b.sig) and base.matching.get(b.sig)
        ]

    def inputs(
        self, base: Base, buckets: list[Bucket], names: frozenset[str] | None = None
    ) -> dict[str, Any]:
        """The view fields of the optional inputs the strategy needs (or of ``names``), by
        their readers (`inputs.INPUTS`)."""
        fields: dict[str, Any] = {}
        for name in (self.needs | ALWAYS_READ) if names is None else names:
            inp = INPUTS[name]
            if inp.per_pass:
                got = self._per_pass.get(name)
                if got is None:
                    got = self._per_pass[name] = inp.read(self, base, buckets)
            else:
                got = inp.read(self, base, buckets)
            fields.update(got)
        return fields

    def make_view(self, base: Base, heads: dict[str, tuple[QueuedTask, ...]]) -> View:
        """A placement profile's view of the pass: what its plugins need, read."""
        buckets = self.buckets(base, heads)
        return View(
            tuple(buckets),
            tuple(base.devices),
            self.batch,
            base.now,
            classes=base.classes,
            **self.inputs(base, buckets),
        )

    def make_snapshot(
        self, base: Base, want: dict[str, int], heads: dict[str, tuple[QueuedTask, ...]]
    ) -> Snapshot:
        """A whole-pass strategy's snapshot, each head's effective priority set."""
        buckets = self.buckets(base, heads)
        if aging_applies(self, buckets):
            sub = self.submitted.of(self, buckets)
            now, ms = base.now, self.aging_ms
            buckets = [
                replace(
                    b,
                    heads=tuple(
                        replace(t, effective_priority=aged(t.priority, sub[t.task_id], now, ms))
                        for t in b.heads
                    ),
                )
                for b in buckets
            ]
        return Snapshot(
            buckets,
            base.devices,
            self.batch,
            base.now,
            {b.sig: base.matching[b.sig] for b in buckets},
            signatures=base.signatures,
            tenants=self.inputs(base, buckets, TENANTS)["tenants"]
            if "tenants" in self.needs
            else {},
        )

    def initial_want(self, base: Base) -> dict[str, int]:
        """Heads to read per servable bucket (`head_counts.initial_want`)."""
        return head_counts.initial_want(base.shells, base.matching, self.batch, self.lookahead())

    def grow(
        self, base: Base, buckets: Sequence[Bucket], pairs: list[Pair], want: dict[str, int]
    ) -> dict[str, int]:
        """Buckets to read deeper, with their new head counts (`head_counts.grow`)."""
        return head_counts.grow(base.matching, buckets, pairs, want, self.batch, self.lookahead())

    def lookahead(self) -> int:
        return min(max(0, int(getattr(self.strategy, "lookahead", 0) or 0)), MAX_LOOKAHEAD)
