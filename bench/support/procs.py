"""Every process and temporary directory a benchmark run starts, so that all of them are gone
when it ends, also on Ctrl-C or SIGTERM (``Registry.close()`` in a ``finally``).

Children start in their own session (process group): stopping one signals its whole group,
so a worker's own children (Dramatiq's worker processes, forked horses) go with it, and the
terminal's Ctrl-C reaches only this process, which then stops them in order."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import IO

from deviceq.core.redis_server import RedisServer

REPO = Path(__file__).resolve().parents[2]
"""Repository root: the working directory and ``PYTHONPATH`` of every child."""


def baseline_tree(dest: Path, rev: str) -> Path:
    """The files of git revision ``rev`` of this repository, under ``dest``."""
    tree = dest / f"tree-{rev}"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True,
                             capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def log(msg: str) -> None:
    """Progress goes to stderr (stdout is reserved for ``--json``)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


REALTIME_ENV = "DEVICEQ_BENCH_REALTIME_REDIS"
"""Set (to ``1``) by ``python -m bench.fleet --realtime-redis``: see `realtime`."""


def realtime(server: RedisServer) -> RedisServer:
    """When `REALTIME_ENV` is set, every thread of ``server`` runs under SCHED_FIFO (``chrt -a
    -f -p 10``, root only): on a 2-core machine shared with the benchmark's own clients and
    daemons, the kernel then never preempts redis-server for them in the middle of a call,
    so ``SLOWLOG`` (which times a call by the wall clock) shows how long the call's own work
    takes. Without the variable, nothing changes."""
    if os.environ.get(REALTIME_ENV) == "1" and server.proc is not None:
        subprocess.run(
            ["chrt", "-a", "-f", "-p", "10", str(server.proc.pid)],
            check=True,
            capture_output=True,
        )
    return server


def child_env(extra: Mapping[str, str]) -> dict[str, str]:
    """This environment plus ``extra``, with the repository root first on ``PYTHONPATH``."""
    env = dict(os.environ)
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def cli() -> str:
    """The ``deviceq`` console script of this interpreter's environment."""
    beside = Path(sys.executable).parent / "deviceq"
    found = str(beside) if beside.exists() else shutil.which("deviceq")
    if not found:
        raise FileNotFoundError("the deviceq command is not installed")
    return found


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class ChildFailed(RuntimeError):
    """A child process exited early or with an error; carries the end of its log."""


class Registry:
    """Owns the run's temporary directory, its redis-servers and its child processes."""

    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="deviceq-bench-"))
        self.procs: list[tuple[subprocess.Popen[bytes], IO[bytes], Path]] = []
        self.servers: list[RedisServer] = []
        self._seq = 0

    # -- redis-servers -----------------------------------------------------------------------
    def redis_server(self) -> RedisServer:
        """A fresh private redis-server (``deviceq.core.redis_server.RedisServer``: same binary and
        flags for every system, no persistence)."""
        server = RedisServer()
        self.servers.append(server)
        server.start()
        return realtime(server)

    def stop_server(self, server: RedisServer) -> None:
        server.stop()
        if server in self.servers:
            self.servers.remove(server)

    # -- child processes ---------------------------------------------------------------------
    def spawn(
        self, name: str, argv: Sequence[str], env: Mapping[str, str]
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in its own session, output to a log file in the run's directory."""
        self._seq += 1
        path = self.tmp / f"{self._seq:03d}-{name}.log"
        out = path.open("wb")
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=REPO,
            start_new_session=True,
        )
        self.procs.append((proc, out, path))
        return proc

    def log_of(self, proc: subprocess.Popen[bytes]) -> Path:
        for p, _, path in self.procs:
            if p is proc:
                return path
        raise KeyError(proc.pid)

    def run(self, name: str, argv: Sequence[str], env: Mapping[str, str], timeout: float) -> str:
        """Run ``argv`` to completion (killed after ``timeout`` s); returns its output, raises
        ChildFailed on a non-zero exit."""
        proc = self.spawn(name, argv, env)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop(proc, grace=1.0)
            msg = f"{name}: no exit after {timeout:.0f} s\n{tail(self.log_of(proc))}"
            raise ChildFailed(msg) from None
        text = self.log_of(proc).read_text(errors="replace")
        self.forget(proc)
        if code != 0:
            raise ChildFailed(f"{name}: exit {code}\n{tail_text(text)}")
        return text

    def stop(self, proc: subprocess.Popen[bytes], grace: float = 10.0) -> int | None:
        """SIGTERM the child's process group, SIGKILL it after ``grace`` seconds."""
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(grace)
        _signal_group(proc.pid, signal.SIGKILL)  # stragglers of the group, if any
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        return proc.returncode

    def forget(self, proc: subprocess.Popen[bytes]) -> None:
        """Stop the child and close its log (the file stays until ``close()``)."""
        self.stop(proc)
        for entry in list(self.procs):
            if entry[0] is proc:
                entry[1].close()
                self.procs.remove(entry)

    # -- everything --------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every child (all groups get SIGTERM at once, then SIGKILL), every
        redis-server, and remove the temporary directory."""
        with _signals_ignored():
            for proc, _, _ in self.procs:
                if proc.poll() is None:
                    _signal_group(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + 5
            for proc, out, _ in self.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(max(0.0, deadline - time.monotonic()))
                _signal_group(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
                out.close()
            self.procs.clear()
            for server in self.servers:
                server.stop()
            self.servers.clear()
            shutil.rmtree(self.tmp, ignore_errors=True)


def tail_text(text: str, lines: int = 15) -> str:
    return "\n".join(text.splitlines()[-lines:])


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class _signals_ignored:
    """Hold SIGINT/SIGTERM off while cleaning up (a second Ctrl-C must not leave orphans)."""

    def __enter__(self) -> None:
        self.old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}

    def __exit__(self, *exc: object) -> None:
        for s, h in self.old.items():
            signal.signal(s, h)


def interrupt_on_signals() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt, so that the ``finally`` clean-up runs (also
    when SIGINT was ignored by whoever started us, as for a background job of a script)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
