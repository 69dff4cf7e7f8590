"""Golden tests: every built-in placement profile gives the same pairs as the old path it is
to replace, on many seeded random snapshots.

The reference is the old end-to-end choice, run by the old code itself
(`reference_strategies`): the snapshot a whole-pass strategy plans on
(`SnapshotReader.make_snapshot`, which applies aging), the old strategy's ``propose`` and the old
``plan`` (its checks and ``respect_avoid``: anti-affinity and faulty devices last). The profile
runs as the scheduler runs it: on the view the same reader gives it (`SnapshotReader.make_view`:
heads *not* aged, the submit times beside them, only the inputs the profile needs), so its
aging, tenant, anti-affinity and fault plugins do their own work. On a mismatch the scenario is
shrunk (devices, tasks, buckets, records dropped while it still fails) and printed."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest
from reference_strategies import OLD, plan

from deviceq.core.errors import ConfigError
from deviceq.scheduler.idle_classes import Base
from deviceq.scheduler.inputs import SubmitTimes
from deviceq.scheduler.placement import PROFILES, Profile, place
from deviceq.scheduler.placement.builtin import AntiAffinity, FaultCount, PrioritySort
from deviceq.scheduler.placement.rows import (
    Bucket,
    IdleDevice,
    Pair,
    QueuedTask,
    Snapshot,
    TenantShare,
)
from deviceq.scheduler.snapshot import SnapshotReader
from deviceq.scheduler.strategies import get_strategy, registered_strategies, strategy_needs

STRATEGIES = ("fifo_match", "priority_match", "lru_device", "fair_share")
RUNS = 500
NOW = 10_000_000
DRIVERS = ("android", "ios", "linux")
TAGS = ("gpu", "5g", "lab1", "lab2")
TENANTS = (None, "acme", "beta", "core")


@dataclass
class Scenario:
    """One pass's raw inputs (what the reader would have read)."""

    buckets: list[Bucket]  # with their heads (un-aged), oldest first
    devices: list[IdleDevice]  # with their fault counts
    limit: int
    tenants: dict[str, TenantShare] = field(default_factory=dict)
    submit_times: dict[str, int] = field(default_factory=dict)
    aging_ms: int = 0

    def describe(self) -> str:
        lines = [f"limit={self.limit} aging_ms={self.aging_ms} now={NOW}"]
        for name, s in sorted(self.tenants.items()):
            lines.append(f"tenant {name}: weight={s.weight} cap={s.max_devices} held={s.held}")
        for b in self.buckets:
            lines.append(
                f"bucket {b.sig}: driver={b.driver_type} tags={sorted(b.tags)} "
                f"prio={b.priority} tenant={b.tenant}"
            )
            for t in b.heads:
                avoid = ""
                if t.avoid_devices or t.avoid_hosts:
                    avoid = f" avoid={sorted(t.avoid_devices)}|{sorted(t.avoid_hosts)}"
                sub = self.submit_times.get(t.task_id, 0)
                lines.append(f"  task {t.task_id} seq={t.seq} submitted={sub}{avoid}")
        for d in self.devices:
            lines.append(
                f"device {d.device_id}: host={d.host_id} driver={d.driver_type} "
                f"tags={sorted(d.tags)} idle_since={d.idle_since} faults={d.faults}"
            )
        return "\n".join(lines)


def _tags(rng: random.Random, most: int) -> frozenset[str]:
    return frozenset(rng.sample(TAGS, rng.randint(0, most)))


