"""Where the host daemon's CPU per task goes, function by function, in the real daemon: the setup
of ``bench/fleet/host_cpu.py`` (``deviceq scheduler run`` and one ``deviceq host run`` serving
``--devices`` devices whose tasks only sleep ``--task-s`` seconds, a private redis-server), with
the host started through this file (``--wrap``), which times the per-task functions listed in
`TIMED` on the CPU clock of the thread that runs them (``time.thread_time``: a thread waiting
for the GIL or a lock spends nothing) and the cyclic garbage collector's passes by generation.
A sampling profiler at this rate (a few % of a core) cannot rank functions; a deterministic one
(cProfile, yappi) multiplies the cost of every small call several times.

Over the window (from the end of the first round to the end of the last but one), per task
done: each function's calls and CPU (a function's figure includes the functions it calls, so
rows overlap), the host process's whole CPU, and each of its threads' CPU (those alive at the
end, by name: the runner threads together).

Usage: ``python bench/fleet/host_profile.py [--task-s 1.0] [--rounds 20] [--devices 100]
[--async] [--out F]`` (``--async``: an async runner on the host's event loop);
side by side with a baseline: ``python -m bench.ab --baseline REV bench/fleet/host_profile.py``."""

from __future__ import annotations

import atexit
import gc
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TIMED: list[tuple[str, str, str]] = [
    # (module, attribute path, row label): the thread that runs it in the label
    ("deviceq.host.claims", "assignments", "main: parse claimed tasks"),
    ("deviceq.host.redis_link", "HostClient.wait_and_claim", "main: wait and claim (incl. parse)"),
    ("deviceq.host.redis_link", "HostClient.claim", "main: claim (incl. parse)"),
    ("deviceq.host.execution", "Executor.start", "main: Executor.start"),
    ("deviceq.host.execution", "Executor.execute", "runner: Executor.execute (whole run)"),
    ("deviceq.host.dispatcher", "TaskDispatcher.dispatch", "runner: dispatch (incl. runner)"),
    ("bench.fleet.runners", "hold_goal", "runner: the runner itself (sleep)"),
    ("deviceq.host.execution", "Executor.begin", "runner: Executor.begin (log, progress open)"),
    ("deviceq.host.execution", "Executor.end", "runner: Executor.end (incl. finish)"),
    ("deviceq.host.execution", "Executor.finish", "runner: Executor.finish"),
    ("deviceq.host.dispatcher", "TaskDispatcher._task", "runner: dispatcher: the Task made"),
    ("deviceq.host.dispatcher", "TaskDispatcher._mapped", "runner: dispatcher: outcome mapped"),
    ("deviceq.host.log_stream", "LogStreamer.open", "runner: live log open"),
    ("deviceq.host.log_stream", "LogStreamer.close", "runner: live log close"),
    ("deviceq.host.reporter", "Reporter._deliver", "reporter: deliver (incl. call)"),
    ("deviceq.host.redis_link", "HostClient.report_many", "reporter: report_many"),
    ("deviceq.host.execution", "Executor.answered", "reporter: answered"),
    ("deviceq.host.execution", "Executor.close_run", "reporter: close_run"),
    ("deviceq.host.log_stream", "LogStreamer.flush", "log-stream: flush"),
    ("deviceq.host.dispatcher", "_Watchdog._tell", "watchdog: tell a runner to stop"),
]
"""The functions timed (those that no longer exist in a tree are left out)."""


