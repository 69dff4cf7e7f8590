"""The strategies the built-in placement profiles replaced, as they were, kept as the golden
tests' reference: each old built-in strategy's ``propose`` and the old planning step (its
checks and the anti-affinity and flaky-device correction, ``respect_avoid``)."""

from __future__ import annotations

import heapq

from deviceq.scheduler.placement.rows import IdleDevice, Pair, QueuedTask, Snapshot, TenantShare


class FifoMatch:
    """Oldest queued task that has a matching idle device first; the matching device with the
    smallest ``device_id`` (string order)."""

    name = "fifo_match"

    def propose(self, snapshot: Snapshot) -> list[Pair]:
        return snapshot.greedy(snapshot.tasks_by_seq(), device_key=lambda d: d.device_id)


class PriorityMatch:
    """Highest effective priority (9..0: ``priority`` raised by aging, see the pool setting
    ``aging_seconds``) first, oldest first within a priority; the matching device with the
    smallest ``device_id``."""

    name = "priority_match"

    def propose(self, snapshot: Snapshot) -> list[Pair]:
        order = sorted(snapshot.tasks(), key=lambda t: (-t.aged_priority, t.seq))
        return snapshot.greedy(order, device_key=lambda d: d.device_id)


class LeastRecentlyUsedDevice:
    """Oldest task first; the matching device idle the longest (spreads load over devices)."""

    name = "lru_device"

    def propose(self, snapshot: Snapshot) -> list[Pair]:
        return snapshot.greedy(
            snapshot.tasks_by_seq(), device_key=lambda d: (d.idle_since, d.device_id)
        )


class FairShare:
    """Tenants share contended devices in proportion to their weights (pool setting per
    tenant: `PoolAdmin.set_tenant`, ``deviceq tenant set``), on top of priority and aging.

    A pass hands out devices one at a time: to the next task (highest effective priority,
    then oldest) of the tenant whose tasks hold the fewest devices per unit of weight
    (``held / weight``, counting what this pass already gave it), so, like deficit round
    robin, a tenant of weight 3 ends up holding three devices for every one a tenant of
    weight 1 holds while both have work waiting. A higher effective priority still goes
    first across tenants. A tenant at its ``max_devices`` cap gets nothing more (the commit
    enforces the cap too: ``tenant_cap``). Tasks without a tenant form one tenant of weight 1.
    A task with no free matching device is skipped and never blocks its tenant's others.
    Device choice as in ``fifo_match`` (smallest ``device_id``), preferring devices and hosts
    a retry has not failed on."""

    name = "fair_share"
    uses_tenants = True  # the snapshot reads the tenants' weights, caps and held devices

    def propose(self, snapshot: Snapshot) -> list[Pair]:
        none = TenantShare()
        queues: dict[str, list[QueuedTask]] = {}
        for t in snapshot.tasks():
            queues.setdefault(t.tenant or "", []).append(t)
        for q in queues.values():  # best last: popped from the end
            q.sort(key=lambda t: (t.aged_priority, -t.seq))
        held = {n: snapshot.tenants.get(n, none).held for n in queues}
        heap: list[tuple[int, float, int, str]] = []

        def push(name: str) -> None:
            share = snapshot.tenants.get(name, none)
            if not queues[name] or (share.max_devices and held[name] >= share.max_devices):
                return
            t = queues[name][-1]
            heapq.heappush(heap, (-t.aged_priority, held[name] / max(1, share.weight), t.seq, name))

        for name in queues:
            push(name)
        used: set[str] = set()
        pos: dict[int, int] = {}
        pairs: list[Pair] = []
        while heap and len(pairs) < snapshot.limit:
            name = heapq.heappop(heap)[3]
            task = queues[name].pop()
            device = self._device(snapshot, task, used, pos)
            if device is not None:
                used.add(device)
                pairs.append((task.task_id, device))
                held[name] += 1
            push(name)
        return pairs

    @staticmethod
    def _device(
        snap: Snapshot, task: QueuedTask, used: set[str], pos: dict[int, int]
    ) -> str | None:
        """The unused matching device with the smallest id (the best anti-affinity rank
        first for a retry). ``pos`` is kept per matching list (buckets of one device class
        share theirs), so the used devices at its front are skipped once, not per bucket."""
        devs = snap.matching.get(task.sig, [])
        if task.avoid_devices or task.avoid_hosts:
            free = [d for d in devs if d.device_id not in used]
            best = min(free, key=lambda d: (task.avoid_rank(d), d.device_id), default=None)
            return None if best is None else best.device_id
        i = pos.get(id(devs), 0)
        while i < len(devs) and devs[i].device_id in used:
            i += 1
        pos[id(devs)] = i
        return devs[i].device_id if i < len(devs) else None


OLD: dict[str, type] = {
    "fifo_match": FifoMatch,
    "priority_match": PriorityMatch,
    "lru_device": LeastRecentlyUsedDevice,
    "fair_share": FairShare,
}


def plan(
    strategy: FifoMatch | PriorityMatch | LeastRecentlyUsedDevice | FairShare,
    snap: Snapshot,
    *,
    avoiding: bool = True,
) -> tuple[list[Pair], int]:
    """Ask the strategy for pairs; keep the valid ones (at most ``snap.limit``): pairs naming a
    task or device not in the snapshot, a device or a task twice, or a device that does not
    satisfy the task's constraints are dropped (``strategy_invalid``). Then anti-affinity is
    enforced for every strategy (``respect_avoid``) when some queued task has a record
    (``avoiding``), and devices with recent device faults are offered last. Returns the pairs
    and the number dropped."""
    proposed = list(strategy.propose(snap)) if snap.buckets and snap.devices else []
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
    if avoiding or any(d.faults for d in snap.devices):
        pairs = respect_avoid(snap, pairs, used_d)
    return pairs, dropped


def respect_avoid(snap: Snapshot, pairs: list[Pair], used: set[str]) -> list[Pair]:
    """Anti-affinity and flaky devices last, for every strategy: a task paired with a device
    (or host) it lost an attempt on, or with a device that has recent device faults, gets an
    unused matching device it has not failed on, with fewer faults, instead, when the
    snapshot has one (the same device only when nothing else matches)."""
    heads = {t.task_id: (b, t) for b in snap.buckets for t in b.heads}
    by_id = {d.device_id: d for d in snap.devices}
    out: list[Pair] = []
    for task_id, device_id in pairs:
        b, t = heads[task_id]

        def rank(d: IdleDevice, t: QueuedTask = t) -> tuple[int, int]:
            return (t.avoid_rank(d), d.faults)

        now = rank(by_id[device_id])
        if now != (0, 0):
            better = min(
                (d for d in snap.matching[b.sig] if d.device_id not in used),
                key=rank,
                default=None,
            )
            if better is not None and rank(better) < now:
                used.discard(device_id)
                used.add(better.device_id)
                device_id = better.device_id
        out.append((task_id, device_id))
    return out
