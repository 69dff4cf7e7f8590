"""A suite's makespan against the ideal, balanced on duration history beside round-robin, and
the ETA's error at submit, with deviceq's real daemons.

400 tests whose durations have a known spread (lognormal, sigma ``--sigma``, scaled to
``--total`` seconds in all, seed ``--seed``) run as a suite of 10 shards on 10 simulated
devices: a ``deviceq scheduler run`` and a ``deviceq host run`` of 10 devices running goals as
commands, each shard `bench.support.suite_sim` sleeping its tests' durations (each +-10 %
jitter, a fresh draw every run) and writing its JUnit file, on a private redis-server.

1. a first run with no history (every test at the same estimate: shards of equal counts);
2. then ``--rounds`` times, in turn: the suite balanced on the history the runs recorded
   (longest first), and the same tests dealt round-robin;

each suite's makespan (its submit to its end, by Redis time) against the ideal (the sum of the
tests' durations over the 10 devices, or the longest test), and the ETA given at submit
against the makespan. The same split's arithmetic alone (no daemons: the true durations
placed by each split) over ``--seeds`` draws is printed first."""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run by path: the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.support.deviceq_daemons import add_host
from bench.support.procs import REPO, Registry, child_env, cli, log
from deviceq import Client
from deviceq.suites import sharding, store
from deviceq.suites.submission import plan, submit

POOL = "bench"
DEVICES = 10
TESTS = 400
NAME = "bench-suite"


def durations(seed: int, total: float, sigma: float, n: int = TESTS) -> dict[str, float]:
    """``n`` test ids with lognormal durations (sigma ``sigma``) summing to ``total`` s."""
    rnd = random.Random(seed)
    raw = [rnd.lognormvariate(0.0, sigma) for _ in range(n)]
    scale = total / sum(raw)
    return {f"com.bench.C{i % 20}#t{i}": round(x * scale, 4) for i, x in enumerate(raw)}


def ideal(est: dict[str, float], devices: int = DEVICES) -> float:
    return sharding.ideal(est, devices)


def arithmetic(seeds: int, total: float, sigma: float) -> dict[str, float]:
    """Makespan / ideal of each split with exact durations, over ``seeds`` draws."""
    lpt, rr = [], []
    for seed in range(seeds):
        est = durations(seed, total, sigma)
        tests = list(est)
        best = ideal(est)
        lpt.append(sharding.makespan(sharding.balance(tests, est, DEVICES), est) / best)
        rr.append(sharding.makespan(sharding.round_robin(tests, DEVICES), est) / best)
    return {
        "lpt_median": statistics.median(lpt),
        "lpt_max": max(lpt),
        "rr_median": statistics.median(rr),
        "rr_max": max(rr),
    }


def run_suite(client: Client, tests: list[str], split: str, command: str) -> dict[str, float]:
    """One suite of 10 shards, waited for: its makespan and the ETA at submit (s)."""
    p = plan(client, NAME, tests, command=command, driver_type="sim", shards=DEVICES,
             max_attempts=1, split=split)  # fmt: skip
    submit(client, client, p)
    s = client.wait_suite(p.suite_id, timeout=600)
    if s.status != "done":
        raise RuntimeError(f"suite {s.id} ended {s.status}: {s.counts}")
    makespan = (int(s.finished_at or 0) - s.submitted_at) / 1000
    return {"makespan_s": makespan, "eta_s": float(p.eta_s or math.nan)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--total", type=float, default=120.0, help="seconds of tests in all (120)")
    ap.add_argument("--sigma", type=float, default=1.0, help="lognormal spread (1.0)")
    ap.add_argument("--seed", type=int, default=7, help="the durations' draw (7)")
    ap.add_argument("--rounds", type=int, default=2, help="balanced/round-robin pairs (2)")
    ap.add_argument("--seeds", type=int, default=200, help="draws of the arithmetic (200)")
    ap.add_argument("--out", type=Path, help="write the markdown table here too")
    a = ap.parse_args()
    if a.total <= 0 or a.sigma < 0 or a.rounds < 1 or a.seeds < 1:
        ap.error("--total > 0, --sigma >= 0, --rounds >= 1, --seeds >= 1")

    ar = arithmetic(a.seeds, a.total, a.sigma)
    est = durations(a.seed, a.total, a.sigma)
    best = ideal(est)
    lines = [
        f"400 tests, lognormal sigma {a.sigma}, {a.total:g} s in all (seed {a.seed}: longest "
        f"{max(est.values()):.2f} s, median {statistics.median(est.values()):.3f} s), "
        f"10 devices: ideal makespan {best:.2f} s",
        "",
        f"The split alone (exact durations, {a.seeds} draws): balanced median "
        f"{ar['lpt_median']:.3f}x (max {ar['lpt_max']:.3f}x), round-robin median "
        f"{ar['rr_median']:.3f}x (max {ar['rr_max']:.3f}x) of the ideal",
        "",
        "| run | split | makespan s | x ideal | ETA at submit s | ETA error |",
        "|---|---|---|---|---|---|",
    ]
    reg = Registry()
    try:
        server = reg.redis_server()
        dfile = reg.tmp / "durations.json"
        dfile.write_text(json.dumps(est))
        env = child_env({"BENCH_SUITE_DURATIONS": str(dfile), "BENCH_SUITE_JITTER": "0.1"})
        base = [cli(), "--redis-url", server.url, "--pool", POOL]
        token = add_host(reg, base, env)
        client = Client(server.url, POOL)
        client.redis.hset(client.keys.config, "artifact_store", f"file://{reg.tmp / 'store'}")
        devices = [x for i in range(DEVICES) for x in ("--device", f"sim{i}:sim")]
        reg.spawn("scheduler", [*base, "scheduler", "run"], env)
        reg.spawn("host", [*base, "host", "run", "--host-id", "bench-host", "--token-file",
                           str(token), *devices, "--goal-runner", "command", "--command",
                           "sh -c {goal}", "--state-dir", str(reg.tmp / "state")], env)  # fmt: skip
        deadline = time.monotonic() + 60
        while len(store.matching_devices(client, "sim", [])) < DEVICES:
            if time.monotonic() > deadline:
                raise RuntimeError("the host's devices did not come up")
            time.sleep(0.2)
        sim = "from bench.support.suite_sim import main; main()"
        command = f"cd {REPO} && {sys.executable} -c '{sim}' {{tests}}"
        tests = list(est)
        runs = [("first (no history)", "balanced")]
        runs += [r for _ in range(a.rounds) for r in (("history", "balanced"),
                                                      ("history", "round_robin"))]  # fmt: skip
        for label, split in runs:
            log(f"suite: {label}, {split}")
            res = run_suite(client, tests, split, command)
            err = (res["eta_s"] - res["makespan_s"]) / res["makespan_s"]
            lines.append(
                f"| {label} | {split} | {res['makespan_s']:.2f} | "
                f"{res['makespan_s'] / best:.3f} | {res['eta_s']:.2f} | {err:+.1%} |"
            )
        client.close()
    finally:
        reg.close()
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)


if __name__ == "__main__":
    main()
