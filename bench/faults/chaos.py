"""Chaos soak: the real daemons under real faults, then the books are checked.

Its own ``redis-server`` (AOF, ``appendfsync always``) on loopback; ``--hosts`` x
``--devices`` devices under ``deviceq host run`` (each task runs ``bench/support/runlog.py``, which
holds a per-device and a per-task ``flock`` and logs each run's start and end); two
``deviceq scheduler run`` (a leader and a standby); ``--tasks`` tasks submitted in batches
(an idempotency key each, resent until acknowledged; progress every 10 s on stderr). While
they run, every ``--every`` seconds one fault, in a shuffled round of the four kinds:

* ``host_kill``: SIGKILL a random host daemon, restart it 0-3 s later;
* ``scheduler_kill``: SIGKILL the leading scheduler (the standby takes over), restart it;
* ``host_stop``: SIGSTOP a host daemon past its lease, then SIGCONT it;
* ``redis_kill``: SIGKILL ``redis-server``, restart it from its AOF a second later.

At the end (all bounded by ``--max-seconds``): every task terminal, none lost, no device and
no task ran two things at once (the runners' locks and log), and ``deviceq.verify`` finds
no violation. Prints the figures (``--json``: one object) and exits 1 when a check fails.

With ``--preempt`` the tasks are of priority classes: ``routine`` ones (preemptible, 1 s grace,
runs of 1-3 s) and every tenth an ``urgent`` one (it preempts, runs 0.1-0.3 s), so urgent tasks
preempt routine ones throughout the faults; then also no preempted attempt may have cost a
task one of its attempts (a failed task spent all of them on runs that were not preempted).

    python -m bench.faults.chaos [--tasks 1000] [--hosts 4] [--devices 4] [--every 3] [--json]
        [--preempt]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

import redis

from bench.support.procs import Registry, child_env, cli, interrupt_on_signals, log
from bench.support.runlog import RunLog, command
from deviceq import Client, PoolAdmin, TaskStatus, verify
from deviceq.core.redis_server import RedisServer
from deviceq.ops.status import leader

POOL = "chaos"
DRIVER = "chaos"
FAULTS = ("host_kill", "scheduler_kill", "host_stop", "redis_kill")
SETTINGS = {  # short leases so that faults cost seconds; history kept whole for verify
    "lease_ttl": 3,
    "claim_ttl": 3,
    "host_timeout": 10,
    "leader_ttl": 2,
    "max_attempts": 5,
    "event_maxlen": 500_000,
}
T = TypeVar("T")


@dataclass
class Figures:
    """What one soak measured (the closing note's figures)."""

    tasks: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    failure_kinds: dict[str, int] = field(default_factory=dict)
    attempts: dict[int, int] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)
    redis_restarts: int = 0
    late_reports_rejected: int = 0
    preempted: int = 0  # attempts ended preempted
    preempted_tasks: int = 0
    attempt_losses: list[str] = field(default_factory=list)  # preemptions that cost an attempt
    runs: int = 0
    lost: list[str] = field(default_factory=list)
    not_terminal: list[str] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    peak_memory_bytes: int = 0
    final_memory_bytes: int = 0
    drain_seconds: float = 0.0
    total_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not (
            self.lost or self.not_terminal or self.overlaps or self.violations
            or self.attempt_losses
        )  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def text(self) -> str:
        mib = 1024 * 1024
        return "\n".join(
            [
                f"tasks {self.tasks}: {self.statuses} failure kinds {self.failure_kinds}",
                f"attempts used per task: {dict(sorted(self.attempts.items()))}; "
                f"runs started {self.runs}",
                f"faults: {self.faults}; redis restarts {self.redis_restarts}; "
                f"late reports rejected {self.late_reports_rejected}",
                f"preempted attempts {self.preempted} of {self.preempted_tasks} tasks; "
                f"attempts lost to preemption {len(self.attempt_losses)}",
                f"lost {len(self.lost)}, not terminal {len(self.not_terminal)}, "
                f"overlaps {len(self.overlaps)}, violations {len(self.violations)}",
                f"redis memory: peak {self.peak_memory_bytes / mib:.1f} MiB, "
                f"final {self.final_memory_bytes / mib:.1f} MiB",
                f"drained in {self.drain_seconds:.1f} s ({self.total_seconds:.1f} s in all)",
                "OK" if self.ok else "FAILED: " + "; ".join(self.problems()),
            ]
        )

    def problems(self) -> list[str]:
        out = []
        for name in ("lost", "not_terminal", "overlaps", "violations", "attempt_losses"):
            items = getattr(self, name)
            if items:
                out.append(f"{name}: {items[:5]}")
        return out


