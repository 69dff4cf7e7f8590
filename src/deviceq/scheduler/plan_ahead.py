"""Next-task hints, the scheduler's side (`AheadHints`): with ``TaskScheduler(plan_ahead=True)``
each pass, after its own plan and commit (idle devices are always served first), chooses the
next task of busy devices ahead of time and writes it on the device (``lua/plan_ahead.lua``: the
device's ``next_task`` field). The report that frees such a device assigns that task in the same
call, after checking it as an assignment is checked, and its claim part hands it to the host at
once: no scheduler pass and no host wake-up on the critical path of the next task.

A hint reserves nothing: the task stays queued, any pass may place it elsewhere, and a hint
whose task has left the queue (placed, cancelled) or no longer fits is dropped when the report
tries it (the device just goes idle). Which devices a pass hints (`candidates`):

- the devices it just committed tasks to (they are busy now, without a hint);
- the devices whose hint a report used (``ahead:want``, popped with the pass's base read:
  at most `WANT_POP` a pass), when this scheduler knows their row (a bounded memory of the
  idle devices its bases read);
- the busy devices that got no hint at an earlier pass (nothing matched then; at most
  `UNHINTED_MAX`);
- the busy devices hinted a task this pass placed on an idle device (that hint is dead: a new
  one replaces it).

Their next tasks come from a second plan of the same strategy over a base holding only those
devices, with the tasks this pass placed and the tasks hinted to other busy devices left out
(so two devices are not hinted one task). Multi-device tasks and preemption are not hinted.
All of this state is a best-effort memory: losing it (a restart, a new leader) only costs
hints, never a wrong assignment (every hint is checked again when used)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import TypeVar

from .placement.rows import IdleDevice, Pair

WANT_POP = 256
"""Devices taken from ``ahead:want`` per base read at most."""
WANTS_KEPT = 10_000
"""Devices taken from ``ahead:want`` and not hinted yet, kept at most (oldest dropped)."""
KNOWN_MAX = 10_000
"""Device rows remembered at most (the oldest seen dropped first)."""
UNHINTED_MAX = 256
"""Busy devices that got no hint, tried again at the next passes, at most."""
EXCLUDE_MAX = 2_000
"""Heads read in addition per pass at most, for the hinted tasks a hint plan leaves out."""


V = TypeVar("V")


def _trim(d: dict[str, V], most: int) -> None:
    """Drop the oldest entries of ``d`` (insertion order) beyond ``most``."""
    while len(d) > most:
        del d[next(iter(d))]


class AheadHints:
    """What one scheduler remembers between passes to hint busy devices: device rows, the
    hints it wrote that are not known to be used or dropped yet, the devices left without."""

    def __init__(self) -> None:
        self.known: dict[str, IdleDevice] = {}  # device id -> its row, as last read idle
        self.hinted: dict[str, tuple[str, str | None]] = {}  # device -> (task, bucket) hinted
        self.unhinted: dict[str, None] = {}  # busy devices a hint plan found no task for

    def forget_all(self) -> None:
        """Forget every hint written (e.g. on becoming the leader: another scheduler may have
        hinted meanwhile); the device rows stay (a device's row does not depend on who leads)."""
        self.hinted.clear()
        self.unhinted.clear()

    def observe(self, devices: Iterable[IdleDevice]) -> None:
        """Rows of idle devices (a pass's base): remembered. An idle device needs no hint and
        holds none of ours any more (the report that freed it took it)."""
        for d in devices:
            self.known.pop(d.device_id, None)
            self.known[d.device_id] = d
            self.hinted.pop(d.device_id, None)
            self.unhinted.pop(d.device_id, None)
        _trim(self.known, KNOWN_MAX)

    def candidates(
        self,
        committed: Iterable[IdleDevice],
        wanted: Iterable[str],
        skip: set[str],
        placed: Iterable[str] = (),
    ) -> list[IdleDevice]:
        """The devices to hint this pass: those just ``committed`` to, then the ``wanted`` ones
        (their hint was used), those left without a hint earlier and those hinted a task of
        ``placed`` (placed by this pass), when their row is known, but none of ``skip`` (e.g.
        idle now: the pass left it idle, nothing matched it)."""
        out = {d.device_id: d for d in committed}
        gone = set(placed)
        stale = [dev for dev, (task, _) in self.hinted.items() if task in gone] if gone else []
        for dev in [*wanted, *self.unhinted, *stale]:
            if dev in out or dev in skip:
                continue
            row = self.known.get(dev)
            if row is not None:
                out[dev] = row
        for dev in out:  # (its hint, if any, was used or taken: a new one replaces it)
            self.hinted.pop(dev, None)
        return list(out.values())

    def excluded(self, placed: Mapping[str, str | None]) -> tuple[set[str], Counter[str]]:
        """The tasks a hint plan leaves out (``placed``: task -> bucket, placed by this pass;
        and the tasks hinted to other busy devices), and per bucket how many more heads to
        read for them (at most `EXCLUDE_MAX` in all)."""
        tasks = dict(placed)
        for task, sig in self.hinted.values():
            tasks.setdefault(task, sig)
        extra: Counter[str] = Counter()
        for sig in tasks.values():
            if sig is not None and extra.total() < EXCLUDE_MAX:
                extra[sig] += 1
        return set(tasks), extra

    def wrote(
        self, pairs: list[Pair], candidates: list[IdleDevice], task_sig: Mapping[str, str]
    ) -> None:
        """A hint plan's ``pairs`` were written: remember them; the ``candidates`` left
        without one are tried again at the next passes."""
        got = {d: t for t, d in pairs}
        for c in candidates:
            task = got.get(c.device_id)
            if task is None:
                self.unhinted.pop(c.device_id, None)
                self.unhinted[c.device_id] = None
            else:
                self.unhinted.pop(c.device_id, None)
                self.hinted[c.device_id] = (task, task_sig.get(task))
        _trim(self.hinted, KNOWN_MAX)
        _trim(self.unhinted, UNHINTED_MAX)
