"""The scheduler daemon loop (``deviceq scheduler run``, ``TaskScheduler.run``).

Several schedulers may run on one pool. Each tries to take the leader lease (see
`leadership`); the leader renews it a few times per ``leader_ttl``, works, and otherwise
blocks on ``BLPOP dq:{POOL}:sched:wake`` (pushed by submit, report, heartbeat, undrain,
requeue...; the next pass's base read is pipelined behind it) in slices of at most
``MAX_BLOCK`` seconds, running a pass when woken or every ``tick`` seconds (expiry runs on the
tick), and at once again after a pass that filled its batch. Standbys do not touch the wake
list; they sleep until the leader lease would lapse (polling at most every ``tick`` seconds,
capped to a third of ``leader_ttl``) and try again, so a standby takes over within one
``leader_ttl`` of a dead leader. A deposed leader's commits are refused by the fence and it
steps down. A refused script or command is logged and the loop goes on (backing off); an
unreachable Redis is waited for. SIGTERM stops the loop between passes and releases the
lease. All state is in Redis: a restarted scheduler just continues."""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from typing import Any, Protocol

import redis

from ..core.backoff import Backoff
from ..core.durability import warn_if_unsafe
from ..core.errors import ConfigError, DeviceqError, Fenced
from ..core.keys import Keys
from ..core.logs import log
from ..core.redirects import UNAVAILABLE
from .client import SchedulerClient
from .leadership import Leadership
from .pass_result import AssignResult

logger = logging.getLogger("deviceq.scheduler")

DEFAULT_TICK = 2.0
MAX_BLOCK = 1.0  # longest single BLPOP: bounds how long a stop request waits
SUMMARY_EVERY = 10.0  # seconds between INFO summaries of the passes (each pass is DEBUG)
SUMMED = ("assigned", "proposed", "rejected", "requeued", "retried", "expired_failed",
          "expired_cancelled", "unschedulable")  # fmt: skip
SUMMED_IF_ANY = ("hinted",)  # summed too, and in the summary only when not 0 (next-task hints)


class Passes(Protocol):
    """What the loop runs: the passes of one scheduler on its pool (`TaskScheduler`), with
    its leadership, its store and its stop flag."""

    @property
    def redis(self) -> redis.Redis: ...
    @property
    def keys(self) -> Keys: ...
    @property
    def pool(self) -> str: ...
    @property
    def stopping(self) -> bool: ...

    leadership: Leadership
    store: SchedulerClient
    strategy_name: str

    def assign(self, fence: int | str | None = None, *, expire: bool = True) -> AssignResult: ...
    def wait_wake(self, timeout: float) -> bool: ...
    def stop(self, wake: bool = False) -> None: ...


