"""Collected results of a ``python -m bench`` run, rendered as markdown (bench/peers/RESULTS.md) and
as one JSON object (``--json``)."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from bench.peers.ceiling import Ceiling
from bench.support.deviceq_daemons import DeviceqRun
from bench.support.drain import Drain


@dataclass
class Results:
    jobs: int
    runs: int
    rate: float
    duration: float
    quick: bool
    argv: list[str]
    settings: dict[str, str] = field(default_factory=dict)  # system -> how it runs
    versions: dict[str, str] = field(default_factory=dict)  # system -> library version
    peers: dict[str, list[Drain]] = field(default_factory=dict)
    deviceq: list[DeviceqRun] = field(default_factory=list)
    ceilings: list[Ceiling] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # not installable / runnable here
    failures: dict[str, list[str]] = field(default_factory=dict)  # a run that went wrong
    loads: dict[str, list[float]] = field(default_factory=dict)  # 1-min load avg per system
    started: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    finished: str = ""

    def fail(self, system: str, why: str) -> None:
        self.failures.setdefault(system, []).append(why)


# -- statistics ------------------------------------------------------------------------------
def med(values: Iterable[float]) -> float:
    vals = [v for v in values if v == v]
    return float(statistics.median(vals)) if vals else float("nan")


def fmt(v: float) -> str:
    if v != v:
        return "-"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}"


def spread(values: Sequence[float]) -> str:
    """``median (min–max)`` over runs; just the value for one run."""
    vals = [v for v in values if v == v]
    if not vals:
        return "-"
    if len(vals) == 1:
        return fmt(vals[0])
    return f"{fmt(med(vals))} ({fmt(min(vals))}–{fmt(max(vals))})"


# -- machine ---------------------------------------------------------------------------------
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def redis_server_version() -> str:
    out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
    words = [w for w in out.stdout.split() if w.startswith("v=")]
    return words[0].removeprefix("v=") if words else "?"


def machine() -> dict[str, str]:
    def ver(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "?"

    return {
        "cpu": cpu_model(),
        "cores": str(os.cpu_count()),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "redis_server": redis_server_version(),
        "redis_py": ver("redis"),
        "hiredis": ver("hiredis"),
        "deviceq": ver("deviceq"),
    }


def total_cpu_us_per_job(d: Drain) -> float:
    """The CPU one job cost in all: the worker processes' (deviceq: the scheduler and the host
    daemon; a peer: its worker process) plus redis-server's, per job."""
    return d.proc_cpu_us_per_job() + d.redis_cpu_us_per_job


def fastest_peer(res: Results) -> str | None:
    """The peer with the highest median drain rate in this run (None: no peer ran)."""
    rates = {n: med(d.rate for d in drains) for n, drains in res.peers.items() if drains}
    rates = {n: r for n, r in rates.items() if r == r}  # (a failed run's NaN left out)
    return max(rates, key=lambda n: rates[n]) if rates else None


# -- rows ------------------------------------------------------------------------------------
@dataclass
class Row:
    system: str
    rate: list[float]
    rate_start: list[float]
    commands: list[float]
    redis_cpu: list[float]
    proc_cpu: list[float]
    total_cpu: list[float]
    exact: str
    top: str


def drain_row(system: str, drains: Sequence[Drain], expected: Callable[[int], int]) -> Row:
    bad = [d.final_counter for i, d in enumerate(drains) if d.final_counter != expected(i)]
    last = drains[-1]
    return Row(
        system=system,
        rate=[d.rate for d in drains],
        rate_start=[d.rate_from_start for d in drains],
        commands=[d.commands_per_job for d in drains],
        redis_cpu=[d.redis_cpu_us_per_job for d in drains],
        proc_cpu=[d.proc_cpu_us_per_job() for d in drains],
        total_cpu=[total_cpu_us_per_job(d) for d in drains],
        exact="yes" if not bad else f"NO (counter {bad})",
        top=last.usage.top(last.cost_jobs, 8),
    )


