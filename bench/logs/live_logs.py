"""What live logs cost: command runs printing 1 KiB lines at ``--rate`` bytes/s for
``--seconds`` on each of ``--devices`` devices of one real ``deviceq host run`` (and a real
``deviceq scheduler run``), on a private redis-server. Measured over the runs:

- Redis CPU per MB (``INFO cpu`` delta) and the host daemon's own CPU per MB (/proc, without
  its children, the writers);
- memory of the streams: ``used_memory`` delta and the streams' ``MEMORY USAGE``;
- follow lag: every line carries the time it was printed; one follower per task reads the
  attempt's stream like ``deviceq task logs --follow`` does (``LogReader.follow`` in a
  thread) and takes, per line, the time from its printing to its arrival (p50, p99, max);
- what was printed, streamed and dropped (the host keeps at most ``BUFFER_BYTES`` of a run
  between two flushes; the rest is replaced by a drop marker).

Then, in the same run, the drain benchmark of ``python -m bench`` for deviceq (tasks that
print nothing: lifecycles/s and Redis CPU per lifecycle, ``bench.support.deviceq_daemons``), in
``--rounds`` rounds; with ``--baseline REV`` (repeatable) each round also drains on the tree
of git revision REV (``git archive``: e.g. the last one without live logs), alternating, so
all see the same load of the machine.

Run from the repository root: ``python -m bench.logs.live_logs [--quick] [--json]``."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (run by path: the repository root)

from bench import URL_ENV  # noqa: E402
from bench.support.common import percentile  # noqa: E402
from bench.support.deviceq_daemons import add_host  # noqa: E402
from bench.support.procs import (  # noqa: E402
    REPO,
    Registry,
    baseline_tree,
    child_env,
    cli,
    interrupt_on_signals,
    log,
)
from bench.support.redisstats import Probe  # noqa: E402
from deviceq import Client  # noqa: E402
from deviceq.core.keys import Keys  # noqa: E402
from deviceq.core.live_logs import LogReader  # noqa: E402
from deviceq.host.log_stream import BUFFER_BYTES, FLUSH_EVERY  # noqa: E402
from deviceq.ops.admin import PoolAdmin  # noqa: E402

POOL = "logbench"
HOST = "bench-host"
DRIVER = "bench"
LINE = 1024  # bytes per printed line, newline included
TARGET_P99_MS = 500.0
STAMP = re.compile(r"^L(\d{16}) ")
DROPPED = re.compile(r"\[deviceq\] ([\d,]+) bytes of output dropped")

WRITER = r"""
import sys, time
rate, seconds = float(sys.argv[1]), float(sys.argv[2])
per_line, tick = 1024, 0.01
pad = "x" * per_line
out = sys.stdout
t0 = time.monotonic()
sent = 0
while True:
    now = time.monotonic()
    if now - t0 >= seconds:
        break
    due = int((now - t0) * rate / per_line) + 1 - sent
    if due > 0:
        buf = []
        for i in range(due):
            head = "L%016d %09d " % (time.time_ns() // 1000, sent + i)
            buf.append(head + pad[: per_line - len(head) - 1] + "\n")
        out.write("".join(buf))
        out.flush()
        sent += due
    time.sleep(tick)
"""


@dataclass
class Follower:
    """What one follower thread saw of one task's attempt 1."""

    task_id: str
    lags_ms: list[float] = field(default_factory=list)
    stdout_bytes: int = 0
    dropped_bytes: int = 0
    entries: int = 0
    error: str = ""

    def run(self, reader: LogReader, timeout: float) -> None:
        try:
            for entry in reader.follow(self.task_id, 1, timeout=timeout):
                now_us = time.time_ns() // 1000
                self.entries += 1
                if entry.stream != "stdout":
                    m = DROPPED.search(entry.text)
                    if m:
                        self.dropped_bytes += int(m.group(1).replace(",", ""))
                    continue
                self.stdout_bytes += len(entry.text.encode())
                for line in entry.text.split("\n"):
                    m = STAMP.match(line)
                    if m:
                        self.lags_ms.append((now_us - int(m.group(1))) / 1000)
        except Exception as exc:  # noqa: BLE001 - reported in the results
            self.error = f"{type(exc).__name__}: {exc}"


@dataclass
class LogRun:
    devices: int
    rate: float
    seconds: float
    window_s: float
    printed_bytes: int
    streamed_bytes: int
    dropped_bytes: int
    entries: int
    redis_cpu_s: float
    host_cpu_s: float
    used_memory_delta: int
    stream_memory: int
    stream_entries: int
    lag_p50_ms: float
    lag_p99_ms: float
    lag_max_ms: float
    lag_samples: int
    errors: list[str]

    def per_mb(self, seconds: float, denominator: int) -> float:
        """Milliseconds of CPU per MB (10^6 bytes) of ``denominator`` bytes."""
        return seconds * 1e3 / max(1e-9, denominator / 1e6)


def own_cpu_s(pid: int) -> float:
    """User + system CPU of one process, its children not included."""
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def wait_until(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.02)


def run_logs(reg: Registry, devices: int, rate: float, seconds: float) -> LogRun:
    """The live-log measurement (see the module's docstring) on a fresh private server."""
    server = reg.redis_server()
    try:
        env = child_env({URL_ENV: server.url})
        base = [cli(), "--redis-url", server.url, "--pool", POOL]
        token_file = add_host(reg, base, env)
        writer = reg.tmp / "writer.py"
        writer.write_text(WRITER)
        devs = [a for i in range(1, devices + 1) for a in ("--device", f"d{i:02d}:{DRIVER}")]
        host = reg.spawn("host", [
            *base, "host", "run", "--host-id", HOST, "--token-file", str(token_file), *devs,
            "--goal-runner", "command", "--command", "sh -c {goal}",
            "--state-dir", str(reg.tmp / "state"),
        ], env)  # fmt: skip
        scheduler = reg.spawn("scheduler", [*base, "scheduler", "run"], env)
        client = Client(server.url, POOL)
        reader = LogReader(client.redis, Keys(POOL))
        admin = PoolAdmin(client.redis, POOL)
        wait_until(lambda: len(admin.devices()) == devices, 30, "the host's devices")
        probe = Probe(server.url)
        probe.calibrate()
        mem0 = int(probe.r.info("memory")["used_memory"])
        mark, s1 = probe.mark(), probe.snapshot()
        cpu1 = own_cpu_s(host.pid)
        t0 = time.perf_counter()
        goal = f"exec python3 {writer} {rate:g} {seconds:g}"
        ids = client.submit_many([{"goal": goal, "driver_type": DRIVER}] * devices)
        followers = [Follower(t) for t in ids]
        threads = [
            threading.Thread(target=f.run, args=(reader, seconds + 120), daemon=True)
            for f in followers
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join(seconds + 180)
        wait_until(lambda: all(client.get(t).status.terminal for t in ids), 60, "tasks end")
        window = time.perf_counter() - t0
        s2 = probe.snapshot()
        cpu2 = own_cpu_s(host.pid)
        info = probe.r.info("memory")
        keys = [Keys(POOL).log(t, 1) for t in ids]
        stream_mem = sum(int(probe.r.memory_usage(k, samples=0) or 0) for k in keys)
        stream_len = sum(int(probe.r.xlen(k)) for k in keys)
        usage = probe.usage(s1, s2, mark)
        errors = [f"{f.task_id}: {f.error}" for f in followers if f.error]
        errors += [
            f"{t}: {client.get(t).status.value}"
            for t in ids
            if client.get(t).status.value != "done"
        ]
        lags = [x for f in followers for x in f.lags_ms]
        streamed = sum(f.stdout_bytes for f in followers)
        dropped = sum(f.dropped_bytes for f in followers)
        reg.forget(host)
        reg.forget(scheduler)
        probe.close()
        client.close()
        return LogRun(
            devices=devices,
            rate=rate,
            seconds=seconds,
            window_s=window,
            printed_bytes=streamed + dropped,
            streamed_bytes=streamed,
            dropped_bytes=dropped,
            entries=sum(f.entries for f in followers),
            redis_cpu_s=usage.cpu_s,
            host_cpu_s=cpu2 - cpu1,
            used_memory_delta=int(info["used_memory"]) - mem0,
            stream_memory=stream_mem,
            stream_entries=stream_len,
            lag_p50_ms=percentile(lags, 50),
            lag_p99_ms=percentile(lags, 99),
            lag_max_ms=max(lags) if lags else float("nan"),
            lag_samples=len(lags),
            errors=errors,
        )
    finally:
        reg.stop_server(server)


DRAIN = """
import json, sys
try:
    from bench.support.deviceq_daemons import run_deviceq
    from bench.support.procs import Registry
except ImportError:  # (a revision from before bench/ had its folders)
    from bench.deviceq_daemons import run_deviceq
    from bench.procs import Registry
reg = Registry()
try:
    r = run_deviceq(reg, int(sys.argv[1]), 0, 0, timeout=600)
    d = r.drain
    print(json.dumps({"tasks": d.jobs, "per_s": d.rate, "redis_cpu_us": d.redis_cpu_us_per_job,
                      "commands": d.commands_per_job, "host_cpu_us": d.proc_cpu_us_per_job("host"),
                      "scheduler_cpu_us": d.proc_cpu_us_per_job("scheduler"), "ok": r.ok,
                      "counts": r.counts, "counter": d.final_counter}))
finally:
    reg.close()
"""


def drain_in(tree: Path, tasks: int) -> dict[str, Any]:
    """``python -m bench``'s deviceq drain of ``tasks`` silent tasks, with the bench and
    deviceq of ``tree`` (in a process of its own)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree / "src"), str(tree)]))
    out = subprocess.run([sys.executable, "-c", DRAIN, str(tasks)], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=900)  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"drain in {tree} failed:\n{out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def drain_line(name: str, ds: list[dict[str, Any]]) -> str:
    def med(k: str) -> str:
        vals = sorted(d[k] for d in ds)
        return f"{vals[len(vals) // 2]:,.0f} ({vals[0]:,.0f}-{vals[-1]:,.0f})"

    return (
        f"drain of {ds[0]['tasks']:,} silent tasks, {name}, median (min-max) of {len(ds)}: "
        f"{med('per_s')} lifecycles/s, Redis CPU {med('redis_cpu_us')} us/lifecycle, "
        f"commands {med('commands')}/lifecycle, host {med('host_cpu_us')} us, scheduler "
        f"{med('scheduler_cpu_us')} us; every task done: {all(d['ok'] for d in ds)}"
        + "".join(f" ({d['counts']}, counter {d['counter']})" for d in ds if not d["ok"])
    )


def report(run: LogRun, drains: dict[str, list[dict[str, Any]]], machine: str) -> str:
    mb = 1e6
    out = [
        f"machine: {machine}",
        f"settings: {run.devices} devices x {run.rate / mb:.3g} MB/s x {run.seconds:g} s "
        f"(lines of {LINE} B); host flushes every {FLUSH_EVERY:g} s, at most "
        f"{BUFFER_BYTES:,} B per run between flushes",
        f"window (submit -> last task done): {run.window_s:.1f} s",
        f"printed {run.printed_bytes / mb:.1f} MB, streamed {run.streamed_bytes / mb:.1f} MB "
        f"({100 * run.streamed_bytes / max(1, run.printed_bytes):.1f} %), dropped "
        f"{run.dropped_bytes / mb:.1f} MB; {run.entries:,} entries read",
        f"Redis CPU {run.redis_cpu_s:.2f} s = {run.per_mb(run.redis_cpu_s, run.streamed_bytes):.2f}"
        f" ms/MB streamed ({run.per_mb(run.redis_cpu_s, run.printed_bytes):.2f} ms/MB printed)",
        f"host CPU {run.host_cpu_s:.2f} s = {run.per_mb(run.host_cpu_s, run.streamed_bytes):.2f}"
        f" ms/MB streamed ({run.per_mb(run.host_cpu_s, run.printed_bytes):.2f} ms/MB printed)",
        f"used_memory delta {run.used_memory_delta / mb:.1f} MB; streams' MEMORY USAGE "
        f"{run.stream_memory / mb:.1f} MB ({run.stream_memory / max(1, run.streamed_bytes):.3f}"
        f" x the bytes streamed), {run.stream_entries:,} entries",
        f"follow lag p50 {run.lag_p50_ms:.0f} ms, p99 {run.lag_p99_ms:.0f} ms, max "
        f"{run.lag_max_ms:.0f} ms over {run.lag_samples:,} lines; target p99 <= "
        f"{TARGET_P99_MS:.0f} ms: {'met' if run.lag_p99_ms <= TARGET_P99_MS else 'NOT met'}",
    ]
    out += [drain_line(name, ds) for name, ds in drains.items() if ds]
    if run.errors:
        out.append("errors: " + "; ".join(run.errors[:5]))
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # fmt: skip
    p.add_argument("--seconds", type=float, default=60.0, help="how long each run prints")
    p.add_argument("--devices", type=int, default=16, help="devices (runs at once)")
    p.add_argument("--rate", type=float, default=1e6, help="bytes/s each run prints")
    p.add_argument("--drain-tasks", type=int, default=10000,
                   help="silent tasks of the drain measurement (0: skip it)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=3, help="drain rounds (per tree)")
    p.add_argument("--baseline", metavar="REV", action="append", default=[],
                   help="also drain on git revision REV's tree, alternating (e.g. one without "
                        "live logs; repeatable)")  # fmt: skip
    p.add_argument("--quick", action="store_true",
                   help="smoke size: 4 devices, 5 s, 1000 tasks, 1 round")  # fmt: skip
    p.add_argument("--json", action="store_true", help="the raw figures as JSON on stdout")
    a = p.parse_args()
    if a.quick:
        a.seconds, a.devices, a.drain_tasks, a.rounds = 5.0, 4, 1000, 1
    if not (a.seconds > 0 and a.rate >= LINE and 1 <= a.devices <= 99):
        p.error(f"--seconds must be > 0, --rate >= {LINE} and --devices 1 to 99")
    if a.drain_tasks < 0 or a.rounds < 1:
        p.error("--drain-tasks must be >= 0 and --rounds >= 1")
    from bench.support.common import machine

    interrupt_on_signals()
    reg = Registry()
    try:
        load0 = os.getloadavg()
        log(f"live logs: {a.devices} devices x {a.rate:g} B/s x {a.seconds:g} s")
        run = run_logs(reg, a.devices, a.rate, a.seconds)
        trees = {"this tree": REPO}
        for rev in a.baseline:
            trees[f"revision {rev}"] = baseline_tree(reg.tmp, rev)
        drains: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for i in range(a.rounds if a.drain_tasks else 0):
            for name, tree in trees.items():
                log(f"drain round {i + 1}: {a.drain_tasks} silent tasks, {name}")
                drains[name].append(drain_in(tree, a.drain_tasks))
        text = report(run, drains, machine() + f" (load avg at start {load0[0]:.2f})")
        print(text, file=sys.stderr)
        if a.json:
            print(json.dumps({"logs": asdict(run), "drains": drains}, indent=1))
        ok = all(d["ok"] for ds in drains.values() for d in ds)
        return 0 if not run.errors and ok else 1
    finally:
        reg.close()


if __name__ == "__main__":
    sys.exit(main())