class Daemon:
    """The loop of one `TaskScheduler` (its `Passes`)."""

    def __init__(self, scheduler: Passes, tick: float, once: bool) -> None:
        if tick <= 0:
            raise ConfigError("tick must be positive")
        self.s = scheduler
        self.lead = scheduler.leadership
        self.tick = tick
        self.once = once
        self.passes = 0
        self.last_pass = float("-inf")
        self.last_expire = float("-inf")
        self.retry_at: float | None = None  # monotonic time the earliest retry backoff ends
        self.last_lead = float("-inf")
        self.ttl_ms = 0
        self.due = True
        self.busy = {k: 0 for k in ("passes", *SUMMED, *SUMMED_IF_ANY)}  # since the last summary
        self.busy_ms = 0.0
        self.last_summary = time.monotonic()

    def _log(self, level: int, msg: str, **fields: Any) -> None:
        log(logger, level, msg, pool=self.s.pool, owner=self.lead.owner, **fields)

    def run(self) -> int:
        """Run until stopped (or one pass with ``once``); returns the number of passes."""
        self._log(logging.INFO, "scheduler starting", strategy=self.s.strategy_name, tick=self.tick)
        with contextlib.suppress(redis.RedisError):
            warn_if_unsafe(self.s.redis, f"scheduler of pool {self.s.pool}")
        backoff = Backoff(0.1, 5.0)
        try:
            while not self.s.stopping:
                try:
                    if self._step():
                        return self.passes
                    backoff.reset()
                except redis.AuthenticationError as exc:
                    # never transient by itself: a one-shot run fails, the daemon keeps trying
                    # (slowly) so that fixing the credentials or the ACL revives it
                    self._log(logging.ERROR, "redis refused the credentials", error=str(exc))
                    self.lead.epoch = None
                    if self.once:
                        raise
                    self.due = True
                    self.sleep(5.0)
                except UNAVAILABLE as exc:  # unreachable, loading, a cluster failing over
                    delay = backoff.next()
                    self._log(
                        logging.WARNING,
                        "redis unreachable",
                        error=str(exc),
                        retry_in=round(delay, 2),
                    )
                    self.lead.epoch = None
                    self.due = True
                    self.sleep(delay)
                except (redis.RedisError, DeviceqError) as exc:
                    # a refused script or command (a bad argument, a permission, a bug)
                    delay = backoff.next()
                    self._log(
                        logging.ERROR,
                        "pass failed",
                        error=f"{type(exc).__name__}: {exc}",
                        retry_in=round(delay, 2),
                    )
                    self.due = True
                    if self.once:
                        raise
                    self.sleep(delay)
        finally:
            self._summary()
            if self.lead.leads:
                self.lead.release()
            self._log(logging.INFO, "scheduler stopped", passes=self.passes)
        return self.passes

    def _step(self) -> bool:
        """Lead (or wait as a standby), run a pass when due, then wait for a wake-up.
        Returns True when a ``once`` run is over."""
        now = time.monotonic()
        # renew the lease a few times per ttl, not before every pass: a lapsed lease only
        # costs a fenced (refused) commit, never a double booking
        if not self.lead.leads or now - self.last_lead >= self.ttl_ms / 3000:
            self.ttl_ms = self.lead.ttl_ms()
            if not self.lead.try_lead(self.ttl_ms):
                if self.once:
                    cur = self.s.store.leader()
                    self._log(
                        logging.INFO,
                        "standby: another scheduler leads",
                        leader=cur[0] if cur else None,
                    )
                    return True
                self._standby_wait()
                self.due = True  # on taking over, work at once
                return False
            self.last_lead = now
        if self.due or now - self.last_pass >= self.tick:
            # expiry runs on the tick (and while it has a backlog), not on every wake-up: a
            # steady submit stream then costs no expiry round trips
            retry_due = self.retry_at is not None and now >= self.retry_at
            expire = self.once or retry_due or now - self.last_expire >= self.tick
            res = self._pass(expire)
            # a retry waiting out its backoff: wake when it is due (not on a polling tick)
            self.retry_at = (
                None if res.retry_in_ms is None else now + max(0, res.retry_in_ms) / 1000
            )
            self.passes += 1
            self.last_pass = time.monotonic()
            if expire:
                self.last_expire = now if not res.expired.get("more") else float("-inf")
            if self.once:
                return True
            if res.more and not res.fenced:
                self.due = True
                return False  # a full batch (or an expiry backlog): go again now
        left = self.tick - (time.monotonic() - self.last_pass)
        if self.retry_at is not None:
            left = min(left, self.retry_at - time.monotonic())
            if left <= 0:
                self.due = True
                return False
        self.due = self._wait_wake(max(0.01, min(left, MAX_BLOCK, self.ttl_ms / 3000)))
        return False

    def _pass(self, expire: bool) -> AssignResult:
        try:
            res = self.s.assign(fence=self.lead.epoch if self.lead.leads else "", expire=expire)
        except Fenced:
            self.lead.deposed()
            return AssignResult(fenced=True)
        fields = res.log_fields()
        level = logging.INFO if self.once else logging.DEBUG
        self._log(level, "pass", epoch=self.lead.epoch, strategy=self.s.strategy_name, **fields)
        if res.busy:
            self.busy["passes"] += 1
            for k in SUMMED:
                self.busy[k] += fields[k]
            for k in SUMMED_IF_ANY:
                self.busy[k] += fields.get(k, 0)
            self.busy_ms += fields["ms"]
        if time.monotonic() - self.last_summary >= SUMMARY_EVERY:
            self._summary()
        return res

    def _summary(self) -> None:
        """One INFO line about the passes that did something since the last one (if any)."""
        self.last_summary = time.monotonic()
        if not self.busy["passes"]:
            return
        ms = round(self.busy_ms / self.busy["passes"], 2)
        summed = {k: v for k, v in self.busy.items() if v or k not in SUMMED_IF_ANY}
        self._log(logging.INFO, "passes", epoch=self.lead.epoch, mean_ms=ms, **summed)
        self.busy = dict.fromkeys(self.busy, 0)
        self.busy_ms = 0.0

    def _wait_wake(self, timeout: float) -> bool:
        """Block on the wake list (leader only; BLPOP takes fractional seconds on Redis >= 6),
        reading the next pass's base in the same round trip (`TaskScheduler.wait_wake`).
        Returns True if woken."""
        return self.s.wait_wake(max(0.01, timeout))

    def _standby_wait(self) -> None:
        """Sleep until the leader lease could have lapsed (capped), then try again."""
        cap = min(self.tick, self.ttl_ms / 3000)
        try:
            pttl = int(self.s.redis.pttl(self.s.keys.leader))
        except redis.RedisError:
            pttl = -1
        if pttl == -2:  # the leader stepped down meanwhile: try again at once
            delay = 0.0
        elif pttl < 0:
            delay = cap
        else:
            delay = min(cap, pttl / 1000 + 0.005)
        self.sleep(max(0.01, delay))

    def sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self.s.stopping:
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.1))


def install_signal_handlers(scheduler: Passes) -> None:
    """SIGTERM and SIGINT stop the daemon between passes."""

    def handler(signum: int, frame: Any) -> None:
        scheduler.stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
