"""Task progress: how far a running attempt is, as its runner says (``task.progress(fraction,
text)`` in a Python runner; a line ``::deviceq progress 0.4 step 3/7`` on a command's stdout,
or the last line of the file ``$DEVICEQ_PROGRESS_FILE``). The host records it on the task
(``lua/progress.lua``: only for the attempt's current lease), where ``deviceq task show``,
``task list``, the API and the dashboard show it.

Bounded and rate limited: a fraction is a number from 0 to 1 (anything else is refused and
changes nothing), the text is cut to `TEXT_CHARS` characters with control characters taken
out, and one `ProgressStreamer` per host daemon writes each run's progress at most once every
`EVERY` seconds: what a runner says in between replaces the value waiting to be sent (the
latest wins), and the last value is sent when the run ends, before its report. Best effort: an
unreachable Redis costs progress updates, never the run."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..core.script_args import PROGRESS
from ..core.validation import validate_id

TEXT_CHARS = 200
"""Characters of a progress text kept at most (progress.lua accepts 4 bytes each)."""
TEXT_BYTES = 4 * TEXT_CHARS  # progress.lua's limit of a text in bytes
EVERY = 1.0
"""Seconds between two progress writes of one run, at least (the last one excepted)."""
TICK = 0.25  # how often the flush thread looks for values due
IDLE_EXIT = 10.0  # seconds the flush thread outlives the last open run
MAX_PER_CALL = 1000  # progress.lua's limit of updates per call
LINE_PREFIX = "::deviceq progress"
"""A command's stdout line ``::deviceq progress FRACTION [TEXT]`` reports progress."""
PROGRESS_FILE_ENV = "DEVICEQ_PROGRESS_FILE"
FILE_POLL = 0.5  # seconds between two looks at a command's progress file
FILE_TAIL_BYTES = 4096  # of the progress file read at each look (its last line counts)

_LOG = logging.getLogger("deviceq.host.progress")

ProgressWriter = Callable[[float, str], None]
"""Where a run's progress goes: ``write(fraction, text)`` (checked already)."""


def check_fraction(value: Any) -> float:
    """``value`` as a fraction from 0 to 1; ValueError (one line) for anything else (NaN, an
    infinity, a bool, text that is no number)."""
    if isinstance(value, bool):
        raise ValueError(f"progress must be a number from 0 to 1, not {value!r}")
    try:
        f = float(value)
    except (TypeError, ValueError):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ValueError(f"progress must be a number from 0 to 1, not {shown}") from None
    if math.isnan(f) or not 0.0 <= f <= 1.0:
        raise ValueError(f"progress must be a number from 0 to 1, not {value!r}")
    return f


def clean_text(text: Any) -> str:
    """A progress text as it is kept: characters that do not print (control characters, line
    breaks) taken out, surrounding blanks stripped, at most `TEXT_CHARS` characters."""
    s = "" if text is None else str(text)
    s = "".join(c for c in s if c.isprintable())
    return s.strip()[:TEXT_CHARS]


def fraction_text(f: float) -> str:
    """The fraction as progress.lua takes it: a plain decimal, at most 4 places."""
    return f"{f:.4f}".rstrip("0").rstrip(".") or "0"


def parse_line(line: str) -> tuple[float, str] | None:
    """``(fraction, text)`` of a ``::deviceq progress FRACTION [TEXT]`` line; None for any
    other line; ValueError when it is such a line with a bad fraction."""
    s = line.rstrip("\r\n")
    if not s.startswith(LINE_PREFIX):
        return None
    rest = s[len(LINE_PREFIX) :]
    if rest and not rest[0].isspace():
        return None  # (::deviceq progressive ...: not ours)
    parts = rest.strip().split(None, 1)
    if not parts:
        raise ValueError("progress must be a number from 0 to 1, not missing")
    return check_fraction(parts[0]), clean_text(parts[1] if len(parts) > 1 else "")


def parse_file_tail(data: bytes) -> tuple[float, str] | None:
    """``(fraction, text)`` from the last non-empty line of a progress file's tail
    (``FRACTION [TEXT]``, or a ``::deviceq progress`` line); None when it has none;
    ValueError for a bad fraction."""
    lines = [x for x in data.decode(errors="replace").splitlines() if x.strip()]
    if not lines:
        return None
    last = lines[-1].strip()
    if last.startswith(LINE_PREFIX):
        return parse_line(last)
    parts = last.split(None, 1)
    return check_fraction(parts[0]), clean_text(parts[1] if len(parts) > 1 else "")