def scenario(seed: int) -> Scenario:
    """A random pass: a few shapes (contended, idle, one big device class, many tenants)."""
    rng = random.Random(seed)
    shape = rng.choice(("contended", "idle", "big_class", "mixed", "large"))
    n_dev = {
        "contended": rng.randint(1, 8),
        "idle": rng.randint(10, 40),
        "large": rng.randint(100, 300),
    }.get(shape, rng.randint(0, 30))
    n_hosts = rng.randint(1, 6)
    p_fault = rng.choice((0.0, 0.2, 0.5))
    pad = rng.random() < 0.5  # d07 or d7: string order differs from numeric order
    drivers = DRIVERS[:1] if shape == "big_class" else DRIVERS
    devices = []
    for j in range(n_dev):
        devices.append(
            IdleDevice(
                f"d{j:02d}" if pad else f"d{j}",
                f"h{rng.randrange(n_hosts)}",
                rng.choice(drivers),
                frozenset() if shape == "big_class" else _tags(rng, 3),
                idle_since=rng.randint(0, 50),  # ties on purpose
                faults=rng.randint(1, 3) if rng.random() < p_fault else 0,
            )
        )
    # constraints shared by several buckets (tenants x priorities of one driver type)
    needs = [
        (rng.choice((None, *drivers)), frozenset() if shape == "big_class" else _tags(rng, 2))
        for _ in range(rng.randint(1, 4))
    ]
    prios = rng.sample(range(10), rng.randint(1, 3))
    n_buckets = rng.randint(10, 30) if shape == "large" else rng.randint(1, 10)
    n_heads = [rng.randint(1, 5 if shape in ("idle", "mixed") else 12) for _ in range(n_buckets)]
    seqs = rng.sample(range(1, 10_000), sum(n_heads))
    p_avoid = 0.6 if shape == "big_class" else rng.choice((0.0, 0.2, 0.6))
    ids = [d.device_id for d in devices] + ["gone1", "gone2"]
    hosts = [f"h{i}" for i in range(n_hosts)]
    step = rng.choice((1, 10, 100))
    buckets, submit_times, at = [], {}, 0
    for i, n in enumerate(n_heads):
        drv, tags = rng.choice(needs)
        sig = f"b{i}"
        heads = []
        for seq in sorted(seqs[at : at + n]):
            t = QueuedTask(f"t{seq}", seq, sig, 0)
            if rng.random() < p_avoid:
                t = replace(
                    t,
                    avoid_devices=frozenset(rng.sample(ids, rng.randint(0, min(3, len(ids))))),
                    avoid_hosts=frozenset(rng.sample(hosts, rng.randint(0, min(2, n_hosts)))),
                )
            heads.append(t)
            # roughly in seq order, as the submit counter and the clock go together
            sub = NOW - (10_000 - seq) * step - rng.randint(0, 3 * step)
            submit_times[t.task_id] = sub if rng.random() < 0.95 else 0  # 0: not recorded
        at += n
        prio = rng.choice(prios)
        tenant = rng.choice(TENANTS[: rng.randint(1, 4)])
        heads = [replace(t, priority=prio, tenant=tenant) for t in heads]
        buckets.append(Bucket(sig, drv, tags, prio, tuple(heads), heads[0].seq, tenant=tenant))
    tenants = {
        n: TenantShare(rng.randint(1, 3), rng.choice((0, 0, 1, 2, 4)), rng.randint(0, 3))
        for n in TENANTS[1:]
        if rng.random() < 0.8  # a tenant missing from the hash weighs 1, no cap
    }
    limit = rng.choice((1, 2, 3, 5, 8, 200)) if shape != "big_class" else rng.randint(1, 4)
    aging_ms = rng.choice((0, 0, 50, 500, 5000))
    return Scenario(buckets, devices, limit, tenants, submit_times, aging_ms)


def _reader(sc: Scenario, needs: frozenset[str]) -> SnapshotReader:
    """A SnapshotReader with the state a pass would have read (no Redis: every submit time is
    already known, so nothing is read), for a strategy that ``needs`` these inputs."""
    r = SnapshotReader.__new__(SnapshotReader)
    r.batch = sc.limit
    r.aging_ms = sc.aging_ms
    r.needs = needs
    r.submitted = SubmitTimes()
    r.submitted.known = dict(sc.submit_times)
    r.avoiding = sum(1 for b in sc.buckets for t in b.heads if t.avoid_devices or t.avoid_hosts)
    r.faulty = any(d.faults for d in sc.devices)
    r._per_pass = {"tenants": {"tenants": dict(sc.tenants)}}  # (as read_tenants would read)
    r.settings = {}  # the pool settings inputs read: all unset (max_tasks_per_host 0)
    return r


def _base(sc: Scenario) -> tuple[Base, dict[str, tuple[QueuedTask, ...]]]:
    shells = [replace(b, heads=()) for b in sc.buckets]
    pre = Snapshot.build(shells, sc.devices, sc.limit, NOW)
    return Base(NOW, shells, pre.devices, pre.matching, len(shells), pre.classes), {
        b.sig: b.heads for b in sc.buckets
    }


def old_snapshot(name: str, sc: Scenario) -> Snapshot:
    """The snapshot the old strategy ``name`` planned on (aged, its tenants read)."""
    base, heads = _base(sc)
    return _reader(sc, strategy_needs(OLD[name]())).make_snapshot(base, {}, heads)


def reference(name: str, sc: Scenario) -> list[Pair]:
    old = old_snapshot(name, sc)
    avoiding = any(t.avoid_devices or t.avoid_hosts for t in old.tasks())
    pairs, dropped = plan(OLD[name](), old, avoiding=avoiding)
    assert dropped == 0
    return pairs


def candidate(profile: Profile, sc: Scenario) -> list[Pair]:
    base, heads = _base(sc)
    return place(profile, _reader(sc, profile.needs).make_view(base, heads))


def smaller(sc: Scenario) -> list[Scenario]:
    """Scenarios one step smaller than ``sc``."""
    out = []
    for i in range(len(sc.devices)):
        out.append(replace(sc, devices=sc.devices[:i] + sc.devices[i + 1 :]))
    for i, b in enumerate(sc.buckets):
        out.append(replace(sc, buckets=sc.buckets[:i] + sc.buckets[i + 1 :]))
        for j in range(len(b.heads)):
            heads = b.heads[:j] + b.heads[j + 1 :]
            if heads:
                nb = replace(b, heads=heads, head_seq=heads[0].seq)
                out.append(replace(sc, buckets=[*sc.buckets[:i], nb, *sc.buckets[i + 1 :]]))
            t = b.heads[j]
            if t.avoid_devices or t.avoid_hosts:  # the task without its anti-affinity record
                plain = replace(t, avoid_devices=frozenset(), avoid_hosts=frozenset())
                nb = replace(b, heads=(*b.heads[:j], plain, *b.heads[j + 1 :]))
                out.append(replace(sc, buckets=[*sc.buckets[:i], nb, *sc.buckets[i + 1 :]]))
    for i, d in enumerate(sc.devices):
        if d.faults:
            out.append(
                replace(sc, devices=[*sc.devices[:i], replace(d, faults=0), *sc.devices[i + 1 :]])
            )
    for name in sc.tenants:
        out.append(replace(sc, tenants={n: v for n, v in sc.tenants.items() if n != name}))
    return out


