"""What async runners are built on: `LoopEvent` (a run's stop signal, a ``threading.Event``
that coroutines can await as well), `is_async_runner` (is a runner an ``async def``), and the
waits of the async command runner on file descriptors (a process's pidfd, a pipe) with the
event loop's selector: no thread, no child watcher."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import select
import threading
from collections.abc import Callable
from typing import Any


class LoopEvent(threading.Event):
    """A ``threading.Event`` whose `wait_async` a coroutine awaits: `set` (from any thread)
    wakes the waiting coroutines on their loops at once. A run's stop signal is one, so the
    watchdog thread that tells a runner to stop reaches thread and async runners alike; and
    `on_set` calls a function when it is set (a run's cancel request wakes the watchdog)."""

    def __init__(self) -> None:
        super().__init__()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._wlock = threading.Lock()
        self._on_set: list[Callable[[], None]] = []

    def set(self) -> None:
        super().set()
        with self._wlock:
            waiters, self._waiters = self._waiters, []
            calls, self._on_set = self._on_set, []
        for loop, fut in waiters:
            with contextlib.suppress(RuntimeError):  # (a loop already closed: nobody waits)
                loop.call_soon_threadsafe(_resolve, fut)
        for fn in calls:  # (in the setter's thread: they must be short and not block)
            fn()

    def on_set(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn`` once when this is set, in the setting thread (at once, here, if it is
        set already). Returns what takes it back (a call of it after ``fn`` ran does nothing)."""
        with self._wlock:
            if not self.is_set():
                self._on_set.append(fn)
                return lambda: self._forget(fn)
        fn()
        return lambda: None

    def _forget(self, fn: Callable[[], None]) -> None:
        with self._wlock, contextlib.suppress(ValueError):
            self._on_set.remove(fn)

    async def wait_async(self, timeout: float | None = None) -> bool:
        """Wait until set, at most ``timeout`` seconds (None: no limit); True when set."""
        if self.is_set():
            return True
        if timeout is not None and timeout <= 0:
            return False
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        entry = (loop, fut)
        with self._wlock:
            self._waiters.append(entry)
        try:
            if not self.is_set():  # (set between the first look and the registration)
                await asyncio.wait((fut,), timeout=timeout)
        finally:
            with self._wlock, contextlib.suppress(ValueError):
                self._waiters.remove(entry)
            fut.cancel()
        return self.is_set()


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def is_async_runner(runner: Any) -> bool:
    """Is ``runner`` (a function, or an object with ``__call__``) an ``async def``: its call
    returns a coroutine the host awaits on its event loop."""
    if inspect.iscoroutinefunction(runner):
        return True
    call = getattr(runner, "__call__", None)  # noqa: B004 - an instance's __call__
    return call is not None and inspect.iscoroutinefunction(call)


async def readable(fd: int, timeout: float | None) -> bool:
    """Wait until ``fd`` is readable (a pipe with data or at its end, a pidfd whose process
    exited), at most ``timeout`` seconds; True when it is."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[None] = loop.create_future()
    loop.add_reader(fd, _resolve, fut)
    try:
        await asyncio.wait((fut,), timeout=timeout)
    finally:
        loop.remove_reader(fd)
        fut.cancel()
    return _poll_readable(fd)


def _poll_readable(fd: int) -> bool:
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    try:
        return bool(poll.poll(0))
    except OSError:
        return True


async def first_of(timeout: float | None, *waits: asyncio.Future[Any] | asyncio.Task[Any]) -> None:
    """Wait until any of ``waits`` is done, at most ``timeout`` seconds (they are left as
    they are: the caller cancels what it no longer needs)."""
    await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)


def pidfd(pid: int) -> int | None:
    """A pidfd of child ``pid`` (readable once it exits; it is not reaped), or None where the
    kernel has none (then `process_exited` polls)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


async def process_exited(pid: int, pfd: int | None, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for child ``pid`` to exit, without reaping it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        left = deadline - loop.time()
        if left <= 0:
            return False
        if pfd is not None:
            await readable(pfd, left)
        else:
            await asyncio.sleep(min(0.02, left))
