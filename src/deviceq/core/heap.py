"""The cyclic garbage collector of a long-running daemon (``deviceq host run``, ``deviceq
scheduler run``, ``deviceq api``), set once its startup is done (`settle`).

- **Startup objects are frozen** (``gc.freeze``): modules, classes, functions and pydantic's
  schemas are most of the heap and live as long as the process; a full collection then walks
  only what was made since (it walked every one of them: ~25 ms a time on the benchmark
  machine).
- **The young generation is collected every `YOUNG_THRESHOLD` allocations** instead of 700.
  Nearly every per-task object (a run, its events, a report) is freed by its reference count
  when the task ends; at 700 a host daemon with 100 devices collected every second or third
  task, walking every running task's objects each time (~50 µs of its CPU per task in all).

Cyclic garbage is still collected, just in larger, rarer batches. Objects freed by reference
count are freed at once as before; only a frozen object that becomes part of a cycle stays
allocated (startup objects are never dropped)."""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000
"""Allocations (less deallocations) of container objects between young collections."""


def settle() -> None:
    """Freeze what the process holds now out of the collector's reach and raise the young
    generation's threshold (the older generations keep theirs). Call it once, when a
    daemon's startup is done; it only tunes the collector of the process that calls it."""
    gc.collect()  # (what startup left as garbage is not frozen with the rest)
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
