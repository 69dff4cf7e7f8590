"""Peer queues measured beside deviceq. Every module here has the same small interface:

- ``NAME`` (as shown in the results), ``DIST`` (its distribution on PyPI) and ``SETTINGS``
  (one line: how its worker runs);
- ``interpreter() -> str``: the Python that runs its enqueuer and worker (raises
  ``PeerUnavailable`` with the reason when there is none);
- ``enqueue(n)``: queue ``n`` jobs; each job INCRs ``bench.COUNTER_KEY`` once. It runs in a
  child process (``python -m bench.peers._run NAME enqueue N``) with the server's URL in
  ``BENCH_REDIS_URL``;
- ``worker_argv(python, url) -> list[str]``: the command line of ONE worker process, the peer's own
  CLI wherever it has one (else ``python -m bench.peers._run NAME work``).

Only the standard library is imported here: a peer's child processes import this package,
one of them (arq) from its own virtualenv."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from bench import URL_ENV

if TYPE_CHECKING:
    import redis
    import redis.asyncio

PEERS = ("rq", "arq", "saq", "celery", "dramatiq", "huey", "bullmq")
CONCURRENCY = 16
"""Jobs in flight per worker process where the peer has such a setting (threads, asyncio
tasks): the 16 devices of the deviceq host."""
QUEUE = "bench"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "deviceq-bench"


class PeerUnavailable(RuntimeError):
    """The peer cannot be installed or run here (the message says why)."""


def load(name: str) -> ModuleType:
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r}; one of: {', '.join(PEERS)}")
    return importlib.import_module(f"bench.peers.{name}")


def url() -> str:
    """The measured server, in worker and enqueuer processes (never a default: a job must
    not land on some other Redis)."""
    try:
        return os.environ[URL_ENV]
    except KeyError:
        raise RuntimeError(f"{URL_ENV} is not set") from None


def script(python: str, name: str) -> str:
    """A console script installed beside ``python``."""
    return str(Path(python).parent / name)


def chunks(n: int, size: int = 1000) -> list[int]:
    return [min(size, n - i) for i in range(0, n, size)]


def version(python: str, dist: str) -> str:
    """Installed version of ``dist`` for that interpreter."""
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=False)
    return out.stdout.strip() or "?"


def side_venv(name: str, requirement: str) -> str:
    """Python of a virtualenv of its own holding ``requirement``, for a peer whose pins
    cannot be installed beside the others (created once under ``~/.cache/deviceq-bench``)."""
    venv = CACHE / f"venv-{name}"
    python = venv / "bin" / "python"
    stamp = venv / "requirement.txt"
    if python.exists() and stamp.exists() and stamp.read_text().strip() == requirement:
        return str(python)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True,
                       capture_output=True, timeout=120)  # fmt: skip
        subprocess.run([str(python), "-m", "pip", "install", "-q", requirement], check=True,
                       capture_output=True, timeout=600)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        err = getattr(exc, "stderr", b"") or b""
        raise PeerUnavailable(
            f"could not create a virtualenv with {requirement}: {exc} {err.decode()[-300:]}"
        ) from exc
    stamp.write_text(requirement + "\n")
    return str(python)


_clients: dict[str, object] = {}


def sync_redis() -> redis.Redis:
    """The job's Redis client, one per process (thread-safe connection pool)."""
    import redis

    client = _clients.get("sync")
    if client is None:
        client = _clients.setdefault("sync", redis.Redis.from_url(url()))
    return client  # type: ignore[return-value]


def async_redis() -> redis.asyncio.Redis:
    """The job's asyncio Redis client, one per process (first used inside the worker's
    event loop)."""
    import redis.asyncio

    client = _clients.get("async")
    if client is None:
        client = _clients.setdefault("async", redis.asyncio.Redis.from_url(url()))
    return client  # type: ignore[return-value]
