"""The demo's daemons: the real ``deviceq scheduler run`` and ``deviceq host run`` processes,
started, signalled and stopped as process groups."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from .scenario import DEMO_HOSTS, SIM_DURATION

# -- daemons ---------------------------------------------------------------------------------


def deviceq_argv() -> list[str]:
    """How to run the ``deviceq`` command of this very installation."""
    script = Path(sys.executable).parent / "deviceq"
    if script.exists():
        return [str(script)]
    found = shutil.which("deviceq")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from deviceq.cli import main; sys.exit(main())"]


@dataclass
class Daemon:
    """A deviceq daemon run as a subprocess in a process group of its own, logging to a file."""

    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    killed: bool = False

    def start(self, env: dict[str, str]) -> None:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,
            )  # fmt: skip

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole process group (no clean shutdown: leases are left to expire)."""
        self.killed = True
        self.signal_group(signal.SIGKILL)
        if self.proc is not None:
            with suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)

    def stop(self, grace: float) -> None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL the group."""
        stop_all([self], grace)

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def stop_all(daemons: list[Daemon], grace: float) -> None:
    """SIGTERM every daemon at once (hosts drain, the scheduler lets go of its lease), wait up
    to ``grace`` seconds for all of them, then SIGKILL each process group (the daemon and
    anything it left in its group) and reap."""
    for d in daemons:
        if d.running:
            d.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(d.running for d in daemons) and time.monotonic() < deadline:
        time.sleep(0.05)
    for d in daemons:
        d.signal_group(signal.SIGKILL)
        if d.proc is not None:
            with suppress(subprocess.TimeoutExpired):
                d.proc.wait(10)


def scheduler_argv(base: list[str]) -> list[str]:
    # lru_device spreads the work over both hosts (fifo_match would favour the first by id)
    return [*base, "scheduler", "run", "--tick", "0.5", "--strategy", "lru_device"]


def host_argv(base: list[str], host_id: str, token_file: Path) -> list[str]:
    argv = [*base, "host", "run", "--host-id", host_id, "--token-file", str(token_file)]
    for device_id, driver, tags in DEMO_HOSTS[host_id]:
        argv += ["--device", f"{device_id}:{driver}:{','.join(tags)}"]
    argv += ["--goal-runner", "sim", "--sim-duration", SIM_DURATION, "--workflow-runner", "steps"]
    argv += ["--heartbeat-interval", "0.5", "--grace", "2"]
    return argv


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """Let SIGTERM unwind the demo like Ctrl-C, so its cleanup always runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not stop the cleanup
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
