"""Harness for end-to-end tests: real `deviceq` daemons as processes on a private Redis; their
tasks may run the runner of ``bench/support/runlog.py``, whose log proves that no device (and no
task) ever ran two things at once."""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from bench.support.runlog import RunLog
from bench.support.runlog import command as runner_command

from deviceq import Client, PoolAdmin, SchedulerClient, TaskStatus

CLI = [sys.executable, "-c", "import sys; from deviceq.cli import main; sys.exit(main())"]
_TESTS = Path(__file__).resolve().parent
# the test folders, as a PYTHONPATH: daemons import test runners (``test_x:runner``) by name
TESTS_PATH = os.pathsep.join(
    [str(_TESTS), *(str(d) for d in sorted(_TESTS.iterdir()) if any(d.glob("test_*.py")))]
)
REPO_DIR = str(_TESTS.parent)  # daemons import test runners and ``bench.support.runlog``
SRC_DIR = str(Path(REPO_DIR) / "src")  # and this tree's deviceq, whatever is installed


def _port_block() -> range:
    """The ports this process hands out: a block of its own, below the kernel's ephemeral
    range (no outgoing connection is given one, and no ``bind(("", 0))`` either), one block per
    pytest-xdist worker (``PYTEST_XDIST_WORKER`` ``gwN`` of ``PYTEST_XDIST_WORKER_COUNT``)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    top = min(low, 65536)
    bottom = max(1024, top - 16000)
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    size = (top - bottom) // max(workers, 1)
    start = bottom + (worker % workers) * size
    return range(start, start + size)


_BLOCK = _port_block()
# a random start: two test sessions on one machine rarely walk the same ports
_NEXT = itertools.count(random.randrange(len(_BLOCK)) if len(_BLOCK) else 0)


def free_port() -> int:
    """A local port nothing is bound to, distinct from every other one this process was given
    since (they come in turn from this worker's block: another worker never gets it, and it
    comes back only after the whole block). Tests use it for the servers they start and for
    "a port nobody listens on"."""
    if len(_BLOCK) < 100:  # no room below the ephemeral range: the kernel's choice
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    for _ in range(len(_BLOCK)):
        port = _BLOCK[next(_NEXT) % len(_BLOCK)]
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))  # (no SO_REUSEADDR: a TIME_WAIT socket counts)
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {_BLOCK}")


def deviceq(url: str, pool: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the installed ``deviceq`` console script on ``pool``, output captured (a pipe, not
    a terminal: what a shell pipeline sees)."""
    exe = Path(sys.executable).parent / "deviceq"
    return subprocess.run(
        [str(exe), "--redis-url", url, "--pool", pool, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "80"},
    )


def wait_for(cond: Callable[[], Any], timeout: float, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def marked_pids(mark: str) -> list[int]:
    """Processes whose environment carries ``DQTEST_MARK=mark`` (daemons and their commands)."""
    out = []
    needle = f"DQTEST_MARK={mark}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    out.append(int(entry.name))
    return out


def live_group_members(pgid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if fields[0] != "Z" and int(fields[2]) == pgid:
                    out.append(int(entry.name))
    return out


class Deployment:
    """Daemons of one pool as processes; everything they started is killed at the end."""

    def __init__(self, url: str, pool: str, tmp: Path) -> None:
        self.url, self.pool, self.tmp = url, pool, tmp
        self.mark = uuid.uuid4().hex
        # Client.wait blocks up to 5 s on XREAD: keep the socket timeout above that (redis-py
        # 8 defaults to 5 s)
        self.r = redis.Redis.from_url(url, decode_responses=True, socket_timeout=30)
        self.client = Client(self.r, pool)
        self.admin = PoolAdmin(self.r, pool)
        self.store = SchedulerClient(self.r, pool)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def configure(self, **settings: float) -> None:
        for k, v in settings.items():
            self.admin.set_config(k, v)

    def spawn(self, name: str, *args: str, env: dict[str, str] | None = None) -> Any:
        full_env = {
            **os.environ,
            "DEVICEQ_REDIS_URL": self.url,
            "DEVICEQ_POOL": self.pool,
            "DQTEST_MARK": self.mark,
            # (this tree's src first: the daemons run the code under test, not an install)
            "PYTHONPATH": os.pathsep.join((TESTS_PATH, SRC_DIR, REPO_DIR)),
            **(env or {}),
        }
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen([*CLI, *args], env=full_env, stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        log.close()
        self.procs[name] = proc
        return proc

    def scheduler(self) -> Any:
        return self.spawn("scheduler", "scheduler", "run", "--tick", "0.2")

    def host(self, host_id: str, *devices: str, extra: tuple[str, ...] = (),
             env: dict[str, str] | None = None, name: str | None = None) -> Any:  # fmt: skip
        token_file = self.tmp / f"{host_id}.token"
        if not token_file.exists():
            token_file.write_text(self.admin.add_host(host_id))
        args = ["host", "run", "--host-id", host_id, "--token-file", str(token_file)]
        for d in devices:
            args += ["--device", d]
        return self.spawn(name or host_id, *args, *extra, env=env)

    def runner_host(self, host_id: str, *devices: str, runlog: RunLog,
                    extra: tuple[str, ...] = (), name: str | None = None) -> Any:  # fmt: skip
        """A host daemon whose tasks run the overlap-proving runner (goal ``SECONDS``)."""
        return self.host(host_id, *devices, env=runlog.env, name=name,
                         extra=("--command", runner_command(), *extra))  # fmt: skip

    def command_host(self, host_id: str, *devices: str, extra: tuple[str, ...] = (),
                     env: dict[str, str] | None = None) -> Any:  # fmt: skip
        return self.host(
            host_id,
            *devices,
            env=env,
            extra=("--goal-runner", "command", "--command", "sh -c {goal}", *extra),
        )

    def tokens_in(self, text: str) -> bool:
        return any(tok.read_text().strip() in text for tok in self.tmp.glob("*.token"))

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()

    def alive(self, host_id: str) -> bool:
        return bool(self.admin.host(host_id).alive)

    def status(self, task_id: str) -> TaskStatus:
        return self.client.get(task_id, attempts=False).status

    def wait_all(self, ids: list[str], timeout: float) -> list[Any]:
        return [self.client.wait(t, timeout=timeout) for t in ids]

    def close(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                proc.wait(5)
        for pid in marked_pids(self.mark):  # commands orphaned by a SIGKILLed host
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.r.close()