@dataclass(frozen=True)
class ProgressUpdate:
    """One progress value for ``progress.lua``."""

    task_id: str
    lease_id: str
    fraction: float
    text: str = ""

    def item(self) -> dict[str, str]:
        """Its fields for ``progress.lua`` (`deviceq.core.script_args.PROGRESS`)."""
        return {"task_id": self.task_id, "lease_id": self.lease_id,
                "fraction": fraction_text(self.fraction), "text": self.text}  # fmt: skip


def checked_update(u: ProgressUpdate) -> ProgressUpdate:
    """``u`` with its ids and fraction checked and its text cleaned (InvalidInput / ValueError:
    one line, nothing sent)."""
    validate_id(u.task_id, "task id")
    validate_id(u.lease_id, "lease id")
    return ProgressUpdate(u.task_id, u.lease_id, check_fraction(u.fraction), clean_text(u.text))


class ProgressSink(Protocol):
    def progress(self, updates: Sequence[ProgressUpdate]) -> list[str]: ...


class ProgressCalls:
    """`deviceq.host.redis_link.HostClient`'s progress call (``lua/progress.lua``)."""

    if TYPE_CHECKING:  # (HostClient's own)

        def _auth(self) -> list[str]: ...
        def _run(self, name: str, args: list[Any]) -> Any: ...

    def progress(self, updates: Sequence[ProgressUpdate]) -> list[str]:
        """Record how far running attempts are; per update ``ok`` or ``rejected:REASON`` (the
        lease is not this host's current one: nothing written)."""
        if not updates:
            return []
        packed = PROGRESS.pack(checked_update(u).item() for u in updates)
        return [str(x) for x in self._run("progress", [*self._auth(), str(len(updates)), packed])]


class QuietProgressSink:
    """A `ProgressSink` whose outages go to the daemon's `deviceq.core.backoff.Outage` (said
    once) instead of a warning per flush; an update that cannot get through is dropped (the
    run goes on; its next value is sent when Redis is back)."""

    def __init__(
        self, sink: ProgressSink, outage: Any, transient: tuple[type[BaseException], ...]
    ) -> None:
        self.sink, self.outage, self.transient = sink, outage, transient

    def progress(self, updates: Sequence[ProgressUpdate]) -> list[str]:
        return self.outage.answers(
            lambda: self.sink.progress(updates), len(updates), self.transient
        )


@dataclass(eq=False)
class RunProgress:
    """The progress of one run: the latest value not sent yet, and when it last sent one."""

    task_id: str
    lease_id: str
    pending: tuple[float, str] | None = None
    sent_at: float = -math.inf  # time.monotonic() of the last write
    final: bool = False
    closed: bool = False  # refused by Redis (lease gone) or ended: values are ignored
    done: threading.Event | None = None
    warned: bool = False  # a bad value was logged once
    watched: bool = False  # on the streamer's list (from its first value)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def set(self, fraction: float, text: str) -> None:
        """Record a checked value: it replaces one still waiting to be sent."""
        with self.lock:
            if not self.closed and not self.final:
                self.pending = (fraction, text)

    def warn_once(self, why: str, logger: logging.LoggerAdapter | logging.Logger) -> None:
        """Log a refused value once per run (a runner printing bad lines in a loop says so
        once)."""
        with self.lock:
            if self.warned:
                return
            self.warned = True
        logger.warning(f"progress ignored: {why}")

    def take(self, now: float) -> ProgressUpdate | None:
        """The value due now (none before `EVERY` seconds since the last, unless final)."""
        with self.lock:
            if self.closed or self.pending is None:
                return None
            if not self.final and now - self.sent_at < EVERY:
                return None
            (fraction, text), self.pending = self.pending, None
            self.sent_at = now
        return ProgressUpdate(self.task_id, self.lease_id, fraction, text)