def rows(res: Results) -> list[Row]:
    out = []
    if res.deviceq:
        runs = res.deviceq
        out.append(
            drain_row(
                "deviceq (real daemons)", [r.drain for r in runs], lambda i: runs[i].expected_done
            )
        )
    for name, drains in res.peers.items():
        if drains:
            out.append(drain_row(name, drains, lambda i: res.jobs))
    return out


# -- markdown --------------------------------------------------------------------------------
def table(headers: Sequence[str], body: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def main_table(res: Results) -> str:
    return table(
        [
            "system",
            "jobs/s drained",
            "jobs/s incl. worker start-up",
            "Redis commands/job",
            "Redis CPU µs/job",
            "worker CPU µs/job",
            "every job once",
        ],
        (
            [
                r.system,
                spread(r.rate),
                spread(r.rate_start),
                spread(r.commands),
                spread(r.redis_cpu),
                spread(r.proc_cpu),
                r.exact,
            ]
            for r in rows(res)
        ),
    )


def markdown(res: Results, mach: dict[str, str]) -> str:
    n_runs = f"{res.runs} run" + ("s" if res.runs > 1 else "")
    stat = "median (min–max) of " + n_runs if res.runs > 1 else "1 run"
    lines = [
        "# deviceq beside peer queues: drain rate, Redis cost per job",
        "",
        f"Generated by `{' '.join(['python -m bench', *res.argv])}`, "
        f"{res.started} – {res.finished}. Values: {stat}.",
        "",
        "## Machine",
        "",
        f"- CPU: {mach['cpu']}, {mach['cores']} cores; kernel {mach['kernel']}",
        f"- Python {mach['python']}, redis-server {mach['redis_server']} (every system on its "
        f"own fresh private server, same binary and flags: "
        f"`deviceq.core.redis_server.RedisServer`, no persistence, loopback TCP), "
        f"redis-py {mach['redis_py']} + hiredis {mach['hiredis']}",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in sorted(res.versions.items())),
        "- 1-minute load average while each system ran (other work on the shared machine "
        "shows up here): "
        + ", ".join(f"{k} {'/'.join(f'{x:.1f}' for x in v)}" for k, v in res.loads.items()),
        "",
        "## Settings",
        "",
        f"- {res.jobs:,} no-op jobs per system and run, queued before the worker starts; "
        f"each job does one `INCR` of a counter key on the measured server. {n_runs}; the "
        "systems take turns within a run.",
        "- Drain: from the first job seen (counter >= 1) to the counter reaching N, "
        "polled every 5 ms. *jobs/s incl. worker start-up* counts from the worker's spawn "
        "instead (interpreter start, imports, connecting, registering).",
        "- Redis commands/job: `INFO commandstats` delta over the drain (commands run inside "
        "Lua scripts included, EVAL/EVALSHA counted as well), minus the harness's own INFO "
        "and GET calls. Redis CPU µs/job: `used_cpu_user + used_cpu_sys` delta (main and "
        "background threads), minus the harness's calls (their cost is calibrated on the same "
        "server before the worker starts). Worker CPU µs/job: user+sys CPU of the worker "
        "process tree (deviceq: scheduler + host daemons) over the drain.",
        "- Every job once: the counter equals the number of jobs after the workers were "
        "stopped (deviceq: after the latency phase too, and every task `done`).",
        "",
        "| system | how its ONE worker process runs |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in res.settings.items()],
        "",
        "## Drain: jobs/s and Redis cost per job",
        "",
        main_table(res),
        "",
    ]
    lines += top_commands(res)
    lines += deviceq_sections(res)
    lines += ceiling_section(res)
    lines += problems(res)
    lines += NOTES
    return "\n".join(lines) + "\n"


