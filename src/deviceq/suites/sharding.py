"""Splitting a suite's tests into shards: balanced on the tests' estimated durations
(longest first onto the least loaded shard, so the critical path stays short), the fewest
shards that meet a deadline, and round-robin (what the benchmark compares against)."""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Mapping, Sequence

from ..core.errors import InvalidInput
from .model import DEFAULT_TEST_S


class Unsatisfiable(InvalidInput):
    """The deadline cannot be met with the devices allowed or matching now."""


def estimates(tests: Sequence[str], history: Mapping[str, float]) -> dict[str, float]:
    """Each test's estimated duration (seconds): its history, else the median of the known
    ones among ``tests`` (of the whole history when none of them is known; `DEFAULT_TEST_S`
    without any history)."""
    known = [history[t] for t in tests if t in history]
    if not known and history:
        known = list(history.values())
    median = statistics.median(known) if known else DEFAULT_TEST_S
    return {t: history.get(t, median) for t in tests}


def balance(tests: Sequence[str], est: Mapping[str, float], shards: int) -> list[list[str]]:
    """``tests`` split into at most ``shards`` non-empty shards, longest first onto the least
    loaded shard (LPT: within 4/3 of the best makespan). Each shard keeps the tests' given
    order. Deterministic: ties go by the test's place in ``tests``."""
    n = max(1, min(shards, len(tests)))
    place = {t: i for i, t in enumerate(tests)}
    heap = [(0.0, i) for i in range(n)]
    owner: dict[str, int] = {}
    for t in sorted(tests, key=lambda t: (-est[t], place[t])):
        load, i = heapq.heappop(heap)
        owner[t] = i
        heapq.heappush(heap, (load + est[t], i))
    out: list[list[str]] = [[] for _ in range(n)]
    for t in tests:
        out[owner[t]].append(t)
    return [s for s in out if s]


def round_robin(tests: Sequence[str], shards: int) -> list[list[str]]:
    """``tests`` dealt in turn onto ``shards`` shards (no history used)."""
    n = max(1, min(shards, len(tests)))
    return [list(tests[i::n]) for i in range(n)]


def load(shard: Sequence[str], est: Mapping[str, float]) -> float:
    return sum(est[t] for t in shard)


def makespan(shards: Sequence[Sequence[str]], est: Mapping[str, float]) -> float:
    """The longest shard's estimated duration (one device each)."""
    return max((load(s, est) for s in shards), default=0.0)


def ideal(est: Mapping[str, float], devices: int) -> float:
    """The best any split can do on ``devices`` devices: the total over the devices, or the
    longest test."""
    return max(sum(est.values()) / max(devices, 1), max(est.values(), default=0.0))


def shards_for_deadline(
    tests: Sequence[str],
    est: Mapping[str, float],
    deadline_s: float,
    max_devices: int,
    matching: int,
    overhead_s: float = 0.0,
) -> int:
    """The fewest shards whose balanced split finishes within ``deadline_s`` (each shard
    also paying ``overhead_s`` to start), at most ``max_devices`` and at most the ``matching``
    devices. Unsatisfiable, saying how many devices it needs and how many match, otherwise."""
    if deadline_s <= overhead_s:
        raise Unsatisfiable(f"unsatisfiable: a deadline of {deadline_s:g}s leaves no time to run")
    longest = max(est[t] for t in tests)
    if longest + overhead_s > deadline_s:
        raise Unsatisfiable(
            f"unsatisfiable: the longest test takes {longest:.0f}s, more than the deadline "
            f"({deadline_s:.0f}s)"
        )
    start = max(1, math.ceil(sum(est.values()) / (deadline_s - overhead_s)))
    needs = None
    for n in range(start, len(tests) + 1):
        if makespan(balance(tests, est, n), est) + overhead_s <= deadline_s:
            needs = n
            break
    needs = needs or len(tests)
    allowed = min(max_devices, matching)
    if needs > allowed:
        why = f"{matching} match" if matching <= max_devices else f"--max-devices is {max_devices}"
        raise Unsatisfiable(f"unsatisfiable: needs {needs} devices, {why}")
    return needs
