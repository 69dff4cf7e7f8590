"""Every process a test run starts ends with the run, however the run ends.

Each pytest process (the run itself, or each pytest-xdist worker) puts a mark of its own in
its environment (``DQTEST_SESSION``) as tests/conftest.py is imported; every process started
from it carries the mark on (daemons, ``redis-server``, the commands the daemons run,
whatever they start: an environment is inherited, and the harness passes ``os.environ`` on).
At the end of the run the marked processes are killed:

- when it ends normally or by Ctrl-C / SIGINT: at ``pytest_unconfigure`` and ``atexit``;
- on SIGTERM: a handler kills them, then the process dies of the signal as it would have;
- when it is killed outright (SIGKILL, pytest-timeout's ``os._exit``, an xdist worker killed):
  a watchdog, started with the run in a session of its own, holds the read end of a pipe only
  the pytest process writes to; the kernel closes it when that process dies, however it dies,
  and the watchdog then kills the marked processes and exits.

A worker's own environment (``/proc/PID/environ``) carries its run's mark: the run's watchdog
kills the workers too, and each worker's watchdog what the worker started. A process that
writes over its environment (``redis-server`` sets its title there) or a child forked without
an ``exec`` (multiprocessing) does not show the mark: the pytest process writes down every
process it starts (``subprocess.Popen``) and every child it forks (PID and start time, in
``PIDFILE``), and those are killed as well (a PID the system has given to another process
since has another start time and is left alone)."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import FrameType
from typing import Any

MARK_VAR = "DQTEST_SESSION"


def marked(mark: str) -> list[int]:
    """Live (non-zombie) processes whose environment holds ``DQTEST_SESSION=mark``, but this
    one."""
    needle = f"{MARK_VAR}={mark}".encode()
    out = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        with contextlib.suppress(OSError, IndexError):
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state not in ("Z", "X"):
                out.append(int(entry.name))
    return out


def pid_file(mark: str) -> Path:
    return Path(tempfile.gettempdir()) / f"dqtest-{mark}.pids"


def start_time(pid: int) -> str | None:
    """A process's start time (clock ticks since boot), None when it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def note(mark: str, pid: int) -> None:
    """Write ``pid`` (and its start time) down as a process of the run marked ``mark``."""
    started = start_time(pid)
    if started is not None:
        with contextlib.suppress(OSError), pid_file(mark).open("a") as f:
            f.write(f"{pid} {started}\n")


def noted(mark: str) -> list[int]:
    """The processes written down for ``mark`` that are still the same processes."""
    try:
        lines = pid_file(mark).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        with contextlib.suppress(ValueError):
            pid_text, started = line.split()
            pid = int(pid_text)
            if pid != os.getpid() and start_time(pid) == started:
                out.append(pid)
    return out


def reap(mark: str, rounds: int = 50) -> list[int]:
    """SIGKILL every process marked ``mark`` or written down for it until none is left (a
    process may start another while the first ones are killed); the pids killed."""
    killed: list[int] = []
    for _ in range(rounds):
        pids = sorted(set(marked(mark)) | set(noted(mark)))
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        killed += pids
        time.sleep(0.05)
    return killed


_execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]


class Session:
    """The mark of this pytest process, its watchdog and its handlers (`install`)."""

    def __init__(self) -> None:
        self.mark = uuid.uuid4().hex
        self.pid = os.getpid()
        self.watchdog: subprocess.Popen[bytes] | None = None

    def install(self) -> None:
        os.environ[MARK_VAR] = self.mark
        read_end, self._write_end = os.pipe()  # (not inherited: only this process writes)
        env = {k: v for k, v in os.environ.items() if k != MARK_VAR}
        self.watchdog = subprocess.Popen(
            [sys.executable, __file__, "--watch", self.mark],
            stdin=read_end, stdout=subprocess.DEVNULL, env=env, start_new_session=True,
        )  # fmt: skip
        os.close(read_end)
        mark, pid = self.mark, self.pid

        def execute_child(popen: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
            _execute_child(popen, *args, **kwargs)
            if os.getpid() == pid:
                note(mark, popen.pid)

        subprocess.Popen._execute_child = execute_child  # type: ignore[attr-defined]
        os.register_at_fork(after_in_child=lambda: note(mark, os.getpid()))
        atexit.register(self.end)
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            with contextlib.suppress(ValueError):  # (only the main thread sets handlers)
                signal.signal(signal.SIGTERM, self._on_sigterm)

    def end(self) -> None:
        """Kill what this run started (in the pytest process only: not in a forked child)."""
        if os.getpid() == self.pid:
            reap(self.mark)
            with contextlib.suppress(OSError):
                pid_file(self.mark).unlink()

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.end()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _watch(mark: str) -> None:
    """The watchdog: wait for the end of the pipe (its pytest process is gone), then reap."""
    for sig in (signal.SIGINT, signal.SIGHUP):  # a Ctrl-C ends the run, not its watchdog
        signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        while os.read(0, 4096):
            pass
    reap(mark)
    with contextlib.suppress(OSError):
        pid_file(mark).unlink()


if __name__ == "__main__" and sys.argv[1:2] == ["--watch"]:
    _watch(sys.argv[2])