NOTES = [
    "## Notes on the method",
    "",
    "- Only the drain is measured: queueing the jobs (`Client.submit_many` for deviceq, each "
    "peer's own enqueue API) happens before the worker starts, so deviceq's Redis "
    "commands/job cover assign + claim + run + report (+ heartbeats, events), not submit.",
    "- The peers' workers log at WARNING (no line per job); the deviceq daemons run at their "
    "default `--log-level INFO`: a summary line of the scheduler's passes and one of "
    "the host's tasks every ~10 s (per-pass and per-task lines are DEBUG).",
    "- The deviceq runner does its INCR in a thread of the host process through one shared "
    "redis-py client (`bench/support/runners.py`); the peers' jobs do theirs through one client "
    "per worker process (arq: the worker's own pool), so every system pays one INCR per job.",
    "- arq 0.28.0 requires redis-py < 6 and bullmq 3.4.4 redis-py >= 6.2: arq runs from a "
    "virtualenv of its own (redis-py 5), created on first use under "
    "`~/.cache/deviceq-bench/venv-arq`.",
    "- CPU figures come from the kernel's accounting inside a VM: other load on the machine "
    "(see the load averages above) inflates them and lowers the rates; compare systems "
    "within one run rather than across runs on different days.",
    "",
]


def top_commands(res: Results) -> list[str]:
    body = [[r.system, r.top] for r in rows(res)]
    if not body:
        return []
    return [
        "Most frequent Redis commands per job (last run):",
        "",
        table(["system", "commands/job"], body),
        "",
    ]


def deviceq_sections(res: Results) -> list[str]:
    runs = res.deviceq
    if not runs:
        return []
    d = [r.drain for r in runs]
    out = [
        "## deviceq daemons: CPU per task during the drain",
        "",
        table(
            [
                "scheduler µs/task",
                "host µs/task",
                "both µs/task",
                "Redis CPU µs/task",
                "tasks per scheduler pass",
                "log lines/task: scheduler, host",
            ],
            [
                [
                    spread([x.proc_cpu_us_per_job("scheduler") for x in d]),
                    spread([x.proc_cpu_us_per_job("host") for x in d]),
                    spread([x.proc_cpu_us_per_job() for x in d]),
                    spread([x.redis_cpu_us_per_job for x in d]),
                    spread([r.tasks_per_pass for r in runs]),
                    ", ".join(
                        spread([r.log_lines.get(k, 0) / r.expected_done for r in runs])
                        for k in ("scheduler", "host")
                    ),
                ]
            ],
        ),
        "",
        "Tasks per pass and log lines count the whole run (drain and open loop), from the "
        "daemons' logs (at their default `--log-level INFO`).",
        "",
    ]
    lat = [r.latency for r in runs if r.latency]
    if lat:
        out += [
            "## deviceq open loop: submit → dispatched",
            "",
            f"Daemons idle, then `Client.submit_many` of whatever is due at "
            f"{fmt(lat[0].offered_per_s)} tasks/s offered for {fmt(res.duration)} s "
            "(from this process); latency = `since_submit_ms` of the `dispatched` events.",
            "",
            table(
                [
                    "offered/s",
                    "tasks",
                    "completed/s",
                    "p50 ms",
                    "p99 ms",
                    "max ms",
                    "Redis CPU µs/task",
                    "scheduler µs/task",
                    "host µs/task",
                ],
                [
                    [
                        fmt(lat[0].offered_per_s),
                        spread([x.submitted for x in lat]),
                        spread([x.completed_per_s for x in lat]),
                        spread([x.pct(50) for x in lat]),
                        spread([x.pct(99) for x in lat]),
                        spread([x.pct(100) for x in lat]),
                        spread([x.redis_cpu_us_per_task() for x in lat]),
                        spread([x.proc_cpu_s["scheduler"] * 1e6 / x.submitted for x in lat]),
                        spread([x.proc_cpu_s["host"] * 1e6 / x.submitted for x in lat]),
                    ]
                ],
            ),
            "",
            "*completed/s*: tasks / (first submission → last task done). When it is below the "
            "offered rate, deviceq could not keep up: the queue grew during the phase and the "
            "latency mostly measures that backlog."
            if med(x.completed_per_s for x in lat) < 0.95 * lat[0].offered_per_s
            else "*completed/s*: tasks / (first submission → last task done).",
            "",
        ]
    return out


