"""The drain measurement shared by every system: N jobs are already queued; start the
system's worker process(es) and watch the counter key (every job INCRs it once) reach N.

Two windows:
- from start: worker spawn -> counter == N (includes interpreter start-up and imports);
- drain: first job seen (counter >= 1) -> counter == N. Rates, Redis commands and CPU per job
  and the processes' CPU per job are reported over this window, so that a library's import
  time does not count as queue throughput."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

from bench.support.procs import ChildFailed, Registry, tail
from bench.support.redisstats import Probe, Usage

POLL_S = 0.005  # counter poll period during the drain (its Redis cost is subtracted)
STALL_S = 60.0  # no progress for this long: the system is stuck


@dataclass
class Drain:
    jobs: int
    rate_jobs: int  # jobs done from the first one seen to the last one
    cost_jobs: int  # jobs done between the two Redis snapshots (denominator of the costs)
    startup_s: float  # spawn -> first job seen
    drain_s: float  # first job seen -> last job
    usage: Usage
    proc_cpu_s: dict[str, float]  # per started process (its whole process tree)
    final_counter: int = -1  # counter once the workers were stopped (or after later phases)

    @property
    def rate(self) -> float:
        """Jobs/s over the drain window (first job -> last job)."""
        return self.rate_jobs / self.drain_s if self.drain_s > 0 else float("nan")

    @property
    def rate_from_start(self) -> float:
        return self.jobs / (self.startup_s + self.drain_s)

    @property
    def commands_per_job(self) -> float:
        return self.usage.total_commands / self.cost_jobs

    @property
    def redis_cpu_us_per_job(self) -> float:
        return self.usage.cpu_s * 1e6 / self.cost_jobs

    def proc_cpu_us_per_job(self, name: str | None = None) -> float:
        total = sum(self.proc_cpu_s.values()) if name is None else self.proc_cpu_s[name]
        return total * 1e6 / self.cost_jobs


def tree_cpu_s(proc: subprocess.Popen[bytes]) -> float:
    """User + system CPU seconds of a process and its descendants (live and reaped)."""
    import psutil  # (the bench extra's: imported here, so that the reports import without it)

    try:
        root = psutil.Process(proc.pid)
        t = root.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        for child in root.children(recursive=True):
            try:
                c = child.cpu_times()
                total += c.user + c.system
            except psutil.Error:
                pass
        return total
    except psutil.Error:
        return float("nan")


def measure_drain(
    reg: Registry,
    probe: Probe,
    n: int,
    start: Callable[[], dict[str, subprocess.Popen[bytes]]],
    timeout: float,
) -> tuple[Drain, dict[str, subprocess.Popen[bytes]]]:
    """Start the workers with ``start()`` and measure until the counter reaches ``n``.
    Returns the measurement and the still-running processes (the caller stops them)."""
    if probe.counter() != 0:
        raise RuntimeError("the counter is not 0 before the workers start")
    probe.calibrate()
    t0 = time.perf_counter()
    procs = start()
    deadline = t0 + timeout

    def check_alive() -> None:
        for name, p in procs.items():
            if p.poll() is not None:
                raise ChildFailed(f"{name} exited with {p.returncode}\n{tail(reg.log_of(p))}")
        if time.perf_counter() > deadline:
            raise TimeoutError(f"drain not finished after {timeout:.0f} s")

    try:
        while (c_first := probe.counter()) < 1:
            check_alive()
            time.sleep(0.001)
        t1 = time.perf_counter()
        mark = probe.mark()
        s1 = probe.snapshot()
        cpu1 = {name: tree_cpu_s(p) for name, p in procs.items()}
        c1 = probe.counter()
        last, last_change = c1, time.perf_counter()
        while (c := probe.counter()) < n:
            now = time.perf_counter()
            if c != last:
                last, last_change = c, now
            elif now - last_change > STALL_S:
                raise TimeoutError(f"stalled at {c}/{n} for {STALL_S:.0f} s")
            check_alive()
            time.sleep(POLL_S)
        t2 = time.perf_counter()
        s2 = probe.snapshot()
        cpu2 = {name: tree_cpu_s(p) for name, p in procs.items()}
        drain = Drain(
            jobs=n,
            rate_jobs=n - c_first,
            cost_jobs=max(1, n - c1),
            startup_s=t1 - t0,
            drain_s=t2 - t1,
            usage=probe.usage(s1, s2, mark),
            proc_cpu_s={k: cpu2[k] - cpu1[k] for k in procs},
        )
    except Exception:
        for proc in procs.values():
            reg.forget(proc)  # a failed drain must not leave its workers running
        raise
    return drain, procs
