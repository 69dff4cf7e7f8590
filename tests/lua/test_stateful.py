"""A hypothesis state machine on the real private redis-server: it interleaves submit,
heartbeat, assign (commits of random pairs), claim, renew, report (current and stale leases),
expire (time passing for a random set of leases is simulated by moving their expiry into the
past: leases are at least 1 s long, too long to wait for in a state machine), cancel and
quarantine, and checks the design brief's invariants after every step:

1. a device is reserved by at most one active lease, and every active task's lease agrees with
   its device's reservation (and with the lease index);
2. only the current lease's holder may renew or end an attempt; each lease is claimed once;
3. a terminal state is reached once and never changes afterwards;
4. nothing is lost: every submitted id exists, in exactly the one status index its hash names;
   the attempt history has one record per attempt;
5. queued depth == ZCARD status:queued == total of the bucket sizes, buckets ordered by seq;
6. the ``caps`` profile counts (and the per-driver device and quarantine counts) match the
   registered devices;
7. a device held after a lost lease or a hand-back is never an idle candidate; anti-affinity
   records exist only for queued tasks; a bucket's constraints exist exactly while it is
   non-empty; no task is handed back more than ``max_handbacks`` times.
The same machine also runs (fewer examples) on fakeredis.
"""

from __future__ import annotations

import random
import time
import uuid
from typing import Any

import fakeredis
import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from deviceq import Client, DeviceReport, HostClient, PoolAdmin, SchedulerClient
from deviceq.core.replies import parse
from deviceq.core.vocabulary import (
    LEASED_STATUSES,
    REPORT_OUTCOMES,
    TERMINAL_STATUSES,
    FailureKind,
    ReplyCode,
)
from invariants import check_pool

ACTIVE = frozenset(LEASED_STATUSES)
TERMINAL = frozenset(TERMINAL_STATUSES)
DEVICES = {
    "h1": [("d1", "android", ("wifi",)), ("d2", "android", ())],
    "h2": [("d3", "ios", ("wifi",)), ("d4", "android", ("camera", "wifi"))],
}
MAX_HANDBACKS = 3
ALL_DEVICES = [d for devs in DEVICES.values() for d, _, _ in devs]
CONSTRAINTS = [
    {},
    {"driver_type": "android"},
    {"tags": ["wifi"]},
    {"driver_type": "ios"},
    {"driver_type": "android", "tags": ["camera"]},
]


