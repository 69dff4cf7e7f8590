"""Placing multi-device (gang) tasks: every role of a task gets an idle matching device of its
own in the same pass, committed all at once by ``lua/gang_assign.lua``, or none does.

A gang is planned before the single-device tasks of the pass, from the idle devices left
after hosts' health: one that cannot be placed takes nothing, so it never blocks the tasks
behind it. So that it cannot starve either (single tasks taking each device the moment it
frees), a gang that waited ``gang_reserve_after`` seconds *keeps* the idle devices matching
its roles out of other tasks' reach until the rest frees up, for at most
``gang_hold_seconds``; then it lets them go for another ``gang_reserve_after`` before it may
keep any again. What a gang keeps is written to the ``gang_holds`` hash (``explain`` shows
it). The wait is counted from when this scheduler first saw the task queued (a new leader
starts counting afresh: it never keeps devices earlier than the setting says)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import redis

from ..core.keys import Keys
from ..core.models import decode_roles, satisfies
from .strategies import IdleDevice

GANG_SCAN = 50
"""Queued multi-device tasks considered per pass, oldest first (bounded work per pass)."""

RoleNeed = tuple[str, str | None, frozenset[str]]  # role name, driver type, tags


@dataclass
class GangPlan:
    """One pass's decisions: the gangs to commit (task id, one device per role in role
    order) and the devices kept for gangs still waiting (not offered to other tasks)."""

    place: list[tuple[str, list[str]]] = field(default_factory=list)
    kept: dict[str, tuple[int, list[str]]] = field(default_factory=dict)  # id -> (until, devs)

    @property
    def used(self) -> set[str]:
        out = {d for _, devs in self.place for d in devs}
        for _, devs in self.kept.values():
            out.update(devs)
        return out


@dataclass
class _Waiting:
    since: int  # ms: when this scheduler first saw it queued
    hold_from: int | None = None  # ms: when it began keeping devices
    no_hold_until: int = 0  # ms: it may not keep devices before this (after a hold ran out)


class GangPlanner:
    """Plans the multi-device tasks of one pool (state between passes: role constraints by
    task id, and how long each has waited or kept devices)."""

    def __init__(self, r: redis.Redis, keys: Keys) -> None:
        self.redis = r
        self.keys = keys
        self._roles: dict[str, list[RoleNeed]] = {}
        self._waiting: dict[str, _Waiting] = {}
        self._written: dict[str, str] = {}  # gang_holds as this scheduler last wrote it
        self._reset = True  # rewrite gang_holds whole (another scheduler may have written it)

    @property
    def kept(self) -> bool:
        """Whether this scheduler keeps devices for a gang (or must clear what it wrote)."""
        return bool(self._written) or self._reset

    def forget_all(self) -> None:
        """A new leadership: waits are counted afresh, holds written again."""
        self._waiting.clear()
        self._written.clear()
        self._reset = True

    def roles(self, ids: Sequence[str]) -> dict[str, list[RoleNeed]]:
        """The role constraints of ``ids`` (read once per task: roles never change)."""
        missing = [t for t in ids if t not in self._roles]
        if missing:
            pipe = self.redis.pipeline(transaction=False)
            for t in missing:
                pipe.hget(self.keys.task(t), "roles")
            for t, spec in zip(missing, pipe.execute(), strict=True):
                roles = decode_roles(spec) or {}
                self._roles[t] = [(n, r.driver_type, frozenset(r.tags)) for n, r in roles.items()]
        if len(self._roles) > 4 * GANG_SCAN + 1000:
            keep = set(ids)
            self._roles = {t: v for t, v in self._roles.items() if t in keep}
        return {t: self._roles[t] for t in ids}

    def plan(
        self,
        waiting: Sequence[str],
        devices: Sequence[IdleDevice],
        now: int,
        reserve_after_ms: int,
        hold_ms: int,
    ) -> GangPlan:
        """Oldest first, give each waiting gang one unused matching device per role (the
        longest idle first); keep the partial picks of a gang past its reserve time."""
        out = GangPlan()
        present = set(waiting)
        for t in [t for t in self._waiting if t not in present]:
            del self._waiting[t]  # placed, cancelled or gone
        if not waiting:
            return out
        free = sorted(devices, key=lambda d: (d.faults, d.idle_since, d.device_id))
        used: set[str] = set()
        for gid, needs in self.roles(waiting).items():
            w = self._waiting.setdefault(gid, _Waiting(now))
            picks: list[str] = []
            for _, driver, tags in needs:
                ok = (x for x in free if satisfies(driver, tags, x.driver_type, x.tags))
                d = next((x for x in ok if x.device_id not in used), None)
                if d is None:
                    break
                picks.append(d.device_id)
                used.add(d.device_id)
            if needs and len(picks) == len(needs):
                out.place.append((gid, picks))
                continue
            if (
                picks
                and hold_ms > 0
                and now - w.since >= reserve_after_ms
                and now >= w.no_hold_until
            ):
                if w.hold_from is None:
                    w.hold_from = now
                if now - w.hold_from < hold_ms:
                    out.kept[gid] = (w.hold_from + hold_ms, picks)
                    continue
                # kept long enough: let go, and not again before reserve_after has passed
                w.hold_from, w.no_hold_until = None, now + reserve_after_ms
            used.difference_update(picks)
        return out

    def publish(self, kept: dict[str, tuple[int, list[str]]]) -> None:
        """Write what changed in ``gang_holds`` (one round trip, only on a change)."""
        want = {gid: f"{until}|{','.join(devs)}" for gid, (until, devs) in kept.items()}
        if want == self._written and not self._reset:
            return
        pipe = self.redis.pipeline(transaction=False)
        if self._reset:
            pipe.delete(self.keys.gang_holds)
            self._written, self._reset = {}, False
        gone = [gid for gid in self._written if gid not in want]
        if gone:
            pipe.hdel(self.keys.gang_holds, *gone)
        changed = [x for g, v in want.items() if self._written.get(g) != v for x in (g, v)]
        if changed:
            pipe.hset(self.keys.gang_holds, items=changed)
        pipe.execute()
        self._written = want