def patient(fn: Callable[[], T], seconds: float = 60.0) -> T:
    """``fn()``, tried again while Redis is down or loading (a fault in progress)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class Soak:
    """One chaos run: the server, the daemons, the submitter and the fault schedule."""

    def __init__(self, reg: Registry, args: argparse.Namespace) -> None:
        self.reg, self.args = reg, args
        self.rng = random.Random(args.seed)
        self.server = RedisServer(appendonly=True, appendfsync="always")
        reg.servers.append(self.server)
        self.server.start()
        self.r = redis.Redis.from_url(self.server.url, decode_responses=True, socket_timeout=10)
        self.client, self.admin = Client(self.r, POOL), PoolAdmin(self.r, POOL)
        self.runlog = RunLog(reg.tmp / "runs")
        self.env = child_env(
            {"DEVICEQ_REDIS_URL": self.server.url, "DEVICEQ_POOL": POOL, **self.runlog.env}
        )
        self.base = [cli()]
        self.hosts = [f"c{i + 1}" for i in range(args.hosts)]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.down: dict[str, float] = {}  # daemon name -> when it comes back
        self.stopped: dict[str, float] = {}  # host name -> when it is resumed
        self.fig = Figures(tasks=args.tasks)
        self.faults: Counter[str] = Counter()
        self.round: list[str] = []

    # -- daemons ---------------------------------------------------------------------------
    def start_host(self, host: str) -> None:
        token_file = self.reg.tmp / f"{host}.token"
        if not token_file.exists():
            fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(patient(lambda: self.admin.add_host(host)) + "\n")
        argv = [*self.base, "host", "run", "--host-id", host, "--token-file", str(token_file)]
        for d in range(self.args.devices):
            argv += ["--device", f"{host}-d{d + 1}:{DRIVER}"]
        self.procs[host] = self.reg.spawn(host, [*argv, "--command", command()], self.env)

    def start_scheduler(self, name: str) -> None:
        argv = [*self.base, "scheduler", "run", "--tick", "0.2", "--owner", name]
        self.procs[name] = self.reg.spawn(name, argv, self.env)

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)  # the daemon only: its runs' watchdogs end them
        proc.wait(10)

    # -- faults ----------------------------------------------------------------------------
    def fault(self, now: float) -> None:
        if not self.round:
            self.round = list(FAULTS)
            self.rng.shuffle(self.round)
        kind = self.round.pop()
        up = [h for h in self.hosts if h not in self.down and h not in self.stopped]
        if kind == "host_kill" and len(up) > 1:
            victim = self.rng.choice(up)
            self.kill(victim)
            self.down[victim] = now + self.rng.uniform(0.0, 3.0)
        elif kind == "host_stop" and len(up) > 1:
            victim = self.rng.choice(up)
            self.procs[victim].send_signal(signal.SIGSTOP)
            self.stopped[victim] = now + SETTINGS["lease_ttl"] + self.rng.uniform(1.0, 3.0)
        elif kind == "scheduler_kill":
            lead = patient(lambda: leader(self.admin))
            if not lead or lead["owner"] not in self.procs or lead["owner"] in self.down:
                return
            self.kill(lead["owner"])
            self.down[lead["owner"]] = now + 1.0
        elif kind == "redis_kill":
            self.server.kill()
            time.sleep(1.0)
            self.server.start()
            self.fig.redis_restarts += 1
        else:
            return
        self.faults[kind] += 1
        log(f"fault {kind}")

    def recover(self, now: float) -> None:
        for name, at in list(self.down.items()):
            if now >= at:
                del self.down[name]
                (self.start_host if name in self.hosts else self.start_scheduler)(name)
        for host, at in list(self.stopped.items()):
            if now >= at:
                del self.stopped[host]
                self.procs[host].send_signal(signal.SIGCONT)

    # -- the run ---------------------------------------------------------------------------
    def submit(self, start: int, n: int) -> list[str]:
        specs = [self.spec(i) for i in range(start, start + n)]
        return patient(lambda: self.client.submit_many(specs))

    def spec(self, i: int) -> dict[str, Any]:
        seconds = self.args.run_seconds
        spec: dict[str, Any] = {"driver_type": DRIVER, "idempotency_key": f"chaos-{i}"}
        if self.args.preempt:
            urgent = i % 10 == 9
            spec["priority_class"] = "urgent" if urgent else "routine"
            seconds = (0.1, 0.3) if urgent else (1.0, 3.0)
        spec["goal"] = f"{self.rng.uniform(*seconds):.2f}"
        return spec

    def pending(self) -> int:
        counts = patient(self.client.counts)
        return sum(counts[s] for s in ("queued", "assigned", "dispatched"))

    def memory(self) -> int:
        used = int(patient(lambda: self.r.info("memory"))["used_memory"])
        self.fig.peak_memory_bytes = max(self.fig.peak_memory_bytes, used)
        return used

    def run(self) -> Figures:
        began = time.monotonic()
        for key, value in SETTINGS.items():
            self.admin.set_config(key, value)
        if self.args.preempt:
            self.admin.set_config("max_preemptions_per_minute", 10_000)
            self.admin.add_priority_class("routine", 1, grace=1.0)
            self.admin.add_priority_class("urgent", 9, preempts=True, preemptible=False)
        for h in self.hosts:
            self.start_host(h)
        self.start_scheduler("s1")
        self.start_scheduler("s2")
        ids: list[str] = []
        batch = max(1, self.args.tasks // 20)
        next_fault = time.monotonic() + self.args.every
        deadline = time.monotonic() + self.args.max_seconds
        drain_began = next_progress = time.monotonic()
        while time.monotonic() < deadline:
            now = time.monotonic()
            self.recover(now)
            if len(ids) < self.args.tasks:
                ids += self.submit(len(ids), min(batch, self.args.tasks - len(ids)))
            elif not self.pending():
                break
            if now >= next_fault:
                self.fault(now)
                next_fault = now + self.args.every
            if now >= next_progress:
                left = self.pending()
                log(f"{len(ids)} submitted, {len(ids) - left} ended, {left} pending")
                next_progress = now + 10.0
            self.memory()
            time.sleep(0.5)
        self.fig.drain_seconds = time.monotonic() - drain_began
        self.recover(float("inf"))  # everything back up (and resumed) for the checks
        self.check(ids)
        self.fig.total_seconds = time.monotonic() - began
        return self.fig

    def check(self, ids: list[str]) -> None:
        fig = self.fig
        fig.faults = dict(self.faults)
        statuses: Counter[str] = Counter()
        kinds: Counter[str] = Counter()
        attempts: Counter[int] = Counter()
        tasks = patient(lambda: self.client.get_many(ids))
        found = {t.id for t in tasks}
        # attempts that ended preempted (field `preempted`: they use none of max_attempts)
        pre = patient(lambda: [self.r.hget(self.admin.keys.task(t.id), "preempted") for t in tasks])
        preempted_of = {t.id: int(n or 0) for t, n in zip(tasks, pre, strict=True)}
        fig.lost = [tid for tid in ids if tid not in found]
        for task in tasks:
            statuses[task.status.value] += 1
            if task.status not in (TaskStatus.done, TaskStatus.failed, TaskStatus.cancelled):
                fig.not_terminal.append(task.id)
            if task.failure_kind:
                kinds[task.failure_kind.value] += 1
            preempted = preempted_of[task.id]
            used = task.attempt - task.handbacks - preempted
            attempts[used] += 1
            if preempted:
                fig.preempted += preempted
                fig.preempted_tasks += 1
                if task.status is TaskStatus.failed and used < task.max_attempts:
                    fig.attempt_losses.append(f"{task.id}: failed after {used} counted attempts")
        fig.tasks = len(ids)
        fig.statuses, fig.failure_kinds = dict(statuses), dict(kinds)
        fig.attempts = dict(attempts)
        for name in list(self.procs):  # stop the daemons; then the pool holds still
            self.reg.forget(self.procs.pop(name))
        fig.overlaps = self.runlog.overlaps() + self.runlog.intervals_overlap()
        fig.runs = len(self.runlog.starts())
        fig.late_reports_rejected = sum(
            line.count("answer=rejected:")
            for path in self.reg.tmp.glob("*-c*.log")
            for line in path.read_text(errors="replace").splitlines()
        )
        result = verify(self.admin)
        fig.violations = [v.line() for v in result.violations]
        fig.final_memory_bytes = self.memory()


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=1000, help="tasks to submit (default 1000)")
    ap.add_argument("--hosts", type=int, default=4, help="host daemons (default 4)")
    ap.add_argument("--devices", type=int, default=4, help="devices per host (default 4)")
    ap.add_argument("--every", type=float, default=3.0, help="seconds between faults (3)")
    ap.add_argument("--seed", type=int, default=11, help="random seed (default 11)")
    ap.add_argument("--max-seconds", type=float, default=900.0, help="give up after (900)")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    ap.add_argument(
        "--preempt",
        action="store_true",
        help="routine and urgent priority classes: urgent tasks preempt routine ones",
    )
    args = ap.parse_args(argv)
    if args.tasks < 1 or args.hosts < 2 or args.devices < 1 or args.every <= 0:
        ap.error("need --tasks >= 1, --hosts >= 2, --devices >= 1, --every > 0")
    args.run_seconds = (0.1, 0.8)
    return args


def soak(args: argparse.Namespace) -> Figures:
    """Run one soak (the registry's processes and servers are gone when it returns)."""
    reg = Registry()
    try:
        return Soak(reg, args).run()
    finally:
        reg.close()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    interrupt_on_signals()
    fig = soak(args)
    print(json.dumps(fig.as_dict(), indent=2) if args.json else fig.text())
    return 0 if fig.ok else 1


if __name__ == "__main__":
    sys.exit(main())
