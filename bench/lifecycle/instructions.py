"""What one task lifecycle costs redis-server in machine instructions, per phase, counted by
valgrind's callgrind: the same count for the same code and inputs whatever else the machine
is doing, so a change of a few percent in the scripts shows where timings (``batch.py``,
``transitions.py``) drown in the machine's noise. A figure is an A/B tool, not a
time: run it on two trees (``python -m bench.ab --baseline REV bench/lifecycle/instructions.py``).

The lifecycle is ``batch.py``'s, through the public API on one host of ``2 * --batch`` devices
in two groups whose runs end in turn (``batch.staggered_rounds``): ``Client.submit_many``
(chunks of ``--batch``), then rounds of the host's upkeep (its full device snapshot,
``HostClient.heartbeat(full=True)``: every device's entry parsed and applied, and one renewal
of every running lease), ``HostClient.report_many`` of one group's runs, a scheduler pass
(``TaskScheduler.assign``, its expiry step on the daemon's tick) and
``HostClient.claim(batch)`` until every task is done; the upkeep is counted as a phase of its
own beside the lifecycle. Where the tree's host link can, the renewals ride on the heartbeat
and the claim on the next report (``report.lua`` with ``claim_max``), as the daemon sends them.
Beside it, the same lifecycle of ``batch.py``'s floor (a stripped-down atomic lifecycle: three
inline scripts, see that module), on a server of its own: its submit is one pipelined ``HSET``
+ ``ZADD`` per task, its pass the ``ZRANGE`` snapshot and its assign script. Each phase's
instructions are counted apart (``callgrind_control`` zeroes the counters before a phase and
dumps them after) and divided by the tasks, and so are its data commands (``INFO
commandstats``, a script's own included; not the script calls). Only the instructions inside
``processCommand`` count (a command's execution, scripts' own commands included): not the event
loop, the reading of requests and writing of replies, nor the server's timed background work,
whose share would grow with the wall time of a phase.

Needs valgrind (``apt-get install valgrind``). Usage:
``python bench/lifecycle/instructions.py [--tasks 400] [--batch 5] [--out FILE]``"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (run by path: the repository root)

from bench.lifecycle.batch import (  # noqa: E402
    DRIVER,
    FLOOR_ASSIGN,
    FLOOR_CLAIM,
    FLOOR_REPORT,
    GOAL,
    ExpiryTick,
    floor_submit,
    lab,
    staggered_rounds,
)  # noqa: E402
from bench.support.common import raw_client, table  # noqa: E402
from deviceq.core import pacing  # noqa: E402
from deviceq.core.redis_server import RedisServer  # noqa: E402
from deviceq.host.link import DeviceReport  # noqa: E402
from deviceq.host.redis_link import HostClient  # noqa: E402
from deviceq.scheduler import TaskScheduler  # noqa: E402
from deviceq.scheduler.daemon import DEFAULT_TICK  # noqa: E402

PHASES = ("submit", "pass", "claim", "report")
EXTRA = ("upkeep",)
"""Counted beside the lifecycle, not in it: the host's full device snapshot once a round (a
``heartbeat.lua`` chunk of every device and its commit) and a renewal of its running leases
(``renew.lua``, or on the heartbeat; the floor has none)."""


SLOWDOWN = 100
"""About how much slower redis-server runs under callgrind. deviceq sizes its batched calls by
time (`deviceq.core.pacing`: 2.5 ms a call; ``claim.lua``'s 2.5 ms budget): under callgrind
they would shrink to one item a call (5 times the per-call work at 5 a call, against a floor
whose calls always take 5). Their time targets are stretched by this factor here, so that a
call takes the items it takes on a native server (``script calls per task`` shows it)."""


def require_callgrind() -> None:
    """Exit with a hint when valgrind's callgrind is not installed."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind)")


def stretch_time_targets() -> None:
    """Every `Pacer` made from now on sizes its calls toward ``SLOWDOWN`` times its target."""
    pacing.Pacer.__init__.__defaults__ = (pacing.TARGET_MS * SLOWDOWN, 1)


class StretchedHost(HostClient):
    """A `HostClient` whose claims carry ``claim.lua``'s budget times ``SLOWDOWN``."""

    def _claim_args(self, max_count: int) -> list[str]:
        return [*super()._claim_args(max_count), str(2500 * SLOWDOWN)]


class Counter:
    """callgrind's instruction counter of one process: zeroed and read around a phase."""

    def __init__(self, pid: int, out_dir: Path) -> None:
        self.pid = pid
        self.out_dir = out_dir

    def _control(self, *args: str) -> None:
        subprocess.run(
            ["callgrind_control", *args, str(self.pid)],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def zero(self) -> None:
        self._control("-z")

    def read(self) -> int:
        """Instructions since the last zero (dumped, then read back from the dump's summary)."""
        before = set(self.out_dir.glob("callgrind.out.*"))
        self._control("-d")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            new = set(self.out_dir.glob("callgrind.out.*")) - before
            for f in new:
                m = re.search(r"^(?:summary|totals): (\d+)", f.read_text(), re.M)
                if m:
                    f.unlink()
                    return int(m.group(1))
            time.sleep(0.05)
        raise RuntimeError("callgrind wrote no dump")


def counted_server(work: Path) -> tuple[RedisServer, Counter]:
    """A private redis-server under callgrind (counting inside ``processCommand`` only)."""
    wrapper = work / "redis-under-callgrind"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'cd "{work}" && exec valgrind --tool=callgrind --callgrind-out-file={work}/'
        "callgrind.out.%p.%n -q --collect-atstart=no --toggle-collect=processCommand "
        + str(shutil.which("redis-server"))
        + ' "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    server = RedisServer(binary=str(wrapper))
    server.start(timeout=120)
    assert server.proc is not None
    return server, Counter(server.proc.pid, work)


NOT_WORK = frozenset(
    {"evalsha", "eval", "info", "script", "config", "client", "hello", "ping", "select",
     "slowlog", "function"}
)  # fmt: skip
"""Commands that are not a lifecycle's data work: the script calls themselves (the commands a
script runs are counted), and the bench's own probes."""


def commands_run(r: Any) -> tuple[int, int]:
    """Data commands the server has run (``INFO commandstats``; those inside scripts too),
    and script calls."""
    stats = {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}
    data = sum(n for name, n in stats.items() if name not in NOT_WORK)
    return data, stats.get("evalsha", 0) + stats.get("eval", 0)


def count_phase(
    counter: Counter,
    spent: dict[str, int],
    r: Any,
    cmds: dict[str, int],
    calls: dict[str, int],
    phase: str,
    fn: Callable[[], object],
) -> object:
    """Run ``fn`` and add the instructions the server ran meanwhile to ``spent[phase]``, the
    data commands to ``cmds[phase]`` and the script calls to ``calls[phase]`` (both read
    outside the counted window)."""
    data0, calls0 = commands_run(r)
    counter.zero()
    out = fn()
    spent[phase] += counter.read()
    data1, calls1 = commands_run(r)
    cmds[phase] += data1 - data0
    calls[phase] += calls1 - calls0
    return out


def per_task(spent: dict[str, int], tasks: int) -> dict[str, float]:
    out = {p: spent[p] / tasks for p in PHASES}
    out["lifecycle"] = sum(out.values())
    out.update({p: spent[p] / tasks for p in EXTRA})
    return out


Counts = tuple[dict[str, float], dict[str, float], dict[str, float]]
"""Per task: instructions, data commands, script calls."""


def measure(tasks: int, batch: int, work: Path) -> Counts:
    """deviceq's instructions and data commands per task of each phase (and in all) for
    ``tasks`` lifecycles."""
    server, counter = counted_server(work)
    try:
        lb = lab(server.url, 2 * batch, StretchedHost)
        r, pool, client, host = lb.r, lb.pool, lb.client, lb.host
        for name in ("host_timeout", "claim_ttl", "lease_ttl"):  # (a slowed server: no expiry)
            lb.admin.set_config(name, 3600)
        stretch_time_targets()
        sched = TaskScheduler(r, pool)
        sched.assign()  # (first pass: the scheduler's own set-up reads)
        expiry = ExpiryTick(False, DEFAULT_TICK * SLOWDOWN)  # (the daemon's tick, stretched)
        spent, cmds, calls = (dict.fromkeys((*PHASES, *EXTRA), 0) for _ in range(3))
        timed = partial(count_phase, counter, spent, r, cmds, calls)
        devices = [DeviceReport(f"{host.host_id}-d{d:03d}", DRIVER) for d in range(2 * batch)]

        for i in range(0, tasks, batch):
            n = min(batch, tasks - i)
            batch_of_n = [{"goal": GOAL, "driver_type": DRIVER}] * n
            timed("submit", lambda b=batch_of_n: client.submit_many(b))
        staggered_rounds(host, devices, batch, tasks, timed,
                         lambda: sched.assign(expire=expiry.due()))  # fmt: skip
        if client.counts().get("done") != tasks:
            raise RuntimeError("not every task ended done")
        r.close()
    finally:
        server.stop()
    return per_task(spent, tasks), per_task(cmds, tasks), per_task(calls, tasks)


def measure_floor(tasks: int, batch: int, work: Path) -> Counts:
    """The floor's instructions and data commands per task of each phase, for the same
    lifecycles."""
    server, counter = counted_server(work)
    try:
        r = raw_client(server.url)
        p = "dq:{floor}:"
        assign, claim, report = (
            r.register_script(s) for s in (FLOOR_ASSIGN, FLOOR_CLAIM, FLOOR_REPORT)
        )
        for fn in (assign, claim, report):
            r.script_load(fn.script)
        devices = [f"d{i}" for i in range(batch)]
        spent, cmds, calls = (dict.fromkeys((*PHASES, *EXTRA), 0) for _ in range(3))
        timed = partial(count_phase, counter, spent, r, cmds, calls)

        for i in range(0, tasks, batch):
            timed("submit", partial(floor_submit, r, p, i, min(i + batch, tasks)))
        done = 0
        while done < tasks:

            def assign_pass() -> None:
                ids: list[Any] = r.zrange(p + "queue", 0, batch - 1)  # the snapshot read
                assign(keys=[p], args=[v for pair in zip(ids, devices, strict=False) for v in pair])

            timed("pass", assign_pass)
            got = timed("claim", lambda: claim(keys=[p], args=[batch]))
            assert isinstance(got, list) and got
            timed("report", lambda got=got: report(keys=[p], args=[v for g in got for v in g[:2]]))
            done += len(got)
        r.close()
    finally:
        server.stop()
    return per_task(spent, tasks), per_task(cmds, tasks), per_task(calls, tasks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=400, help="lifecycles to count (default 400)")
    ap.add_argument("--batch", type=int, default=5, help="items per script call (default 5)")
    ap.add_argument("--out", type=Path, help="write the table here too (bench.ab)")
    args = ap.parse_args()
    require_callgrind()
    with tempfile.TemporaryDirectory(prefix="deviceq-callgrind-") as tmp:
        t0 = time.monotonic()
        dq_counts = measure(args.tasks, args.batch, Path(tmp))
        floor_counts = measure_floor(args.tasks, args.batch, Path(tmp))
        took = time.monotonic() - t0
    (dq, dq_cmds, dq_calls), (floor, floor_cmds, _) = dq_counts, floor_counts
    rows = [
        [p, args.tasks, args.batch, round(dq[p]), round(floor[p]),
         f"{dq[p] / floor[p]:.2f}" if floor[p] else "-",
         f"{dq_cmds[p]:.1f}", f"{floor_cmds[p]:.1f}", f"{dq_calls[p]:.2f}"]
        for p in (*PHASES, "lifecycle", *EXTRA)
    ]  # fmt: skip
    text = table(
        ["phase", "tasks", "items per call", "deviceq instructions per task",
         "floor instructions per task", "x floor", "deviceq commands per task",
         "floor commands per task", "deviceq script calls per task"],
        rows,
    )  # fmt: skip
    print(text)
    print(
        f"\n{args.tasks} tasks, {args.batch} items per call, one host of {2 * args.batch} "
        "devices (two groups ending in turn); "
        f"callgrind, took {took:.0f} s (pid {os.getpid()})"
    )
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
