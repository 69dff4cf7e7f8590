"""One peer, one fresh private redis-server: enqueue N jobs (in a child process), then start
ONE worker process and measure the drain (``bench.support.drain``)."""

from __future__ import annotations

from bench import URL_ENV
from bench.peers import load
from bench.support.drain import Drain, measure_drain
from bench.support.procs import Registry, child_env
from bench.support.redisstats import Probe


def run_peer(reg: Registry, name: str, n: int, timeout: float) -> Drain:
    peer = load(name)
    python = peer.interpreter()
    server = reg.redis_server()
    try:
        env = child_env({URL_ENV: server.url})
        argv = [python, "-m", "bench.peers._run", name, "enqueue", str(n)]
        reg.run(f"{name}-enqueue", argv, env, timeout=120 + n / 50)
        probe = Probe(server.url)
        worker = peer.worker_argv(python, server.url)
        drain, procs = measure_drain(
            reg, probe, n, lambda: {"worker": reg.spawn(f"{name}-worker", worker, env)}, timeout
        )
        for proc in procs.values():
            reg.forget(proc)  # SIGTERM, then SIGKILL: no job can run after this
        drain.final_counter = probe.counter()
        probe.close()
        return drain
    finally:
        reg.stop_server(server)
