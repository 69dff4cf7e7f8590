"""Live logs: what a run writes while it runs (a command's stdout and stderr, a Python runner's
``task.log`` lines and its logger's) goes to the attempt's capped log stream in Redis
(``log:ID:ATTEMPT``, written by ``lua/log_append.lua``), so ``deviceq task logs`` and the
dashboard show it before the run ends.

One `LogStreamer` per host daemon: every run gets a `RunLog` buffer, and one thread flushes
the buffers of all the host's runs together, at most every `FLUSH_EVERY` seconds, in one
script call. A run's buffer holds at most `CHUNK_BYTES` between two flushes: what a run prints
faster than that is dropped, and the next chunk says how many bytes were (never an unbounded
buffer). The final flush of a run (before its report, while its lease is still current) sets
the stream's expiry to the pool's ``retention``. Logs are best effort: an unreachable Redis
costs log lines, never the run."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

FLUSH_EVERY = 0.2
"""Seconds between two flushes of a run's output, at most."""
WHOLE_LOG_BYTES = 256 * 1024 * 1024  # an attempt's whole log on the host's disk, at most
IDLE_EXIT = 10.0  # seconds the flush thread outlives the last open run
CHUNK_BYTES = 65536
"""Bytes of one run's output kept between two flushes (one stream entry at most)."""
MAX_CHUNKS_PER_CALL = 1000  # log_append.lua's limit
FINAL_WAIT = 5.0  # seconds a run's end waits for its final flush, at most
STREAMS = ("stdout", "stderr", "log")

_LOG = logging.getLogger("deviceq.host.logs")


@dataclass(frozen=True)
class LogChunk:
    """One piece of an attempt's output for ``log_append``: ``stream`` is stdout, stderr or
    log; ``final`` marks the run's last flush (the stream then expires with ``retention``)."""

    task_id: str
    lease_id: str
    stream: str
    text: str
    final: bool = False

    def args(self) -> list[str]:
        return [self.task_id, self.lease_id, self.stream, self.text, "1" if self.final else "0"]


class LogSink(Protocol):
    def log_append(self, chunks: Sequence[LogChunk]) -> list[str]: ...


def drop_marker(dropped: int) -> str:
    """The line that stands for output a run printed faster than it could be streamed."""
    return (
        f"[deviceq] {dropped:,} bytes of output dropped here (more than {CHUNK_BYTES:,} bytes "
        f"in {FLUSH_EVERY:g} s)\n"
    )


@dataclass(eq=False)
class RunLog:
    """The output buffer of one run (bounded: see `CHUNK_BYTES`). With ``whole``, every
    byte the run writes is also appended to that file (up to `WHOLE_LOG_BYTES`): the whole
    log, kept as the attempt's ``log.txt`` artifact (deviceq.host.artifacts)."""

    task_id: str
    lease_id: str
    whole: Path | None = None
    whole_size: int = 0
    pieces: list[tuple[str, str]] = field(default_factory=list)
    size: int = 0
    dropped: int = 0
    final: bool = False
    sent: bool = False  # anything was handed to Redis
    closed: bool = False  # refused by Redis (lease gone) or finally flushed: writes are ignored
    flushed: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def write(self, stream: str, text: str) -> None:
        """Add ``text`` of ``stream`` (stdout, stderr or log) to the next flush."""
        if not text or stream not in STREAMS:
            return
        with self.lock:
            if self.closed or self.final:
                return
            data = text.encode(errors="replace")
            if self.whole is not None:
                self._keep_whole(data)
            room = CHUNK_BYTES - self.size
            if len(data) > room:
                self.dropped += len(data) - max(0, room)
                if room <= 0:
                    return
                data = data[:room]
                text = data.decode(errors="ignore")
            self.size += len(data)
            if self.pieces and self.pieces[-1][0] == stream:
                self.pieces[-1] = (stream, self.pieces[-1][1] + text)
            else:
                self.pieces.append((stream, text))

    def _keep_whole(self, data: bytes) -> None:
        """Append to the whole log (under the lock); past `WHOLE_LOG_BYTES` one mark, then
        nothing; a disk error drops the whole log, never the run."""
        assert self.whole is not None
        room = WHOLE_LOG_BYTES - self.whole_size
        if room <= 0:
            return
        piece = data[:room]
        if len(piece) < len(data):
            piece += f"\n[deviceq] the whole log stops here ({WHOLE_LOG_BYTES:,} bytes)\n".encode()
        try:
            try:
                fh = self.whole.open("ab")
            except FileNotFoundError:  # its folder is made on first output
                self.whole.parent.mkdir(parents=True, exist_ok=True)
                fh = self.whole.open("ab")
            with fh:
                fh.write(piece)
        except OSError:
            self.whole = None
            return
        self.whole_size += len(data[:room])

    def take(self) -> list[LogChunk]:
        """The chunks of the next flush (consecutive text of one stream merged)."""
        with self.lock:
            if self.closed:
                return []
            pieces, dropped, final = self.pieces, self.dropped, self.final
            self.pieces, self.size, self.dropped = [], 0, 0
        out = [LogChunk(self.task_id, self.lease_id, s, t) for s, t in pieces]
        if dropped:
            out.append(LogChunk(self.task_id, self.lease_id, "log", drop_marker(dropped)))
        self.sent = self.sent or bool(out)
        if final and self.sent:  # (a run that wrote nothing has no stream: no call)
            out.append(LogChunk(self.task_id, self.lease_id, "log", "", True))
        elif final:
            with self.lock:
                self.closed = True
        return out


