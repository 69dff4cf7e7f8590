"""Placing multi-device (gang) tasks with a profile: the same sort, filters, scores and permits
as single-device tasks, a role at a time, and a `GangPermit` for the task as a whole.

A pass over the waiting gangs (`place_gangs`):

1. **order**: each gang is a task of its own to the profile's `QueueSort`: its id, ``seq``
   (its place in ``gangs``), priority (aged from its submit time when aging is on) and
   tenant, in a bucket of the gangs of its priority and tenant (`GangView`). So FIFO, priority
   with aging and fair share order gangs as they order single tasks, and fair share counts
   every device a gang was given;
2. **pick**: each role is a `Requirement`; the profile's filters give its device classes and
   its scores rank their unused devices (unused: not given to or kept for an earlier gang of
   the pass). A role is scored as the part task ``GANG.ROLE``, so an anti-affinity record of
   that part (the device and host it lost an attempt on) applies to that role only. A gang
   has no later step to refine in (its roles are committed together), so the profile's
   ``refine`` scores are applied while choosing, ahead of its ``scores`` (as refining ranks
   them: faults before least recently used), then ``device_id``. The roles share the devices
   by a small matching: each role's best ``len(roles)`` unused devices are enough to find a
   device for every role whenever one exists, and a role keeps its best device unless a
   more constrained role needs it;
3. **permits**: the profile's pass permits judge the gang's devices together (a
   `GangPassPermit`, e.g. the tenant cap counts every role's device), else per device; a
   refusal takes nothing;
4. **decide**: the `GangPermit` allows the whole pick, denies it (nothing is taken), or waits
   (the devices picked so far are kept out of later gangs' reach this pass).

Cost per gang: per role, its feasible classes' first unused ranked devices (pointers, as the
single-task pass), or for a role with an anti-affinity record a scan of each class up to
``len(roles)`` devices nothing penalises; a class is ranked once per pass, when a role
first asks for it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from ...core.attributes import Value
from ...core.where import Clause, matches_all
from .plugins import (
    DeviceScore,
    GangDecision,
    GangPassPermit,
    GangPermit,
    PassPermit,
    Requirement,
    Score,
    TaskScore,
)
from .profiles import Profile
from .rows import Bucket, IdleDevice, QueuedTask, TenantShare, aged
from .view import Avoid, DeviceClass, LimitLoad, View


class MissingGangInputs(ValueError):
    """The gang view lacks optional inputs the profile's or the gang permit's plugins need."""


@dataclass(frozen=True)
class Role:
    """One role of a gang: its name and what it asks of a device (a `Requirement`)."""

    name: str
    driver_type: str | None
    tags: frozenset[str] = frozenset()
    where: tuple[Clause, ...] = ()  # its --where clauses: its device's attributes satisfy them


@dataclass(frozen=True)
class Gang:
    """A waiting multi-device task: its roles in role order, its place in ``gangs`` (``seq``),
    priority, tenant, submit time (ms, for aging) and how long it has been seen waiting (ms,
    for the gang permit)."""

    gang_id: str
    seq: int
    roles: tuple[Role, ...]
    priority: int = 0
    tenant: str | None = None
    submitted_at: int = 0
    waited_ms: int = 0

    def part_id(self, role: Role) -> str:
        """The part task that runs ``role`` (``GANG.ROLE``)."""
        return f"{self.gang_id}.{role.name}"


@dataclass(frozen=True)
class GangPick:
    """One gang's outcome in a pass: the decision and one (role name, device or None) per
    role, in role order (what was picked, whether or not it is taken)."""

    gang_id: str
    decision: GangDecision
    picks: tuple[tuple[str, IdleDevice | None], ...]

    @property
    def devices(self) -> list[str]:
        """The ids of the devices picked, in role order (every role's when allowed)."""
        return [d.device_id for _, d in self.picks if d is not None]


@dataclass(frozen=True)
class GangView:
    """The gangs of a pass and the `View` their placement plugins read: each gang a head task
    (id, seq, priority, tenant) of a bucket of the gangs of its priority and tenant; every
    optional input present (``avoid`` keyed by part task id ``GANG.ROLE``)."""

    gangs: Mapping[str, Gang]
    view: View

    @classmethod
    def build(
        cls,
        gangs: Iterable[Gang],
        devices: Iterable[IdleDevice],
        now_ms: int,
        *,
        aging_ms: int = 0,
        tenants: Mapping[str, TenantShare] | None = None,
        avoid: Mapping[str, Avoid] | None = None,
        limits: Mapping[str, LimitLoad] | None = None,
        attributes: Mapping[str, Mapping[str, Value]] | None = None,
        prefer: tuple[str, str] = ("none", ""),
        runs: Mapping[str, int] | None = None,
    ) -> GangView:
        """``limits``: each declared limit's bound and counts (`View.limits`; none: no limit
        is set). ``attributes``, ``prefer``, ``runs``: the devices' attributes (the roles'
        --where clauses, the pool's ``prefer`` score), the pool's ``prefer`` and, with
        least_used, each device's runs in the last 24 h (`View`)."""
        by_id: dict[str, Gang] = {}
        groups: dict[tuple[int, str], list[QueuedTask]] = {}
        for g in gangs:
            if g.gang_id in by_id:
                continue
            by_id[g.gang_id] = g
            sig = f"gang:{g.priority}:{g.tenant or ''}"
            eff = aged(g.priority, g.submitted_at, now_ms, aging_ms) if aging_ms > 0 else -1
            task = QueuedTask(g.gang_id, g.seq, sig, g.priority, effective_priority=eff,
                              tenant=g.tenant)  # fmt: skip
            groups.setdefault((g.priority, g.tenant or ""), []).append(task)
        buckets = []
        for (prio, tenant), tasks in sorted(groups.items()):
            tasks.sort(key=_seq)
            buckets.append(
                Bucket(
                    tasks[0].sig,
                    None,
                    frozenset(),
                    prio,
                    tuple(tasks),
                    tasks[0].seq,
                    tenant=tenant or None,
                )  # fmt: skip
            )
        devs = tuple(devices)
        view = View(
            tuple(buckets),
            devs,
            max(1, len(by_id)),
            now_ms,
            tenants=tenants or {},
            submit_times={g.gang_id: g.submitted_at for g in by_id.values()},
            aging_ms=aging_ms,
            avoid=avoid or {},
            faults={d.device_id: d.faults for d in devs if d.faults},
            limits=limits or {},
            attributes=attributes or {},
            prefer=prefer,
            runs=runs,
        )
        return cls(by_id, view)


def gang_scores(profile: Profile) -> tuple[Score, ...]:
    """The scores a gang's role is ranked by: the profile's ``refine`` scores, then its
    ``scores`` (each plugin once), then ``device_id``."""
    out: list[Score] = []
    for s in (*profile.refine, *profile.scores):
        if s not in out:
            out.append(s)
    return tuple(out)


def place_gangs(profile: Profile, gv: GangView, permit: GangPermit) -> list[GangPick]:
    """Every gang of ``gv`` in the profile's order, with its decision and picks; the devices
    of an allowed or waiting gang are not offered to the gangs after it."""
    view = gv.view
    missing = (profile.needs | permit.needs) - view.inputs
    if missing:
        raise MissingGangInputs(
            f"profile {profile.name!r} needs gang view inputs it lacks: "
            + ", ".join(sorted(missing))
        )
    if not gv.gangs:
        return []
    picker = _Picker(profile, view)
    order = profile.sort.order(view)
    states = [s for s in (p.start(view) for p in profile.permits) if s is not None]
    whole = [isinstance(s, GangPassPermit) for s in states]
    used: set[str] = set()
    for s in states:
        used.update(s.closed())  # (devices no gang may take this pass: a host at its cap)
    out: list[GangPick] = []
    for task in order:
        gang = gv.gangs.get(task.task_id)
        if gang is None:
            continue
        picks = picker.pick(gang, task, used) if view.devices else _none(gang)
        devs = [d for _, d in picks]
        if not all(_allows(s, w, task, devs) for s, w in zip(states, whole, strict=True)):
            decision = GangDecision.DENY
        else:
            decision = permit.permit(view, gang.gang_id, picks, gang.waited_ms)
            if decision is GangDecision.ALLOW and (not devs or any(d is None for d in devs)):
                decision = GangDecision.DENY  # (a permit cannot allow an incomplete pick)
        if decision is GangDecision.ALLOW:
            for d in devs:
                assert d is not None
                used.add(d.device_id)
                order.placed(task, d)
                for s in states:
                    s.placed(task, d)
                    used.update(s.closed())
        elif decision is GangDecision.WAIT:
            used.update(d.device_id for d in devs if d is not None)
        out.append(GangPick(gang.gang_id, decision, picks))
    return out


def _allows(
    state: PassPermit, whole: bool, task: QueuedTask, devs: Sequence[IdleDevice | None]
) -> bool:
    if whole:
        return state.allows_gang(task, devs)  # type: ignore[attr-defined]
    return all(state.allows(task, d) for d in devs if d is not None)


def _none(gang: Gang) -> tuple[tuple[str, IdleDevice | None], ...]:
    return tuple((r.name, None) for r in gang.roles)


class _Picker:
    """One pass's device classes, each ranked once by the device scores of `gang_scores`, and the
    choice of each gang's roles' devices among the unused ones."""

    def __init__(self, profile: Profile, view: View) -> None:
        self.view = view
        self.filters = profile.filters
        scores = gang_scores(profile)
        self.kinds: list[TaskScore | None] = [
            s if isinstance(s, TaskScore) else None for s in scores
        ]
        self.task_scores = [s for s in self.kinds if s is not None]
        n_task = len(self.task_scores)
        # the task scores come before every device score: a class's scan may stop early
        self.task_first = all(k is not None for k in self.kinds[:n_task])
        # (protocol isinstance checks are slow: done once per pass, not per device)
        self.static_scores = [
            cast(DeviceScore, s) for s, k in zip(scores, self.kinds, strict=True) if k is None
        ]
        self.static: dict[str, tuple[int, ...]] = {}  # of the devices of the ranked classes
        by_class: dict[DeviceClass, list[IdleDevice]] = {}
        for d in view.devices:  # (in device_id order)
            c = (d.driver_type, d.tags)
            got = by_class.get(c)
            if got is None:
                by_class[c] = [d]
            else:
                got.append(d)
        self.by_class = by_class
        self._ranked: dict[DeviceClass, list[IdleDevice]] = {}
        self.pos: dict[DeviceClass, int] = {}
        self._classes: dict[tuple[str | None, frozenset[str]], list[DeviceClass]] = {}

    def ranked(self, c: DeviceClass) -> list[IdleDevice]:
        """Class ``c``'s devices by their device score keys, then device_id (ranked the first
        time a role asks for the class)."""
        got = self._ranked.get(c)
        if got is None:
            devs, view, static = self.by_class[c], self.view, self.static_scores
            keys = [tuple(s.device_key(view, d) for s in static) for d in devs]
            self.static.update((d.device_id, k) for d, k in zip(devs, keys, strict=True))
            if any(keys):
                # (key, index): the devices are in device_id order already
                order = sorted(range(len(devs)), key=keys.__getitem__)
                got = [devs[i] for i in order]
            else:
                got = devs
            self._ranked[c] = got
            self.pos[c] = 0
        return got

    def classes_for(self, need: Requirement) -> list[DeviceClass]:
        """The device classes the filters accept for a role (once per driver type and tags)."""
        k = (need.driver_type, need.tags)
        got = self._classes.get(k)
        if got is None:
            got = [c for c in self.by_class if all(f.feasible(need, c) for f in self.filters)]
            self._classes[k] = got
        return got

    def pick(
        self, gang: Gang, task: QueuedTask, used: set[str]
    ) -> tuple[tuple[str, IdleDevice | None], ...]:
        """A device per role (None where the unused devices leave none), as many roles served
        as the unused devices allow."""
        n = len(gang.roles)
        cands: list[list[IdleDevice]] = []
        sizes: list[int] = []
        for role in gang.roles:
            classes = self.classes_for(role)
            sizes.append(sum(len(self.by_class[c]) for c in classes))
            part = replace(task, task_id=gang.part_id(role))
            cands.append(self.best(part, classes, used, n, role.where))
        # the most constrained roles first: they keep their best device
        first = sorted(range(n), key=lambda i: (len(cands[i]), sizes[i], i))
        got = _match(cands, first)
        return tuple((r.name, got[i]) for i, r in enumerate(gang.roles))

    def best(
        self,
        part: QueuedTask,
        classes: list[DeviceClass],
        used: set[str],
        n: int,
        where: tuple[Clause, ...] = (),
    ) -> list[IdleDevice]:
        """The ``n`` best unused devices of ``classes`` for the role's part task ``part``
        whose attributes satisfy the role's ``where`` clauses, best first."""
        view = self.view
        attrs = view.attributes or {}
        live = [s for s in self.task_scores if s.applies(view, part)]
        entries: list[tuple[Any, str, IdleDevice]] = []
        static, n_task = self.static, len(self.task_scores)
        for c in classes:
            devs = self.ranked(c)
            i, end = self.pos[c], len(devs)
            while i < end and devs[i].device_id in used:
                i += 1
            self.pos[c] = i  # (used only grows in a pass)
            found = 0  # unused devices taken (no live task score) or ideal ones seen
            for j in range(i, end):
                d = devs[j]
                did = d.device_id
                if did in used:
                    continue
                if where and not matches_all(where, attrs.get(did, {})):
                    continue
                if not live:  # the ranked order is the key order: the first n unused
                    entries.append((static[did], did, d))
                    found += 1
                else:
                    key = self.key(part, d, live)
                    entries.append((key, did, d))
                    if self.task_first and not any(key[:n_task]):
                        found += 1  # nothing later in this class beats it
                if found == n:
                    break
        entries.sort(key=_entry)
        return [d for _, _, d in entries[:n]]

    def key(self, part: QueuedTask, d: IdleDevice, live: list[TaskScore]) -> tuple[int, ...]:
        """The role's keys for ``d`` in `gang_scores` order (a task score that does not apply
        to ``part`` is 0)."""
        view, static = self.view, self.static[d.device_id]
        out: list[int] = []
        k = 0
        for s in self.kinds:
            if s is None:
                out.append(static[k])
                k += 1
            else:
                out.append(s.task_key(view, part, d) if any(s is x for x in live) else 0)
        return tuple(out)


def _match(cands: list[list[IdleDevice]], first: list[int]) -> list[IdleDevice | None]:
    """A device per role from its candidates (best first), as many roles as can be served:
    roles in ``first`` order each take their best free candidate, and a role whose candidates
    are all taken moves an earlier role to another of its candidates when it can (augmenting
    paths). With at least ``len(roles)`` candidates per role (or all it has), a device for
    every role is found whenever one exists."""
    got: list[IdleDevice | None] = [None] * len(cands)
    owner: dict[str, int] = {}

    def augment(r: int, seen: set[str]) -> bool:
        for d in cands[r]:  # a free candidate first
            if d.device_id not in owner:
                owner[d.device_id], got[r] = r, d
                return True
        for d in cands[r]:
            did = d.device_id
            if did in seen:
                continue
            seen.add(did)
            if augment(owner[did], seen):
                owner[did], got[r] = r, d
                return True
        return False

    for r in first:
        augment(r, set())
    return got


def _entry(e: tuple[Any, str, IdleDevice]) -> tuple[Any, str]:
    return (e[0], e[1])


def _seq(t: QueuedTask) -> int:
    return t.seq
