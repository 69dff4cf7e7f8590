"""``python -m bench``: deviceq's real daemons beside peer queues, side by side.

Per system and run, on a fresh private redis-server: N no-op jobs (one INCR each) are queued,
then ONE worker process starts (deviceq: one scheduler + one host daemon) and the drain is
measured: jobs/s, Redis commands and Redis CPU per job, worker CPU per job. Then, for deviceq,
submit -> dispatched latency at a fixed offered rate, and redis-benchmark's EVALSHA ceiling.

Usage: ``python -m bench [--quick] [--json] [--only deviceq,huey,...] [--jobs N] [--runs N]
[--rate R] [--duration S] [--runner thread|async] [--plan-ahead] [--out PATH]`` from the
repository root (``--plan-ahead``: deviceq's scheduler with next-task hints, ``scheduler run
--plan-ahead``). Writes ``bench/peers/RESULTS.md`` on a full run (not with ``--quick`` or
``--only`` unless ``--out`` is given); ``--json`` prints one JSON object on stdout (``--runs
N``: each figure the median of the N runs), among its fields ``total_cpu_us_per_job`` (deviceq's
daemons, the scheduler and the host daemon, plus Redis, CPU per job) and
``peer_total_cpu_us_per_job`` (the same for ``fastest_peer``, the peer with the highest drain
rate in the run: its worker plus Redis). Progress goes to stderr. Install the peers with ``pip
install -e '.[bench]'`` (arq gets a virtualenv of its own)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

from bench import peers
from bench.peers.ceiling import run_ceiling
from bench.peers.peer_drain import run_peer
from bench.peers.report import Results, as_json, fmt, machine, main_table, markdown
from bench.support.deviceq_daemons import RUNNERS, run_deviceq
from bench.support.deviceq_daemons import settings as deviceq_settings
from bench.support.procs import Registry, interrupt_on_signals, log

SYSTEMS = ("deviceq", *peers.PEERS, "ceiling")
DEFAULT_OUT = Path(__file__).resolve().parent / "peers" / "RESULTS.md"


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2,000 jobs, 1 run (under 2 minutes)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--only", default="", help=f"comma list out of: {','.join(SYSTEMS)}")
    p.add_argument("--jobs", type=int, help="jobs per system and run [10000; quick 2000]")
    p.add_argument("--runs", type=int, help="runs per system [3; quick 1]")
    p.add_argument("--rate", type=float, default=1000.0, help="open-loop tasks/s [1000]")
    p.add_argument("--duration", type=float, help="open-loop seconds [5; quick 3]")
    p.add_argument("--ceiling-calls", type=int, help="redis-benchmark -n [200000; quick 100000]")
    p.add_argument("--timeout", type=float, default=600.0, help="longest drain, seconds [600]")
    p.add_argument(
        "--runner",
        choices=sorted(RUNNERS),
        default="thread",
        help="deviceq's goal runner: a thread runner or an async runner [thread]",
    )
    p.add_argument(
        "--plan-ahead",
        action="store_true",
        help="deviceq's scheduler with next-task hints (scheduler run --plan-ahead): each busy "
        "device's next task chosen ahead, started by the report that frees it",
    )
    p.add_argument("--out", type=Path, help=f"markdown report [{DEFAULT_OUT.name} on full runs]")
    a = p.parse_args(argv)
    a.jobs = a.jobs or (2000 if a.quick else 10_000)
    a.runs = a.runs or (1 if a.quick else 3)
    a.duration = a.duration if a.duration is not None else (3.0 if a.quick else 5.0)
    a.ceiling_calls = a.ceiling_calls or (100_000 if a.quick else 200_000)
    a.systems = [s.strip() for s in a.only.split(",") if s.strip()] or list(SYSTEMS)
    unknown = set(a.systems) - set(SYSTEMS)
    if unknown:
        p.error(f"unknown system(s) {', '.join(sorted(unknown))}; one of: {', '.join(SYSTEMS)}")
    if a.jobs < 1 or a.runs < 1 or a.rate < 0:
        p.error("--jobs and --runs must be >= 1, --rate >= 0")
    if a.out is None and not a.quick and not a.only:
        a.out = DEFAULT_OUT
    return a


def prepare(
    res: Results, systems: list[str], runner: str = "thread", plan_ahead: bool = False
) -> list[str]:
    """Versions and settings of every system; peers that cannot run here are skipped."""
    ready = []
    for name in systems:
        if name == "deviceq":
            res.settings[name] = deviceq_settings(runner, plan_ahead)
        elif name == "ceiling":
            pass
        else:
            try:
                peer = peers.load(name)
                log(f"{name}: finding its interpreter")
                python = peer.interpreter()
                res.versions[name] = peers.version(python, peer.DIST)
                if res.versions[name] == "?":
                    raise peers.PeerUnavailable(f"{peer.DIST} is not installed ({python})")
                res.settings[name] = peer.SETTINGS
            except (ImportError, peers.PeerUnavailable) as exc:
                res.skipped[name] = str(exc)
                log(f"{name}: skipped: {exc}")
                continue
        ready.append(name)
    return ready


def run_one(reg: Registry, res: Results, name: str, args: argparse.Namespace) -> None:
    if name == "deviceq":
        r = run_deviceq(
            reg,
            args.jobs,
            args.rate,
            args.duration,
            args.timeout,
            runner=args.runner,
            plan_ahead=args.plan_ahead,
        )
        res.deviceq.append(r)
        d, lat = r.drain, r.latency
        log(
            f"deviceq: {fmt(d.rate)} tasks/s drained, {fmt(d.commands_per_job)} cmds/task, "
            f"{fmt(d.redis_cpu_us_per_job)} µs Redis CPU/task"
            + (f"; open loop p50 {fmt(lat.pct(50))} ms p99 {fmt(lat.pct(99))} ms" if lat else "")
            + ("" if r.ok else f"; NOT every task once: {r.counts}, counter {d.final_counter}")
        )
        if not r.ok:
            res.fail(name, f"counts {r.counts}, counter {d.final_counter}, "
                           f"expected {r.expected_done} done")  # fmt: skip
    elif name == "ceiling":
        c = run_ceiling(reg, args.ceiling_calls)
        res.ceilings.append(c)
        log(f"ceiling: {fmt(c.per_s)} EVALSHA/s, {fmt(c.redis_cpu_us_per_call)} µs Redis CPU/call")
    else:
        d = run_peer(reg, name, args.jobs, args.timeout)
        res.peers.setdefault(name, []).append(d)
        log(
            f"{name}: {fmt(d.rate)} jobs/s drained, {fmt(d.commands_per_job)} cmds/job, "
            f"{fmt(d.redis_cpu_us_per_job)} µs Redis CPU/job, counter {d.final_counter}"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    interrupt_on_signals()
    res = Results(args.jobs, args.runs, args.rate, args.duration, args.quick,
                  sys.argv[1:] if argv is None else argv)  # fmt: skip
    mach = machine()
    reg = Registry()
    try:
        systems = prepare(res, args.systems, args.runner, args.plan_ahead)
        for run in range(args.runs):
            for name in systems:
                log(f"run {run + 1}/{args.runs}: {name}")
                res.loads.setdefault(name, []).append(os.getloadavg()[0])
                try:
                    run_one(reg, res, name, args)
                except Exception as exc:  # one system failing must not end the run
                    res.fail(name, f"{type(exc).__name__}: {exc}")
                    log(f"{name}: FAILED: {exc}")
                    if os.environ.get("BENCH_DEBUG"):
                        traceback.print_exc()
    except KeyboardInterrupt:
        log("interrupted: stopping every process this run started")
        return 130
    finally:
        reg.close()
    res.finished = time.strftime("%H:%M UTC", time.gmtime())
    print(main_table(res), file=sys.stderr)
    if args.out:
        args.out.write_text(markdown(res, mach))
        log(f"wrote {args.out}")
    if args.json:
        print(json.dumps(as_json(res, mach)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