class DeviceqMachine(RuleBasedStateMachine):
    url: str = ""

    tasks = Bundle("tasks")
    # Claimed leases are kept in `self.leases`, not in a Bundle: which assignments can be
    # claimed depends on real time (short leases expire), and Hypothesis needs the data it draws
    # not to depend on such external state. Rules draw an index instead.

    def __init__(self) -> None:
        super().__init__()
        self.pool = "s" + uuid.uuid4().hex[:12]
        self.r = (
            fakeredis.FakeRedis(decode_responses=True)
            if self.url == "fakeredis"
            else redis.Redis.from_url(self.url, decode_responses=True)
        )
        self.client = Client(self.r, self.pool)
        self.admin = PoolAdmin(self.r, self.pool)
        self.store = SchedulerClient(self.r, self.pool)
        self.admin.set_config("claim_ttl", 30)
        self.admin.set_config("lease_ttl", 30)
        self.admin.set_config("quarantine_after", 2)
        self.admin.set_config("max_quarantine_fraction", 0.5)
        self.admin.set_config("max_handbacks", MAX_HANDBACKS)
        self.hosts: dict[str, HostClient] = {}
        for host_id, devs in DEVICES.items():
            token = self.admin.add_host(host_id)
            self.hosts[host_id] = HostClient(self.r, self.pool, host_id, token)
            self.hosts[host_id].heartbeat([DeviceReport(*d) for d in devs])
        self.submitted: set[str] = set()
        self.terminal: dict[str, dict[str, str]] = {}
        self.claimed_leases: set[str] = set()
        self.committed_leases: set[str] = set()
        self.leases: list[tuple[str, str, str]] = []

    def teardown(self) -> None:
        self.r.close()

    # -- helpers ---------------------------------------------------------------------------------
    def task(self, tid: str) -> dict[str, str]:
        return self.r.hgetall(self.admin.keys.task(tid))

    def now(self) -> int:
        return self.admin.server_time_ms()

    # -- rules -------------------------------------------------------------------------------------
    @rule(
        target=tasks,
        n=st.integers(1, 3),
        cons=st.sampled_from(CONSTRAINTS),
        max_attempts=st.integers(1, 3),
        idem=st.sampled_from([None, None, "k1", "k2"]),
    )
    def submit(self, n: int, cons: dict[str, Any], max_attempts: int, idem: str | None) -> Any:
        specs = [{"goal": f"g{i}", "max_attempts": max_attempts, **cons} for i in range(n)]
        if idem:
            specs[0]["idempotency_key"] = idem
        ids = self.client.submit_many(specs)
        assert len(ids) == n
        self.submitted.update(ids)
        return multiple(*ids)

    @rule(
        host=st.sampled_from(sorted(DEVICES)),
        states=st.lists(
            st.sampled_from(["idle"] * 5 + ["busy", "offline", None]), min_size=2, max_size=2
        ),
        retag=st.sampled_from([False, False, False, True]),
    )
    def heartbeat(self, host: str, states: list[str | None], retag: bool) -> None:
        """A snapshot; devices left out go offline; ``retag`` adds a capability (new profile)."""
        snap = [
            DeviceReport(d, drv, (*tags, "extra") if retag else tags, s)
            for (d, drv, tags), s in zip(DEVICES[host], states, strict=True)
            if s
        ]
        self.hosts[host].heartbeat(snap)

    @rule(pairs=st.lists(st.tuples(tasks, st.sampled_from(ALL_DEVICES)), min_size=1, max_size=4))
    def commit(self, pairs: list[tuple[str, str]]) -> None:
        before = {d: self.r.hget(self.admin.keys.device(d), "reserved_by") for d in ALL_DEVICES}
        res = self.store.commit(pairs)
        booked: set[str] = set()
        for (_tid, did), raw in zip(pairs, res, strict=True):
            out = parse(raw)
            if out.ok:
                lease = out.value
                assert lease and not before[did] and did not in booked, f"{did} double booked"
                assert lease not in self.committed_leases
                self.committed_leases.add(lease)
                booked.add(did)
            else:
                assert raw.startswith("err:") and out.code is ReplyCode.err, raw

    @rule(seed=st.integers(0, 2**16))
    def schedule(self, seed: int) -> None:
        """What a scheduler does: propose queued tasks x idle devices (a stale, shuffled
        snapshot, some pairs not matching) and commit them."""
        queued = self.r.zrange(self.admin.keys.status("queued"), 0, 5)
        idle = self.r.zrange(self.admin.keys.idle, 0, -1)
        pairs = [(t, d) for t in queued for d in idle]
        random.Random(seed).shuffle(pairs)
        if pairs:
            self.commit(pairs[:6])

    @rule(seed=st.integers(0, 2**16))
    def schedule_and_claim(self, seed: int) -> None:
        """A scheduler pass followed at once by both hosts' workers claiming."""
        self._schedule_and_claim(seed)

    def _schedule_and_claim(self, seed: int) -> list[tuple[str, str, str]]:
        self.schedule(seed)
        return [lease for host in sorted(DEVICES) for lease in self._claim(host, 4)]

    @rule(
        seed=st.integers(0, 2**16), outcome=st.sampled_from(["done", "done", "failed", "released"])
    )
    def run_to_completion(self, seed: int, outcome: str) -> None:
        """Schedule, claim and end at once what was claimed (a fast worker)."""
        for lease in self._schedule_and_claim(seed):
            self._report(lease, outcome, False)

    @rule(host=st.sampled_from(sorted(DEVICES)), n=st.integers(1, 3))
    def claim(self, host: str, n: int) -> None:
        self._claim(host, n)

    def _lease(self, pick: int) -> tuple[str, str, str] | None:
        return self.leases[pick % len(self.leases)] if self.leases else None

    def _claim(self, host: str, n: int) -> list[tuple[str, str, str]]:
        got = self.hosts[host].claim(n)
        out = []
        for a in got:
            assert a.lease_id not in self.claimed_leases, "a lease is claimed once"
            self.claimed_leases.add(a.lease_id)
            t = self.task(a.task.id)
            assert (t["status"], t["host_id"], t["lease_id"]) == ("dispatched", host, a.lease_id)
            out.append((a.task.id, host, a.lease_id))
        self.leases += out
        return out

    @rule(pick=st.integers(0, 2**16))
    def renew(self, pick: int) -> None:
        lease = self._lease(pick)
        if lease is None:
            return
        tid, host, lease_id = lease
        before = self.task(tid)
        (rn,) = self.hosts[host].renew([(tid, lease_id)])
        if rn.lost:
            assert self.task(tid) == before, "a lost lease changes nothing"
        else:
            assert before["status"] in ACTIVE and before["lease_id"] == lease_id
            assert before["host_id"] == host
            assert (rn.status == "cancel") == (before.get("cancel_requested") == "1")

    @rule(
        pick=st.integers(0, 2**16),
        outcome=st.sampled_from(REPORT_OUTCOMES),
        other_host=st.sampled_from([False, False, False, True]),
    )
    def report(self, pick: int, outcome: str, other_host: bool) -> None:
        lease = self._lease(pick)
        if lease is not None:
            self._report(lease, outcome, other_host)

    def _report(self, lease: tuple[str, str, str], outcome: str, other_host: bool) -> None:
        tid, host, lease_id = lease
        if other_host:
            host = "h2" if host == "h1" else "h1"
        before = self.task(tid)
        kind = FailureKind.runner_failed.value if outcome == "failed" else None
        res = self.hosts[host].report(tid, lease_id, outcome, kind, "p")
        current = (
            before["status"] in ACTIVE
            and before["lease_id"] == lease_id
            and before["host_id"] == host
        )
        if outcome == "cancelled":
            current = current and before.get("cancel_requested") == "1"
        if outcome == "preempted":  # (only a run the scheduler preempted: preempt.lua)
            current = current and bool(before.get("preempt_by"))
        reply = parse(res)
        if reply.ok:
            assert current, (res, before)
            want = outcome
            if outcome == "released":  # a hand-back of a task whose cancel was requested ends it
                want = "cancelled" if before.get("cancel_requested") == "1" else "queued"
            assert res == f"ok:{want}" and self.task(tid)["status"] == want, (res, before)
        else:
            assert not current, (res, before)
            assert reply.code in (ReplyCode.dup, ReplyCode.rejected) and reply.value, res
            assert self.task(tid) == before, "a rejected or repeated report changes nothing"

    @rule(short=st.booleans())
    def set_ttls(self, short: bool) -> None:
        ttl = 1 if short else 30
        self.admin.set_config("claim_ttl", ttl)
        self.admin.set_config("lease_ttl", ttl)

    @rule(pick=st.lists(st.integers(0, 2**16), max_size=3))
    def time_passes(self, pick: list[int]) -> None:
        """Some active leases reach their expiry (their expiry moves into the past, as the
        passing of their lease_ttl would)."""
        keys = self.admin.keys
        active = sorted(self.r.zrange(keys.leases, 0, -1))
        past = self.now() - 1
        for p in pick:
            if active:
                tid = active[p % len(active)]
                self.r.hset(keys.task(tid), "lease_expires_at", past)
                self.r.zadd(keys.leases, {tid: past})

    @rule(wait=st.booleans(), limit=st.integers(1, 5))
    def expire(self, wait: bool, limit: int) -> None:
        if wait:
            time.sleep(0.005)
        due_before = self.r.zcount(self.admin.keys.leases, "-inf", self.now())
        res = self.store.expire(limit)
        ended = res["requeued"] + res["failed"] + res["cancelled"]
        # every due lease belongs to an active task (see the invariants), so each one ends
        assert min(due_before, limit) <= ended <= limit, (due_before, res)
        assert res["more"] == (1 if ended == limit else 0), res

    @rule(tid=tasks)
    def cancel(self, tid: str) -> None:
        before = self.task(tid)["status"]
        res = self.client.cancel(tid)
        if before in TERMINAL:
            assert res == f"already:{before}"
        elif before == "dispatched":
            assert res == "requested"
            assert self.task(tid)["status"] == "dispatched"
        else:
            assert res == "cancelled"
            assert self.task(tid)["status"] == "cancelled"

    @rule(device=st.sampled_from(ALL_DEVICES), on=st.sampled_from([False, False, False, True]))
    def quarantine(self, device: str, on: bool) -> None:
        """Mostly releases devices that consecutive failures quarantined."""
        self.admin.quarantine(device, on)

    @rule(tid=consumes(tasks))
    def forget(self, tid: str) -> None:
        """Drop a task from the bundle (keeps later draws on fresher tasks)."""

    # -- invariants ----------------------------------------------------------------------------
    @invariant()
    def pool_invariants(self) -> None:
        """The shared checker (also run after every accepted call of the script fuzz test):
        devices and leases agree, every task in exactly its status index with its whole
        attempt history, queued depth and buckets consistent, device counts right."""
        tasks = check_pool(self.r, self.admin.keys)
        assert set(tasks) == self.submitted, "nothing lost, nothing invented"

    @invariant()
    def terminal_once_and_bounded(self) -> None:
        """A terminal state is reached once and never changes; each task ends once in the
        event stream; no task is handed back more than max_handbacks times."""
        for tid in self.submitted:
            t = self.task(tid)
            if t["status"] in TERMINAL:
                fixed = {k: t.get(k) for k in ("status", "finished_at", "result", "error",
                                               "failure_kind", "attempt")}  # fmt: skip
                assert self.terminal.setdefault(tid, fixed) == fixed, "terminal exactly once"
            else:
                assert tid not in self.terminal, f"{tid} left a terminal state"
            n = int(t.get("handbacks") or 0)
            assert n <= MAX_HANDBACKS + 1, (tid, n)
            if n > MAX_HANDBACKS:
                assert (t["status"], t["failure_kind"]) == ("failed", "rejected"), t
        ends = {}
        for e in self.client.events():
            if e.type in TERMINAL and e.task:
                assert e.task not in ends, f"{e.task} ended twice"
                ends[e.task] = e.type
        assert ends == {tid: v["status"] for tid, v in self.terminal.items()}


@pytest.mark.slow
def test_state_machine_keeps_invariants(redis_server: Any) -> None:
    DeviceqMachine.url = redis_server.url
    run_state_machine_as_test(
        DeviceqMachine,
        settings=settings(
            max_examples=45,
            stateful_step_count=50,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )


@pytest.mark.slow
def test_state_machine_on_fakeredis() -> None:
    """The same machine on fakeredis, fewer examples: the scripts behave the same there."""
    DeviceqMachine.url = "fakeredis"
    run_state_machine_as_test(
        DeviceqMachine,
        settings=settings(
            max_examples=15,
            stateful_step_count=50,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