# -- the wrapped host process ----------------------------------------------------------------
class Timers:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: dict[str, list[float]] = {}  # label -> [calls, cpu seconds]
        self.cpu0 = time.process_time()
        self._gc_start: dict[int, float] = {}

    def add(self, label: str, seconds: float) -> None:
        with self.lock:
            row = self.rows.setdefault(label, [0, 0.0])
            row[0] += 1
            row[1] += seconds

    def wrap(self, owner: Any, name: str, label: str) -> None:
        fn = getattr(owner, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(label, time.thread_time() - t0)

        setattr(owner, name, timed)

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        tid = threading.get_ident()
        if phase == "start":
            self._gc_start[tid] = time.thread_time()
        elif tid in self._gc_start:
            self.add(
                f"gc: generation {info['generation']}", time.thread_time() - self._gc_start.pop(tid)
            )

    def reset(self) -> None:
        with self.lock:
            self.rows.clear()
            self.cpu0 = time.process_time()
            self.threads0 = thread_cpu()

    def dump(self, path: str) -> None:
        with self.lock:
            data = {"rows": self.rows, "cpu_s": time.process_time() - self.cpu0}
            threads: dict[str, float] = {}
            base = getattr(self, "threads0", {})
            for tid, (name, cpu) in thread_cpu().items():
                kind = thread_kind(name)
                threads[kind] = threads.get(kind, 0.0) + cpu - base.get(tid, ("", 0.0))[1]
            data["threads"] = threads
        Path(path).write_text(json.dumps(data), encoding="utf-8")


def thread_kind(name: str) -> str:
    """A thread's row: its name without the task a runner thread is named after."""
    for prefix in ("run-", "runner-", "stdout-", "stderr-", "asyncio_"):
        if name.startswith(prefix):
            return prefix.rstrip("-_") + " threads"
    return name


def thread_cpu() -> dict[int, tuple[str, float]]:
    """Each live thread of this process: its name and CPU seconds (``schedstat``)."""
    out = {}
    for t in threading.enumerate():
        try:
            ns = Path(f"/proc/self/task/{t.native_id}/schedstat").read_text().split()[0]
        except (OSError, IndexError):
            continue
        out[t.native_id or 0] = (t.name, int(ns) / 1e9)
    return out


def wrapped_host(out: str, argv: list[str]) -> None:
    """Run ``deviceq ARGV`` in this process with `TIMED` timed; SIGUSR1 starts the window,
    SIGUSR2 writes it to ``out`` (and so does the exit)."""
    import importlib

    timers = Timers()
    for module, attr, label in TIMED:
        try:
            owner: Any = importlib.import_module(module)
        except ImportError:
            continue
        *path, name = attr.split(".")
        for part in path:
            owner = getattr(owner, part, None)
        if owner is not None and hasattr(owner, name):
            timers.wrap(owner, name, label)
    gc.callbacks.append(timers.on_gc)
    signal.signal(signal.SIGUSR1, lambda *_: timers.reset())
    signal.signal(signal.SIGUSR2, lambda *_: timers.dump(out))
    atexit.register(timers.dump, out)
    from deviceq.cli import main as deviceq_main

    sys.argv = ["deviceq", *argv]
    deviceq_main()


# -- the run ---------------------------------------------------------------------------------
def run(
    task_s: float, rounds: int, devices: int, tmp: Path, asynchronous: bool = False
) -> dict[str, Any]:
    from bench.fleet.daemons import done_count, held_fleet
    from bench.support.procs import Registry

    out = tmp / "host-profile.json"
    reg = Registry()
    try:
        wrap = [sys.executable, __file__, "--wrap", str(out), "--"]
        fleet = held_fleet(
            reg, task_s, rounds, devices, host_command=wrap, asynchronous=asynchronous
        )
        host = fleet.procs["host"]
        host.send_signal(signal.SIGUSR1)
        c0 = done_count(fleet.r)
        fleet.wait_last_but_one_round(devices, task_s, rounds)
        host.send_signal(signal.SIGUSR2)
        tasks = done_count(fleet.r) - c0
        deadline = time.monotonic() + 10
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        data = json.loads(out.read_text(encoding="utf-8"))
        fleet.close()
        return {"tasks": tasks, **data}
    finally:
        reg.close()


def table(res: dict[str, Any]) -> str:
    """The markdown table: the whole process first, then each timed function and each
    generation of the garbage collector (a row of zeros where nothing ran)."""
    tasks = max(1, int(res["tasks"]))
    lines = [
        f"Host daemon, {res['tasks']} tasks (rows overlap: a function's CPU includes what it "
        "calls)",
        "",
        "| function (thread) | calls per task | µs per task | µs per call |",
        "|---|---:|---:|---:|",
        f"| the whole process (every thread) | - | {res['cpu_s'] * 1e6 / tasks:,.1f} | - |",
    ]
    labels = [label for _, _, label in TIMED] + [f"gc: generation {g}" for g in range(3)]
    for label in labels:
        calls, cpu = res["rows"].get(label, (0, 0.0))
        per_call = f"{cpu * 1e6 / calls:,.1f}" if calls else "-"
        lines.append(f"| {label} | {calls / tasks:.2f} | {cpu * 1e6 / tasks:,.1f} | {per_call} |")
    threads = res.get("threads") or {}
    if threads:
        lines += ["", "| thread (live at the end) | µs per task |", "|---|---:|"]
        for name, cpu in sorted(threads.items(), key=lambda kv: -kv[1]):
            lines.append(f"| {name} | {cpu * 1e6 / tasks:,.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--wrap":
        out, rest = sys.argv[2], sys.argv[3:]
        wrapped_host(out, rest[1:] if rest[:1] == ["--"] else rest)
        return
    from bench.fleet.daemons import host_bench_args

    a = host_bench_args(__doc__.split("\n\n")[0])
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        md = table(run(a.task_s, a.rounds, a.devices, Path(tmp), a.asynchronous))
    print(md, end="")
    if a.out:
        a.out.write_text(md, encoding="utf-8")
    print(f"(machine: {os.cpu_count()} cpus, load {os.getloadavg()})", file=sys.stderr)


if __name__ == "__main__":
    main()