def ceiling_section(res: Results) -> list[str]:
    if not res.ceilings:
        return []
    c = res.ceilings
    return [
        "## Upper bound: redis-benchmark EVALSHA of `return 1`",
        "",
        f"`{c[0].command}` on a fresh private server: **{spread([x.per_s for x in c])}** "
        f"calls/s, {spread([x.redis_cpu_us_per_call for x in c])} µs of Redis CPU per call.",
        "",
    ]


def problems(res: Results) -> list[str]:
    out = [
        f"- **{r.system}**: not every job ran exactly once: "
        f"{r.exact.removeprefix('NO (').removesuffix(')')} after {res.jobs:,} jobs per run "
        "(above N: some jobs ran twice; below: some never ran)"
        for r in rows(res)
        if r.exact != "yes"
    ]
    for name, why in res.skipped.items():
        out.append(f"- **{name}** skipped: {why}")
    for name, whys in res.failures.items():
        for why in whys:
            out.append(f"- **{name}** run failed: {why.splitlines()[0][:300]}")
    if not out:
        return []
    return ["## Skipped, failed or not exactly once", "", *out, ""]


# -- JSON ------------------------------------------------------------------------------------
def as_json(res: Results, mach: dict[str, str]) -> dict[str, Any]:
    def num(v: float) -> float | None:
        return None if v != v else round(v, 2)

    runs = res.deviceq
    d = [r.drain for r in runs]
    lat = [r.latency for r in runs if r.latency]
    peers = {name: num(med(x.rate for x in drains)) for name, drains in res.peers.items()}
    fastest = fastest_peer(res)
    detail = {
        r.system: {
            "jobs_per_s": num(med(r.rate)),
            "jobs_per_s_incl_startup": num(med(r.rate_start)),
            "redis_commands_per_job": num(med(r.commands)),
            "redis_cpu_us_per_job": num(med(r.redis_cpu)),
            "worker_cpu_us_per_job": num(med(r.proc_cpu)),
            "total_cpu_us_per_job": num(med(r.total_cpu)),
            "every_job_once": r.exact == "yes",
        }
        for r in rows(res)
    }
    return {
        "lifecycle_per_s": num(med(x.rate for x in d)) if d else None,
        "lifecycle_per_s_incl_startup": num(med(x.rate_from_start for x in d)) if d else None,
        "peers": peers,
        "submit_to_dispatch_ms": {
            "p50": num(med(x.pct(50) for x in lat)),
            "p99": num(med(x.pct(99) for x in lat)),
        }
        if lat
        else None,
        "redis_cpu_us_per_lifecycle": num(med(x.redis_cpu_us_per_job for x in d)) if d else None,
        "redis_commands_per_lifecycle": num(med(x.commands_per_job for x in d)) if d else None,
        "redis_ceiling_per_s": num(med(c.per_s for c in res.ceilings)) if res.ceilings else None,
        "daemon_cpu_us_per_task": {
            "scheduler": num(med(x.proc_cpu_us_per_job("scheduler") for x in d)),
            "host": num(med(x.proc_cpu_us_per_job("host") for x in d)),
        }
        if d
        else None,
        # deviceq's daemons (scheduler + host) + Redis, per job; the fastest peer's worker +
        # Redis, per job (medians of the runs)
        "total_cpu_us_per_job": num(med(total_cpu_us_per_job(x) for x in d)) if d else None,
        "fastest_peer": fastest,
        "peer_total_cpu_us_per_job": num(med(total_cpu_us_per_job(x) for x in res.peers[fastest]))
        if fastest
        else None,
        "deviceq_every_task_once": all(r.ok for r in runs) if runs else None,
        "systems": detail,
        "jobs": res.jobs,
        "runs": res.runs,
        "offered_rate_per_s": res.rate,
        "versions": res.versions,
        "skipped": res.skipped,
        "failed": {k: [w.splitlines()[0][:300] for w in v] for k, v in res.failures.items()},
        "machine": mach,
        "load_avg_1min": res.loads,
    }