class LogStreamer:
    """Flushes the `RunLog` of every run of one host to Redis (see the module's doc)."""

    def __init__(self, sink: LogSink, every: float = FLUSH_EVERY) -> None:
        self.sink = sink
        self.every = every
        self.runs: set[RunLog] = set()
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    def open(self, task_id: str, lease_id: str, whole: Path | None = None) -> RunLog:
        """The buffer of a run that starts now (``whole``: the file its whole log goes to)."""
        log = RunLog(task_id, lease_id, whole)
        with self.lock:
            self.runs.add(log)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, name="log-stream", daemon=True)
                self.thread.start()
        return log

    def close(self, log: RunLog, wait: float = FINAL_WAIT) -> None:
        """The run ended: flush what is left now (setting the stream's expiry to
        ``retention``) and wait for it, at most ``wait`` seconds."""
        with log.lock:
            if log.closed:
                return
            if not log.sent and not log.pieces and not log.dropped:
                silent = True  # wrote nothing: no stream, no call, no wait for the flusher
                log.closed = True
            else:
                silent = False
                log.final = True
        if silent:
            with self.lock:
                self.runs.discard(log)
            log.flushed.set()
            return
        self.wake.set()
        log.flushed.wait(wait)

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    def _loop(self) -> None:
        idle_since: float | None = None
        while not self.stopping.is_set():
            self.wake.wait(self.every)
            self.wake.clear()
            self.flush()
            with self.lock:
                if self.runs:
                    idle_since = None
                    continue
                # no run open: the thread ends after a while without one (not after every
                # run: a busy host would start a thread per task)
                now = time.monotonic()
                if idle_since is None:
                    idle_since = now
                elif now - idle_since >= IDLE_EXIT:
                    self.thread = None
                    return

    def flush(self) -> None:
        """Send every run's pending output, in calls of at most `MAX_CHUNKS_PER_CALL`."""
        with self.lock:
            runs = list(self.runs)
        batch: list[tuple[RunLog, LogChunk]] = []
        done: list[RunLog] = []
        for log in runs:
            chunks = log.take()
            if log.closed or any(c.final for c in chunks):
                done.append(log)
            batch += [(log, c) for c in chunks]
        for i in range(0, len(batch), MAX_CHUNKS_PER_CALL):
            part = batch[i : i + MAX_CHUNKS_PER_CALL]
            try:
                answers = self.sink.log_append([c for _, c in part])
            except Exception as exc:  # noqa: BLE001 - best effort: a log outage never stops a run
                _LOG.warning("live log flush failed: %s: %s", type(exc).__name__, exc)
                continue
            for (log, _), answer in zip(part, answers, strict=False):
                if answer != "ok":
                    with log.lock:
                        log.closed = True  # the lease is gone: nothing more is accepted
        with self.lock:
            for log in done:
                with log.lock:
                    log.closed = True
                log.flushed.set()
                self.runs.discard(log)
