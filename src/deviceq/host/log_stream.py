"""Live logs: what a run writes while it runs (a command's stdout and stderr, a Python runner's
``task.log`` lines and its logger's) goes to the attempt's capped log stream in Redis
(``log:ID:ATTEMPT``, written by ``lua/log_append.lua``), so ``deviceq task logs`` and the
dashboard show it before the run ends.

One `LogStreamer` per host daemon: every run gets a `RunLog` buffer, and one thread flushes
the buffers of all the host's runs together, at most every `FLUSH_EVERY` seconds, in as few
script calls as `MAX_CALL_BYTES` allows. A run's buffer holds at most `BUFFER_BYTES` between
two flushes (sent as stream entries of at most `ENTRY_BYTES`): what a run prints faster than
that is dropped, and the next chunk says how many bytes were (never an unbounded buffer).
An attempt streams at most the pool's ``log_max_bytes`` in all; past it the live log says
where it stops (the whole log on disk, ``log.txt``, keeps going). The final flush of a run
(before its report, while its lease is still current) sets the stream's expiry to the pool's
``retention``. Logs are best effort: an unreachable Redis costs log lines, never the run."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Protocol

if TYPE_CHECKING:
    from ..core.backoff import Outage

FLUSH_EVERY = 0.2
"""Seconds between two flushes of a run's output, at most."""
WHOLE_LOG_BYTES = 256 * 1024 * 1024  # an attempt's whole log on the host's disk, at most
IDLE_EXIT = 10.0  # seconds the flush thread outlives the last open run
BUFFER_BYTES = 262144
"""Bytes of one run's output kept between two flushes: 1.3 MB/s streamed per run at most."""
ENTRY_BYTES = 65536
"""Bytes of one stream entry at most (log_append.lua's limit of one chunk)."""
CHUNK_BYTES = ENTRY_BYTES  # (the name of one entry's limit before the buffer held several)
MAX_CHUNKS_PER_CALL = 1000  # log_append.lua's limit
MAX_CALL_BYTES = 1 << 20  # text of one log_append call at most (one short script run)
DEFAULT_MAX_BYTES = 64 << 20  # PoolConfig.log_max_bytes's default
DEFAULT_HOST_BUDGET = 256 << 20
"""Bytes the live logs of one host's running attempts may stream in all, together (the
host's ``live_log_budget``): 16 runs each allowed ``log_max_bytes`` cannot put 1 GiB in
Redis at once."""
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

    def item(self) -> dict[str, str | int]:
        """Its fields for ``log_append.lua`` (`deviceq.core.script_args.LOG_APPEND`)."""
        return {"task_id": self.task_id, "lease_id": self.lease_id, "stream": self.stream,
                "text": self.text, "final": 1 if self.final else 0}  # fmt: skip


class LogSink(Protocol):
    def log_append(self, chunks: Sequence[LogChunk]) -> list[str]: ...


class QuietLogSink:
    """A `LogSink` whose outages go to the daemon's `deviceq.core.backoff.Outage` (said once)
    instead of a warning per flush (a few a second while a run writes). A flush that cannot
    get through is dropped, as the streamer drops any failed one (live logs are best effort):
    its chunks are answered ``ok`` so that the streams stay open, and the run goes on."""

    def __init__(
        self, sink: LogSink, outage: Outage, transient: tuple[type[BaseException], ...]
    ) -> None:
        self.sink, self.outage, self.transient = sink, outage, transient

    def log_append(self, chunks: Sequence[LogChunk]) -> list[str]:
        return self.outage.answers(
            lambda: self.sink.log_append(chunks), len(chunks), self.transient
        )


def drop_marker(dropped: int) -> str:
    """The line that stands for output a run printed faster than it could be streamed."""
    return (
        f"[deviceq] {dropped:,} bytes of output dropped here (more than {BUFFER_BYTES:,} bytes "
        f"in {FLUSH_EVERY:g} s)\n"
    )


def cap_marker(limit: int) -> str:
    """The last line of a live log that reached the attempt's ``log_max_bytes``."""
    return (
        f"[deviceq] the live log stops here: {limit:,} bytes streamed (log_max_bytes); "
        "the whole log is kept as log.txt\n"
    )


def host_cap_marker(total: int) -> str:
    """The last line of a live log cut because the host's runs hold their whole budget."""
    return (
        f"[deviceq] the live log stops here: this host's running attempts streamed "
        f"{total:,} bytes of live logs together (live_log_budget); the whole log is kept as "
        "log.txt\n"
    )


