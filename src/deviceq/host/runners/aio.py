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

_LOCK = threading.Lock()
"""Guards every `LoopEvent`'s waiters and call-backs, and the making of its condition: their
sections are a few list operations, and an event made per run then makes no lock of its
own."""


class LoopEvent(threading.Event):
    """A ``threading.Event`` whose `wait_async` a coroutine awaits: `set` (from any thread)
    wakes the waiting coroutines on their loops at once. A run's stop signal is one, so the
    watchdog thread that tells a runner to stop reaches thread and async runners alike; and
    `on_set` calls a function when it is set (a run's cancel request wakes the watchdog).

    The condition a thread waits on is made by the first `wait` that has to block: a run
    makes a few of these events, and most of them are never waited on (a stop signal that
    never comes), or only set."""

    def __init__(self) -> None:  # (no Event.__init__: its condition is made when needed)
        self._flag = False
        self._cv: threading.Condition | None = None
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._on_set: list[Callable[[], None]] | None = None

    def is_set(self) -> bool:
        return self._flag

    def _condition(self) -> threading.Condition:
        cv = self._cv
        if cv is None:
            with _LOCK:
                if self._cv is None:
                    self._cv = threading.Condition(threading.Lock())
                cv = self._cv
        return cv

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        cv = self._condition()
        with cv:
            return self._flag or cv.wait(timeout)

    def clear(self) -> None:
        with _LOCK:
            cv = self._cv
            if cv is None:
                self._flag = False
        if cv is not None:
            with cv:
                self._flag = False

    def set(self) -> None:
        with _LOCK:
            cv = self._cv
            if cv is None:  # (nobody waits in a thread: a waiter makes the condition first)
                self._flag = True
        if cv is not None:
            with cv:
                self._flag = True
                cv.notify_all()
        with _LOCK:  # (after the flag: a waiter or call-back added later sees it set)
            waiters, self._waiters = self._waiters, []
            calls, self._on_set = self._on_set, None
        for loop, fut in waiters:
            with contextlib.suppress(RuntimeError):  # (a loop already closed: nobody waits)
                loop.call_soon_threadsafe(_resolve, fut)
        for fn in calls or ():  # (in the setter's thread: they must be short and not block)
            fn()

    def _at_fork_reinit(self) -> None:
        self._cv = None

    def on_set(self, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn`` once when this is set, in the setting thread (at once, here, if it is
        set already). Returns what takes it back (a call of it after ``fn`` ran does nothing)."""
        with _LOCK:
            if not self._flag:
                if self._on_set is None:
                    self._on_set = []
                self._on_set.append(fn)
                return lambda: self._forget(fn)
        fn()
        return lambda: None

    def _forget(self, fn: Callable[[], None]) -> None:
        with _LOCK:
            if self._on_set is not None:
                with contextlib.suppress(ValueError):
                    self._on_set.remove(fn)

    async def wait_async(self, timeout: float | None = None) -> bool:
        """Wait until set, at most ``timeout`` seconds (None: no limit); True when set."""
        if self._flag:
            return True
        if timeout is not None and timeout <= 0:
            return False
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        entry = (loop, fut)
        with _LOCK:
            self._waiters.append(entry)
        try:
            if not self._flag:  # (set between the first look and the registration)
                await asyncio.wait((fut,), timeout=timeout)
        finally:
            with _LOCK, contextlib.suppress(ValueError):
                self._waiters.remove(entry)
            fut.cancel()
        return self._flag


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
