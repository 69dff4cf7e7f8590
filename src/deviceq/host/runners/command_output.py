"""A command's output as the command runner reads it: stdout and stderr on pipes of their own,
each read by a thread (the async command runner: a coroutine on the event loop) that passes
its stream's lines on to the task's live log as they end, keeps the last bytes (bounded) for
the task's result, and stderr's last line with text (a failed command's reason)."""

from __future__ import annotations

import asyncio
import codecs
import os
import select
import threading
import time
from typing import Any

from ..progress import ProgressSource
from .aio import readable
from .base import Task, line_tail


def _readable(fd: int | None) -> bool:
    """Does pipe ``fd`` hold output (or its end) that its reader has not taken yet?"""
    if fd is None:
        return False
    poll = select.poll()  # (not select.select: a busy daemon's fds pass 1024)
    poll.register(fd, select.POLLIN)
    try:
        return any(ev & (select.POLLIN | select.POLLHUP) for _, ev in poll.poll(0))
    except OSError:
        return False


HOLD_S = 1.0  # seconds an unfinished line waits for its end, at most
HOLD_BYTES = 65536  # bytes of an unfinished line held, at most


class CommandOutput:
    """A command's combined stdout and stderr as it arrives: each stream's lines go to the
    task's live log (marked stdout or stderr) as they end, and the last bytes are kept
    (bounded) for the tail; the two streams meet between lines, never inside one."""

    def __init__(self, limit: int, task: Task, progress: ProgressSource | None = None) -> None:
        self.limit = limit
        self.task = task
        self.progress = progress  # reads ``::deviceq progress`` lines of stdout
        self.buf = bytearray()
        self.cut = 0  # bytes dropped ahead of buf
        self.handled = 0  # chunks read and passed on to the task's output so far
        self.passing = 0  # readers passing a chunk on right now
        self.lock = threading.Lock()
        self.err_last = ""  # the last line with text written on stderr
        self._err_open = ""  # stderr's line not ended yet (its last 1 KiB)
        self.fds: dict[Any, int] = {}  # the pipe each reader (thread or asyncio task) reads

    def reader(self, pipe: Any, stream: str) -> threading.Thread:
        fd = pipe.fileno()
        th = threading.Thread(
            target=self._read, args=(fd, stream), daemon=True,
            name=f"{stream}-{self.task.task_id}",
        )  # fmt: skip
        self.fds[th] = fd
        th.start()
        return th

    def reader_async(self, pipe: Any, stream: str) -> asyncio.Task[None]:
        """`reader` for an async run: the pipe read on the running event loop as its
        selector finds it readable (non-blocking), by the same rules."""
        fd = pipe.fileno()
        os.set_blocking(fd, False)
        job = asyncio.ensure_future(self._read_async(fd, stream))
        job.set_name(f"{stream}-{self.task.task_id}")
        self.fds[job] = fd
        return job

    async def _read_async(self, fd: int, stream: str) -> None:
        """`_read` on the event loop."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        held = ""
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                if not await readable(fd, HOLD_S if held else None) and held:
                    self._pass(stream, held)
                    held = ""
                continue
            if not chunk:
                break
            text = held + decoder.decode(chunk)
            cut = max(text.rfind("\n"), text.rfind("\r")) + 1
            if cut == 0 and len(text) >= HOLD_BYTES:
                cut = len(text)
            held = text[cut:]
            if cut:
                self._pass(stream, text[:cut])
        self._pass(stream, held + decoder.decode(b"", final=True))
        if stream == "stderr":
            self._see_stderr("\n")

    def _read(self, fd: int, stream: str) -> None:
        """Read ``fd`` to its end, passing on whole lines: the two pipes are read apart, so a
        piece cut inside a line would let the other stream's text into the middle of it. The
        unfinished last line is held until its end comes, the pipe ends, it reaches
        `HOLD_BYTES` or nothing more comes for `HOLD_S` seconds (a prompt shows, late)."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        poll = select.poll()
        poll.register(fd, select.POLLIN)
        held = ""
        while True:
            if held and not poll.poll(int(HOLD_S * 1000)):
                self._pass(stream, held)
                held = ""
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            text = held + decoder.decode(chunk)
            cut = max(text.rfind("\n"), text.rfind("\r")) + 1
            if cut == 0 and len(text) >= HOLD_BYTES:
                cut = len(text)
            held = text[cut:]
            if cut:
                self._pass(stream, text[:cut])
        self._pass(stream, held + decoder.decode(b"", final=True))
        if stream == "stderr":
            self._see_stderr("\n")

    def _pass(self, stream: str, text: str) -> None:
        """Keep ``text`` in the tail and hand it to the task's output (its live log)."""
        if not text:
            return
        data = text.encode()
        with self.lock:
            self.buf.extend(data)
            if len(self.buf) > 4 * self.limit:
                drop = len(self.buf) - self.limit
                del self.buf[:drop]
                self.cut += drop
            self.passing += 1
        if stream == "stderr":
            self._see_stderr(text)
        elif self.progress is not None:
            self.progress.see_stdout(text)
        try:
            self.task.output(stream, text)
        finally:
            with self.lock:
                self.passing -= 1
                self.handled += 1

    def _see_stderr(self, text: str) -> None:
        """Keep stderr's last line with text (a failed command's reason, whatever stdout
        printed after it: the two pipes are read apart, so their order is arrival order)."""
        *ended, self._err_open = (self._err_open + text).split("\n")
        self._err_open = self._err_open[-1024:]
        for line in reversed(ended):
            if line.strip():
                self.err_last = line.strip()[-1024:]
                break

    def data(self) -> bytes:
        with self.lock:
            return bytes(self.buf)

    def finish(
        self, readers: list[threading.Thread], quiet: float = 2.0, cap: float = 30.0
    ) -> None:
        """Wait for ``readers`` to reach the end of their pipes: while output still goes through
        them or waits in them to be read (a loaded machine, or a slow live log, may take
        seconds to pass a long output on), at most ``cap`` seconds; and ``quiet`` seconds past
        the last of it (a stray process of the command that keeps a pipe open without
        writing). Output still unread when it gives up is not in the task's log (said so)."""
        start = last = time.monotonic()
        seen = self.handled
        for reader in readers:
            while reader.is_alive():
                reader.join(0.05)
                now = time.monotonic()
                if self.handled != seen or self.passing or _readable(self.fds.get(reader)):
                    seen, last = self.handled, now
                if now - last > quiet or now - start > cap:
                    break
        left = [r.name for r in readers if r.is_alive()]
        if left:
            self.task.logger.warning(
                "stopped reading the command's output: a pipe is still open after it exited",
                fields={"pipes": ",".join(left)},
            )

    async def finish_async(
        self, readers: list[asyncio.Task[None]], quiet: float = 2.0, cap: float = 30.0
    ) -> None:
        """`finish` for the readers of `reader_async` (the same rules, awaited)."""
        loop = asyncio.get_running_loop()
        start = last = loop.time()
        seen = self.handled
        pending = set(readers)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=0.05)
            now = loop.time()
            busy = any(_readable(self.fds.get(r)) for r in pending)
            if self.handled != seen or self.passing or busy:
                seen, last = self.handled, now
            if pending and (now - last > quiet or now - start > cap):
                break
        for r in pending:
            r.cancel()
        if pending:
            self.task.logger.warning(
                "stopped reading the command's output: a pipe is still open after it exited",
                fields={"pipes": ",".join(sorted(r.get_name() for r in pending))},
            )

    def tail(self) -> str:
        with self.lock:
            return line_tail(bytes(self.buf), self.limit, self.cut)
