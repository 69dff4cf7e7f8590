"""Planning one pass: the configured strategy's proposal, checked and corrected. Pure Python
over a snapshot: no Redis access (the commit re-validates every pair anyway)."""

from __future__ import annotations

from .strategies import AssignmentStrategy, IdleDevice, Pair, QueuedTask, Snapshot


def plan(
    strategy: AssignmentStrategy, snap: Snapshot, *, avoiding: bool = True
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