def shrink(sc: Scenario, fails: Callable[[Scenario], bool]) -> Scenario:
    progress = True
    while progress:
        progress = False
        for s in smaller(sc):
            if fails(s):
                sc, progress = s, True
                break
    return sc


def check(name: str, profile: Profile, seeds: range) -> tuple[int, int, Scenario | None]:
    """How many seeds the profile and the old path differ on; the first such seed and its
    scenario shrunk."""

    def fails(sc: Scenario) -> bool:
        return candidate(profile, sc) != reference(name, sc)

    bad = [seed for seed in seeds if fails(scenario(seed))]
    if not bad:
        return 0, -1, None
    return len(bad), bad[0], shrink(scenario(bad[0]), fails)


def test_every_registered_builtin_strategy_has_a_profile() -> None:
    builtin = set()
    for n in registered_strategies():
        try:
            s = get_strategy(n)
        except ConfigError:  # a broken entry point of another test's
            continue
        if type(s).__module__ == "deviceq.scheduler.strategies":
            builtin.add(n)
    assert builtin == set(STRATEGIES) == set(PROFILES)


@pytest.mark.parametrize("name", STRATEGIES)
def test_profile_equals_the_old_strategy_after_plan(name: str) -> None:
    n, seed, sc = check(name, PROFILES[name], range(RUNS))
    if sc is not None:
        got = candidate(PROFILES[name], sc)
        pytest.fail(
            f"{n}/{RUNS} snapshots differ for {name}; seed {seed}, shrunk to:\n"
            f"{sc.describe()}\nold:     {reference(name, sc)}\nprofile: {got}"
        )


def test_the_corpus_reaches_every_rule() -> None:
    """The random snapshots exercise what the profiles must reproduce: respect_avoid changing
    a strategy's pairs (faults, anti-affinity), the greedy's ranked window of a big device class
    with a retry in it, a tenant cap refusing devices, aging reordering tasks, the limit."""
    seen: Counter[str] = Counter()
    for seed in range(RUNS):
        sc = scenario(seed)
        old = old_snapshot("fair_share", sc)
        for name in STRATEGIES:
            if list(OLD[name]().propose(old_snapshot(name, sc))) != reference(name, sc):
                seen[f"corrected:{name}"] += 1
        if any(t.effective_priority > t.priority for t in old.tasks()):
            seen["aged"] += 1
        if len(reference("fifo_match", sc)) == sc.limit < len(list(old.tasks())):
            seen["limit"] += 1
        classes = Counter(d.device_class for d in old.devices)
        if max(classes.values(), default=0) > 4 * sc.limit and any(
            t.avoid_devices or t.avoid_hosts for t in old.tasks()
        ):
            seen["window"] += 1
        by_id = {t.task_id: t for t in old.tasks()}
        held = Counter(by_id[t].tenant or "" for t, _ in reference("fair_share", sc))
        for n, share in sc.tenants.items():
            if share.max_devices and held[n] + share.held >= share.max_devices:
                seen["cap"] += 1
    for what in ("aged", "limit", "window", "cap", *(f"corrected:{n}" for n in STRATEGIES)):
        assert seen[what] >= 10, (what, seen)


def _changed(name: str, **changes: object) -> Profile:
    return replace(PROFILES[name], **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "name,changes",
    [
        # faults as a choosing score, instead of the old correction afterwards
        ("fifo_match", {"scores": (AntiAffinity(), FaultCount())}),
        ("fifo_match", {"refine": ()}),  # no correction at all
        ("fifo_match", {"scores": ()}),  # a retry chooses without anti-affinity
        ("priority_match", {"sort": PrioritySort()}),  # no aging
        ("fair_share", {"permits": ()}),  # no tenant cap
        ("lru_device", {"window": False}),  # every device of a big class, not its best
    ],
    ids=["faults_as_score", "no_refine", "no_anti_affinity", "no_aging", "no_cap", "no_window"],
)
def test_golden_check_catches_a_changed_profile(name: str, changes: dict[str, object]) -> None:
    """The comparison can fail: each plugin (and stage option) of a profile is needed for
    equality on some snapshots, and the check reports one of them shrunk."""
    n, _, sc = check(name, _changed(name, **changes), range(RUNS))
    assert n > 0 and sc is not None
    # (a window needs a class of more than 4 x limit devices)
    most = max(8, 4 * sc.limit + 1)
    assert len(sc.devices) <= most and sum(len(b.heads) for b in sc.buckets) <= 8, sc.describe()