class ProgressStreamer:
    """Writes the progress of every run of one host to Redis (see the module's doc)."""

    def __init__(self, sink: ProgressSink, tick: float = TICK) -> None:
        self.sink = sink
        self.tick = tick
        self.runs: set[RunProgress] = set()
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    def open(self, task_id: str, lease_id: str) -> RunProgress:
        """The progress of a run that starts now (the thread starts with its first value)."""
        return RunProgress(task_id, lease_id)

    def writer(
        self, run: RunProgress, logger: logging.LoggerAdapter | logging.Logger | None = None
    ) -> ProgressWriter:
        """What the run's `Task` calls with a checked value."""

        def write(fraction: float, text: str) -> None:
            run.set(fraction, text)
            self._watch(run)

        return write

    def _watch(self, run: RunProgress) -> None:
        with self.lock:
            if run in self.runs:
                return
            run.watched = True
            self.runs.add(run)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, name="progress", daemon=True)
                self.thread.start()

    def close(self, run: RunProgress, wait: float = 5.0) -> None:
        """The run ended: send its last value now (whatever the rate) and wait for it, at most
        ``wait`` seconds. A run that said nothing costs nothing."""
        with run.lock:
            if run.closed or run.final:
                return
            if run.pending is None:
                run.closed = True
                done = None
            else:
                done = run.done = threading.Event()
                run.final = True
        if done is None:
            if run.watched:  # (a run that never said anything was never listed)
                with self.lock:
                    self.runs.discard(run)
            return
        self._watch(run)
        self.wake.set()
        done.wait(wait)

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()

    def _loop(self) -> None:
        idle_since: float | None = None
        while not self.stopping.is_set():
            self.wake.wait(self.tick)
            self.wake.clear()
            self.flush()
            with self.lock:
                if self.runs:
                    idle_since = None
                    continue
                now = time.monotonic()
                if idle_since is None:
                    idle_since = now
                elif now - idle_since >= IDLE_EXIT:
                    self.thread = None
                    return

    def flush(self, now: float | None = None) -> None:
        """Send every run's value that is due, in calls of at most `MAX_PER_CALL`."""
        now = time.monotonic() if now is None else now
        with self.lock:
            runs = list(self.runs)
        batch: list[tuple[RunProgress, ProgressUpdate]] = []
        ended: list[RunProgress] = []
        for run in runs:
            update = run.take(now)
            if update is not None:
                batch.append((run, update))
            if run.final or run.closed:
                ended.append(run)
        for i in range(0, len(batch), MAX_PER_CALL):
            part = batch[i : i + MAX_PER_CALL]
            try:
                answers = self.sink.progress([u for _, u in part])
            except Exception as exc:  # noqa: BLE001 - best effort: never stops a run
                _LOG.warning("progress update failed: %s: %s", type(exc).__name__, exc)
                continue
            for (run, _), answer in zip(part, answers, strict=False):
                if answer != "ok":
                    with run.lock:
                        run.closed = True  # the lease is gone: nothing more is accepted
        with self.lock:
            for run in ended:
                with run.lock:
                    run.closed = True
                    done = run.done
                if done is not None:
                    done.set()
                self.runs.discard(run)


class ProgressSource:
    """A command's progress, as its runner reads it: ``::deviceq progress`` lines on its
    stdout (`see_stdout`) and the last line of its progress file (`poll`, `finish`), each
    passed to ``task.progress``. A bad value is logged once per run as a warning and ignored
    (nothing changes)."""

    def __init__(self, task: Any, path: str | None = None) -> None:
        self.task = task
        self.path = path
        self.warned = False
        self._seen: tuple[int, int] | None = None  # the file's (mtime_ns, size) last read
        self._next = 0.0

    def _say(self, value: tuple[float, str] | None) -> None:
        if value is not None:
            self.task.progress(*value)

    def _bad(self, why: str) -> None:
        if not self.warned:
            self.warned = True
            self.task.logger.warning(f"progress ignored: {why}")

    def see_stdout(self, text: str) -> None:
        """Look for progress lines in ``text`` (whole lines of the command's stdout)."""
        if LINE_PREFIX not in text:
            return
        for line in text.splitlines():
            try:
                self._say(parse_line(line))
            except ValueError as exc:
                self._bad(str(exc))

    def poll(self, force: bool = False) -> None:
        """Read the progress file's last line if it changed (at most every `FILE_POLL`
        seconds unless ``force``)."""
        if self.path is None:
            return
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + FILE_POLL
        try:
            st = os.stat(self.path)
            seen = (st.st_mtime_ns, st.st_size)
            if seen == self._seen or st.st_size == 0:
                return
            self._seen = seen
            with open(self.path, "rb") as fh:
                fh.seek(max(0, st.st_size - FILE_TAIL_BYTES))
                data = fh.read(FILE_TAIL_BYTES)
        except OSError:
            return
        try:
            self._say(parse_file_tail(data))
        except ValueError as exc:
            self._bad(f"{exc} (in {PROGRESS_FILE_ENV})")

    def finish(self) -> None:
        """The command ended: its file's last value counts, then the file goes."""
        self.poll(force=True)
        if self.path is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


def progress_file(task: Any) -> str | None:
    """A fresh, empty file for a command's progress (``$DEVICEQ_PROGRESS_FILE``) when its
    task records progress (in a host daemon), else None."""
    if getattr(task, "progress_sink", None) is None:
        return None
    try:
        fd, path = tempfile.mkstemp(prefix=f"deviceq-progress-{task.task_id}-", suffix=".txt")
    except OSError:
        return None
    os.close(fd)
    return path
