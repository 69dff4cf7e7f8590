"""The event loop a host runs its async runners on: one loop in one thread, started on first
use, for every async run of a daemon (`deviceq.host.execution.Executor.execute_async`). A run
costs a coroutine on it, not a thread: what a thread runner's run costs in hand-offs between
threads (a fifth of the host daemon's CPU per task) is gone, and a thousand runs that mostly
wait (adb, HTTP, Appium) share one thread."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_LOG = logging.getLogger("deviceq.worker")


class RunnerLoop:
    """One asyncio event loop in a daemon thread of its own; `spawn` starts a coroutine on it
    from any thread. A coroutine that raises is logged (the host's runs catch everything:
    this is a last guard)."""

    def __init__(self, name: str = "async-runners", blocking_workers: int = 32) -> None:
        self.name = name
        # what the runs hand off to a thread (``asyncio.to_thread``: a multi-device task's
        # part held for the whole attempt, a hand-back's answer, a last flush): threads made
        # as needed up to this many, enough for every run to wait at once (asyncio's own
        # default, a few threads, would make the runs wait for each other)
        self.blocking_workers = blocking_workers
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._jobs: set[asyncio.Task[Any]] = set()  # running, kept referenced
        self._pending: list[Callable[[], Coroutine[Any, Any, Any]]] = []  # to start
        self._waking = False  # the loop has been woken to start what is pending

    def spawn(self, make: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        """Run the coroutine ``make()`` returns on the loop (made there, at once). The runs
        of one claim wake the loop once, not once each."""
        loop = self.loop()
        with self._lock:
            self._pending.append(make)
            if self._waking:
                return
            self._waking = True
        loop.call_soon_threadsafe(self._start_pending)

    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop, started in its thread on first use."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                loop.set_default_executor(
                    ThreadPoolExecutor(self.blocking_workers, thread_name_prefix=self.name)
                )
                ready = threading.Event()
                self._thread = threading.Thread(
                    target=self._run, args=(loop, ready), name=self.name, daemon=True
                )
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    @property
    def running(self) -> int:
        """Coroutines started and not yet ended (diagnostics, tests)."""
        return len(self._jobs)

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def _start_pending(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
            self._waking = False
        loop = asyncio.get_running_loop()
        for make in pending:
            job = loop.create_task(make())
            self._jobs.add(job)
            job.add_done_callback(self._ended)

    def _ended(self, job: asyncio.Task[Any]) -> None:
        self._jobs.discard(job)
        exc = None if job.cancelled() else job.exception()
        if exc is not None:
            _LOG.error("async run failed", exc_info=(type(exc), exc, exc.__traceback__))

    @staticmethod
    def _run(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        loop.run_forever()
