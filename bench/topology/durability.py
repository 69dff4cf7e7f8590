"""Durable mode's cost: the real daemons' drain with ``durability=none`` and with
``durability=replica`` (a replica of the private server acknowledges every submission and
report: ``WAIT 1``), interleaved in one run, medians of ``--runs``. Writes
bench/topology/RESULTS-durability.md.

    python -m bench.topology.durability [--jobs 5000] [--runs 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from bench.support.deviceq_daemons import run_deviceq
from bench.support.procs import Registry, interrupt_on_signals

OUT = Path(__file__).resolve().parent / "RESULTS-durability.md"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=OUT, help=f"markdown report [{OUT.name}]")
    args = ap.parse_args(argv)
    rates: dict[str, list[float]] = {"none": [], "replica": []}
    cpu: dict[str, list[float]] = {"none": [], "replica": []}
    interrupt_on_signals()
    reg = Registry()
    try:
        for i in range(args.runs):
            for mode in ("none", "replica"):
                print(f"run {i + 1}/{args.runs}: durability={mode}", file=sys.stderr)
                run = run_deviceq(reg, args.jobs, 0.0, 0.0, 600.0, durability=mode)
                if not run.ok:
                    raise RuntimeError(
                        f"durability={mode}: not every task done once: {run.counts}, "
                        f"counter {run.drain.final_counter} of {run.expected_done}"
                    )
                rates[mode].append(run.drain.rate)
                cpu[mode].append(run.drain.redis_cpu_us_per_job)
    finally:
        reg.close()
    med = {m: statistics.median(v) for m, v in rates.items()}
    lines = [
        "# Durable mode's cost (deviceq real daemons)",
        "",
        f"{args.jobs} tasks drained by one `deviceq scheduler run` and one `deviceq host run`",
        "(16 devices, a Python goal runner in threads), each mode run "
        f"{args.runs} times, interleaved, on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        "| durability | tasks/s drained (median, min–max) | Redis CPU µs/task (median) |",
        "|---|---|---|",
    ]
    for m in ("none", "replica"):
        lines.append(
            f"| {m} | {med[m]:,.0f} ({min(rates[m]):,.0f}–{max(rates[m]):,.0f}) "
            f"| {statistics.median(cpu[m]):,.0f} |"
        )
    lines += ["", f"replica / none: {med['replica'] / med['none']:.2f}×", ""]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