def split_utf8(text: str, limit: int = ENTRY_BYTES) -> list[str]:
    """``text`` in pieces of at most ``limit`` bytes, cut between characters (at a line's
    end where one is in the piece's last quarter)."""
    data = text.encode(errors="replace")
    if len(data) <= limit:
        return [text]
    out: list[str] = []
    while data:
        cut = len(data) if len(data) <= limit else limit
        if cut < len(data):
            nl = data.rfind(b"\n", cut - limit // 4, cut)
            if nl >= 0:
                cut = nl + 1
            else:
                while cut > 0 and data[cut] & 0xC0 == 0x80:  # inside a character
                    cut -= 1
        out.append(data[:cut].decode(errors="replace"))
        data = data[cut:]
    return out


class LiveLogBudget:
    """What the live logs of one host's open runs have streamed, together, against
    ``total`` bytes: a run takes bytes as it writes and gives them all back when its log
    closes (its stream then expires with the pool's ``retention``)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> int:
        """Up to ``n`` bytes of the budget (what is left of it): the bytes granted."""
        with self._lock:
            got = max(0, min(n, self.total - self.used))
            self.used += got
            return got

    def give(self, n: int) -> None:
        with self._lock:
            self.used = max(0, self.used - n)


@dataclass(eq=False)
class RunLog:
    """The output buffer of one run (bounded: see `CHUNK_BYTES`). With ``whole``, every
    byte the run writes is also appended to that file (up to `WHOLE_LOG_BYTES`): the whole
    log, kept as the attempt's ``log.txt`` artifact (deviceq.host.artifacts)."""

    task_id: str
    lease_id: str
    whole: str | Path | None = None
    max_bytes: int = DEFAULT_MAX_BYTES  # streamed in all, at most (then `cap_marker`)
    budget: LiveLogBudget | None = None  # the host's, shared by its runs (then `cap_marker`)
    whole_max: int = WHOLE_LOG_BYTES  # bytes of the whole log kept on disk, at most
    whole_size: int = 0
    pieces: list[tuple[str, str]] = field(default_factory=list)
    size: int = 0
    dropped: int = 0
    streamed: int = 0  # bytes taken into the buffer since the run started
    capped: int = 0  # 1: the cap was reached and its marker is due; 2: marker taken
    capped_by_host: bool = False  # the host's budget, not the attempt's, was spent
    given_back: bool = False  # its bytes were given back to the budget
    final: bool = False
    sent: bool = False  # anything was handed to Redis
    closed: bool = False  # refused by Redis (lease gone) or finally flushed: writes are ignored
    # set when the final flush is done; made by `LogStreamer.close` for a run that wrote
    # something (a silent run, most of them, never needs one)
    flushed: threading.Event | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    _fh: BinaryIO | None = None  # the whole log, open from the first output to the end
    # called once, outside the lock, at the run's first output (`LogStreamer` then flushes
    # it): a run that writes nothing is never on the flusher's list
    on_output: Callable[[RunLog], None] | None = None
    listed: bool = False  # on_output was called (or is being called)

    @property
    def wrote(self) -> bool:
        """Did the run write any output (so its whole log exists on disk)?"""
        return self.whole_size > 0

    def write(self, stream: str, text: str) -> None:
        """Add ``text`` of ``stream`` (stdout, stderr or log) to the next flush."""
        if not text or stream not in STREAMS:
            return
        with self.lock:
            if self.closed or self.final:
                return
            self._add(stream, text)
            first, self.listed = not self.listed, True
        if first and self.on_output is not None:
            self.on_output(self)

    def _add(self, stream: str, text: str) -> None:
        """(Under the lock.) `write`'s work: the whole log, then the buffer within the caps."""
        data = text.encode(errors="replace")
        if self.whole is not None:
            self._keep_whole(data)
        if self.capped:
            return
        left, free = self.max_bytes - self.streamed, BUFFER_BYTES - self.size
        room = min(free, left)
        by_host = False
        if self.budget is not None and room > 0:
            want = min(room, len(data))
            got = self.budget.take(want)
            by_host, room = got < want, got if got < want else room
        if len(data) > room:
            if by_host or left <= free:  # a budget, not the buffer, ends here
                self.capped = 1
                self.capped_by_host = by_host
            else:
                self.dropped += len(data) - max(0, room)
            if room <= 0:
                return
            data = data[:room]
            text = data.decode(errors="ignore")
        self.size += len(data)
        self.streamed += len(data)
        if self.pieces and self.pieces[-1][0] == stream:
            self.pieces[-1] = (stream, self.pieces[-1][1] + text)
        else:
            self.pieces.append((stream, text))

    def _keep_whole(self, data: bytes) -> None:
        """Append to the whole log (under the lock); past `WHOLE_LOG_BYTES` one mark, then
        nothing; a disk error drops the whole log, never the run."""
        assert self.whole is not None
        room = self.whole_max - self.whole_size
        if room <= 0:
            return
        piece = data[:room]
        if len(piece) < len(data):
            piece += f"\n[deviceq] the whole log stops here ({self.whole_max:,} bytes)\n".encode()
        try:
            if self._fh is None:  # the first output: a fresh file (a leftover is replaced)
                try:
                    self._fh = open(self.whole, "wb")  # noqa: SIM115 - closed at the run's end
                except FileNotFoundError:  # its folder is made on first output
                    os.makedirs(os.path.dirname(self.whole), exist_ok=True)
                    self._fh = open(self.whole, "wb")  # noqa: SIM115
            self._fh.write(piece)
        except OSError:
            self._close_whole()
            self.whole = None
            return
        self.whole_size += len(data[:room])

    def _close_whole(self) -> None:
        """Close the whole log's file (under the lock): it is complete on disk after this."""
        fh, self._fh = self._fh, None
        if fh is not None:
            try:
                fh.close()
            except OSError:
                self.whole = None

    def give_back(self) -> None:
        """The log is closed: what it streamed no longer counts against the host's budget."""
        with self.lock:
            if self.budget is not None and not self.given_back:
                self.given_back = True
                self.budget.give(self.streamed)

    def take(self) -> list[LogChunk]:
        """The chunks of the next flush (consecutive text of one stream merged)."""
        with self.lock:
            if self.closed:
                return []
            pieces, dropped, final = self.pieces, self.dropped, self.final
            self.pieces, self.size, self.dropped = [], 0, 0
            cap = self.capped == 1
            if cap:
                self.capped = 2
        out = [
            LogChunk(self.task_id, self.lease_id, s, x) for s, t in pieces for x in split_utf8(t)
        ]
        if dropped:
            out.append(LogChunk(self.task_id, self.lease_id, "log", drop_marker(dropped)))
        if cap:
            marker = (host_cap_marker(self.budget.total) if self.capped_by_host and self.budget
                      else cap_marker(self.max_bytes))  # fmt: skip
            out.append(LogChunk(self.task_id, self.lease_id, "log", marker))
        self.sent = self.sent or bool(out)
        if final and self.sent:  # (a run that wrote nothing has no stream: no call)
            out.append(LogChunk(self.task_id, self.lease_id, "log", "", True))
        elif final:
            with self.lock:
                self.closed = True
        return out


class LogStreamer:
    """Flushes the `RunLog` of every run of one host to Redis (see the module's doc)."""

    def __init__(
        self,
        sink: LogSink,
        every: float = FLUSH_EVERY,
        budget: int = DEFAULT_HOST_BUDGET,
        whole_max: int = WHOLE_LOG_BYTES,
    ) -> None:
        """``budget``: what the live logs of the runs open at once may stream together
        (`LiveLogBudget`); ``whole_max``: bytes of one run's whole log kept on disk."""
        self.sink = sink
        self.every = every
        self.budget = LiveLogBudget(budget)
        self.whole_max = whole_max
        self.runs: set[RunLog] = set()
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    def open(
        self,
        task_id: str,
        lease_id: str,
        whole: str | Path | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> RunLog:
        """The buffer of a run that starts now (``whole``: the file its whole log goes to;
        ``max_bytes``: what it may stream in all, the pool's ``log_max_bytes``)."""
        log = RunLog(task_id, lease_id, whole, max_bytes, self.budget, self.whole_max)
        log.on_output = self._list
        return log

    def _list(self, log: RunLog) -> None:
        """``log``'s run wrote its first output: flush it from now on (the thread started if
        it is not running)."""
        with self.lock:
            self.runs.add(log)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, name="log-stream", daemon=True)
                self.thread.start()

    def close(self, log: RunLog, wait: float = FINAL_WAIT) -> None:
        """The run ended: flush what is left now (setting the stream's expiry to
        ``retention``) and wait for it, at most ``wait`` seconds."""
        with log.lock:
            log._close_whole()
            if log.closed:
                return
            listed = log.listed
            if not log.sent and not log.pieces and not log.dropped:
                log.closed = True  # wrote nothing: no stream, no call, no wait for the flusher
                flushed = None
            else:
                flushed = log.flushed = threading.Event()
                log.final = True
        if flushed is None:
            if listed:  # (a run that never wrote was never listed and took no budget)
                log.give_back()
                with self.lock:
                    self.runs.discard(log)
            return
        self.wake.set()
        flushed.wait(wait)

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    def _loop(self) -> None:
        idle_since: float | None = None
        next_at = time.monotonic() + self.every
        while not self.stopping.is_set():
            self.wake.wait(max(0.0, next_at - time.monotonic()))
            self.wake.clear()
            next_at = time.monotonic() + self.every  # flush starts 200 ms apart, its time included
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
            if not (log.pieces or log.dropped or log.final or log.closed or log.capped == 1):
                continue  # nothing new (read without its lock: a write now goes next flush)
            chunks = log.take()
            if log.closed or any(c.final for c in chunks):
                done.append(log)
            batch += [(log, c) for c in chunks]
        for part in _calls(batch):
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
                    flushed = log.flushed
                if flushed is not None:
                    flushed.set()
                log.give_back()
                self.runs.discard(log)


def _calls(batch: list[tuple[RunLog, LogChunk]]) -> list[list[tuple[RunLog, LogChunk]]]:
    """``batch`` cut into calls of at most `MAX_CHUNKS_PER_CALL` chunks and about
    `MAX_CALL_BYTES` of text (a chunk is never split: one call may exceed it by one entry)."""
    calls: list[list[tuple[RunLog, LogChunk]]] = []
    part: list[tuple[RunLog, LogChunk]] = []
    size = 0
    for item in batch:
        n = len(item[1].text)
        if part and (len(part) >= MAX_CHUNKS_PER_CALL or size + n > MAX_CALL_BYTES):
            calls.append(part)
            part, size = [], 0
        part.append(item)
        size += n
    if part:
        calls.append(part)
    return calls
