"""`MultiPoolHost`: one host daemon process serving several pools.

Each pool gets a `HostWorker` of its own, in a thread of its own: its own session, Redis
clients, inbox wait, heartbeats, lease renewals, reporter, runners and state. Nothing mutable
is shared between pools; what the process shares is only its signal handling and its log
stream (every line carries ``pool=``).

Devices: every pool is a separate fleet. A device serves exactly one pool (the command line
says which, ``--device POOL/ID:DRIVER``), since pools do not see each other's reservations:
a device listed in two pools could be given a task by each at the same moment.

Stopping: SIGTERM (or SIGINT) drains every pool's worker at once (the second signal skips
the rest of the grace period); the process exits 0 when every pool drained cleanly. When
one pool's worker stops on its own with an error (it could not start, the host was removed
from that pool or its token rotated, another daemon took it over), the other pools are
drained too and the process exits with that worker's code (2, 4, 3, see
`deviceq.host.state`): a supervisor restarts it and the operator sees the error, instead of
a daemon that quietly serves fewer pools than it was told to."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from ..core import heap
from ..core.logs import log
from .daemon import HostWorker, install_stop_signals
from .settings import WorkerSettings
from .state import LOG


class MultiPoolHost:
    """Run one `HostWorker` per pool (``workers``: pool -> (settings, token)) until stopped;
    ``run()`` returns the process exit code.

    >>> host = MultiPoolHost(url, {"lab-a": (settings_a, token_a), "lab-b": (settings_b, token_b)})
    >>> sys.exit(host.run())
    """

    def __init__(self, redis_url: str, workers: Mapping[str, tuple[WorkerSettings, str]]) -> None:
        if not workers:
            raise ValueError("no pool to serve")
        self.workers = {
            pool: HostWorker(redis_url, pool, settings, token)
            for pool, (settings, token) in workers.items()
        }
        self.codes: dict[str, int] = {}
        self.failed: tuple[str, int] | None = None  # the first pool that stopped with an error
        self._lock = threading.Lock()

    def stop(self) -> None:
        """Drain every pool's worker (what SIGTERM does); a second call skips the grace."""
        for w in self.workers.values():
            w.stop()

    def _on_signal(self, name: str) -> None:
        for w in self.workers.values():
            w.state.signalled = name
        self.stop()

    def _run_one(self, pool: str, worker: HostWorker) -> None:
        try:
            code = worker.run()
        except Exception:  # noqa: BLE001 - one pool's bug stops the process, not silently
            worker.state.log_exception("host worker failed")
            code = 1
        with self._lock:
            self.codes[pool] = code
            first = code != 0 and self.failed is None
            if first:
                self.failed = (pool, code)
        if first:
            others = [p for p, w in self.workers.items() if p != pool and p not in self.codes]
            log(LOG, logging.ERROR,
                "a pool's worker stopped with an error: draining the other pools, then exiting "
                "non-zero", pool=pool, host=worker.settings.host_id, exit_code=code,
                draining=",".join(others) or None)  # fmt: skip
            for p in others:
                w = self.workers[p]
                if not w.state.stopping.is_set():
                    w.stop()

    def run(self) -> int:
        if threading.current_thread() is threading.main_thread():
            install_stop_signals(self._on_signal)
            heap.settle()  # (the process is this daemon's alone)
        threads = [
            threading.Thread(target=self._run_one, args=(p, w), name=f"host-{p}", daemon=True)
            for p, w in self.workers.items()
        ]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.5)
        if self.failed is not None:
            pool, code = self.failed
            log(LOG, logging.ERROR, "host daemon stopped: a pool's worker failed", pool=pool,
                exit_code=code, pools=",".join(self.workers))  # fmt: skip
            return code
        log(LOG, logging.INFO, "host daemon stopped", pools=",".join(self.workers))
        return 0
