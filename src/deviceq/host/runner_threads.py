"""Long-lived threads for runners: each run's runner goes to a thread that ran an earlier one.

Starting (and ending) a thread costs about 0.3 ms of CPU on the 2-core benchmark machine; with a
new thread per task that was a quarter of the host daemon's CPU per task. A runner that never
returns (abandoned after ``stop_grace``) keeps its thread, and the next run simply gets another
one. At most ``keep`` idle threads wait for work; a thread finding that many idle ends.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable


class RunnerThreads:
    """Hand a callable to an idle runner thread, or to a new one when none is idle."""

    def __init__(self, keep: int = 64) -> None:
        if keep < 0:
            raise ValueError("keep must be >= 0")
        self.keep = keep
        self.started = 0  # threads started in all (diagnostics, tests)
        self._lock = threading.Lock()
        self._idle: list[_Slot] = []

    def run(self, fn: Callable[[], None], name: str) -> None:
        """Run ``fn`` (which must not raise) in a runner thread named ``name``."""
        with self._lock:
            slot = self._idle.pop() if self._idle else None
            if slot is None:
                self.started += 1
        if slot is None:
            slot = _Slot(self)
            slot.give(fn, name)
            slot.thread.start()
        else:
            slot.give(fn, name)

    @property
    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

    def _rest(self, slot: _Slot) -> bool:
        """Put ``slot`` back among the idle ones; False when enough are idle (it ends)."""
        with self._lock:
            if len(self._idle) >= self.keep:
                return False
            self._idle.append(slot)
            return True


class _Slot:
    """One runner thread and the job it has been given. The thread waits for its next job on
    a lock held until `give` releases it (a slot is given a job only while its thread waits
    for one: idle, or new): one wake-up, no condition and no lock made per job."""

    def __init__(self, owner: RunnerThreads) -> None:
        self.owner = owner
        self.job: Callable[[], None] | None = None
        self.given = threading.Lock()
        self.given.acquire()  # (released by give)
        self.thread = threading.Thread(target=self._loop, name="runner", daemon=True)

    def give(self, fn: Callable[[], None], name: str) -> None:
        self.thread.name = name
        self.job = fn
        self.given.release()

    def _loop(self) -> None:
        while True:
            self.given.acquire()
            fn, self.job = self.job, None
            assert fn is not None  # (give sets the job before it releases the lock)
            with contextlib.suppress(Exception):  # the runner's wrapper catches all: belt, braces
                fn()
            self.thread.name = "runner"
            if not self.owner._rest(self):
                return
