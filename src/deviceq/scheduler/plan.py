"""Planning one pass of a registered whole-pass strategy (``propose``): its proposal, checked
and corrected. Pure Python over a snapshot: no Redis access (the commit re-validates every pair
anyway). A built-in strategy is a placement profile, whose pipeline gives valid, corrected
pairs by construction (`deviceq.scheduler.placement.pipeline.place`)."""

from __future__ import annotations

from .placement.builtin import FifoSort
from .placement.builtin.anti_affinity import waits
from .placement.pipeline import refine
from .placement.profiles import REFINE, Profile
from .placement.rows import Pair, Snapshot
from .placement.view import View
from .strategies import AssignmentStrategy, ProfileStrategy

CORRECTION = Profile("correction", FifoSort(), refine=REFINE)
"""What corrects a whole-pass strategy's pairs: the built-in profiles' refine stage
(anti-affinity, then faulty devices last)."""


def plan(
    strategy: AssignmentStrategy, snap: Snapshot, *, avoiding: bool = True
) -> tuple[list[Pair], int]:
    """Ask the strategy for pairs; keep the valid ones (at most ``snap.limit``): pairs naming a
    task or device not in the snapshot, a device or a task twice, or a device that does not
    satisfy the task's constraints are dropped (``strategy_invalid``). Then, when some queued
    task has an anti-affinity record (``avoiding``) or some device has recent device faults,
    the pairs are corrected as the built-in profiles' are (`CORRECTION`): a task paired with
    a device or host it lost an attempt on, or with a faulty device, gets a better unused
    matching device when the snapshot has one. Returns the pairs and the number dropped."""
    if not snap.buckets or not snap.devices:
        return [], 0
    if isinstance(strategy, ProfileStrategy):
        return strategy.propose(snap), 0
    proposed = list(strategy.propose(snap))
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
        pairs = refine(CORRECTION, View.from_snapshot(snap), pairs)
    if avoiding:  # a retry waiting for another device takes none it failed on (RetryElsewhere)
        heads = {t.task_id: t for b in snap.buckets for t in b.heads}
        kept = [p for p in pairs if not waits(heads[p[0]], devices[p[1]], snap.now_ms)]
        pairs = kept
    return pairs, dropped
