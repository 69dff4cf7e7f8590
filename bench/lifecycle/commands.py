"""Which record each Redis command of a task lifecycle keeps: ``python bench/lifecycle/commands.py
[--tasks 200] [--batch 5] [--out FILE]``.

The floor (``batch.py``) runs 22.8 data commands per task lifecycle, deviceq about 51.
This benchmark counts them (to within ~1%: the machine's speed does not change them, except
where a moment's delay makes a pass run the expiry step again or a call come out smaller) and
names the record each one keeps, so that what each record adds is a number. A command is not the
unit of cost: most of a script's instructions are the Lua around its commands (building keys,
reading replies into tables, encoding JSON), which ``instructions.py`` counts; a change
that merges commands without removing that work saves nothing (one ``HMGET`` of a script's
settings in place of one ``HGET`` each: 0.97x the commands, 1.00x the instructions).

It runs ``instructions.py``'s lifecycle: through the public API on one host of
``2 * --batch`` devices in two groups whose runs end in turn (``batch.staggered_rounds``),
``Client.submit_many`` in chunks of ``--batch``, then rounds of the host's upkeep (its full
device snapshot and one renewal of every running lease: column ``upkeep``, beside the
lifecycle), ``HostClient.report_many`` of one group, a scheduler pass (``TaskScheduler.assign``;
its expiry step only on the first pass: the daemon runs it on a 2 s tick) and
``HostClient.claim(batch)`` (where the tree's host link can, the renewals ride on the heartbeat
and the claim on the next report);
and the floor's lifecycle (three inline scripts: ``batch.FLOOR_*``), each on a private
redis-server under ``MONITOR``. Every data command (a script's own included; not the script
calls themselves) is put in one row by its key and name:

- ``task hash``: ``task:ID`` (and its goal key); ``queue``: the buckets and their index
  (``queue:SIG``, ``sig:SIG``, ``queues``, the floor's ``queue``, ``seq``);
- ``leases``, ``inbox`` (``host:ID:inbox``), ``device hash`` (``device:ID``),
  ``host hash and auth`` (``host:ID``), ``events``, ``attempt records`` (``task:ID:attempts``):
  records the floor keeps too;
- ``status indexes`` (``status:*``), ``idle sets`` (``idle``, ``idle:c:*``), ``device
  history`` (``device:ID:history``), ``holding counts`` (``host_held``, ``tenant_held``),
  ``wake-ups`` (``sched:wake``, ``host:ID:wake``), ``settings`` (``config``), ``clock``
  (``TIME``);
- ``scheduler's reads``: what the scheduler reads outside scripts (snapshot, heads);
- ``expiry step``: ``expire.lua``'s reads of its due sets.

Prints a markdown table (``--out`` writes it too): commands per task by record, for each phase
and the lifecycle, deviceq beside the floor."""

from __future__ import annotations

import argparse
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (run by path: the repository root)

from bench.lifecycle.batch import (  # noqa: E402
    DRIVER,
    FLOOR_ASSIGN,
    FLOOR_CLAIM,
    FLOOR_REPORT,
    GOAL,
    floor_submit,
    lab,
    staggered_rounds,
)
from bench.support.common import private_redis, raw_client, table  # noqa: E402
from deviceq.host.link import DeviceReport  # noqa: E402
from deviceq.scheduler import TaskScheduler  # noqa: E402

PHASES = ("submit", "pass", "claim", "report")
UPKEEP = "upkeep"  # (counted beside the lifecycle)
NOT_DATA = frozenset({"EVALSHA", "EVAL", "SCRIPT", "INFO", "CLIENT", "HELLO", "PING", "SELECT",
                      "MONITOR", "ECHO", "CONFIG"})  # fmt: skip
"""Commands that are not a lifecycle's data work (the script calls: their commands count)."""

RECORDS: list[tuple[str, str]] = [
    # (row, regular expression on the key without the pool prefix); first match wins
    ("attempt records", r"^task:[^:]+:attempts$"),
    ("task hash", r"^task:[^:]+(:goal)?$"),
    ("queue", r"^(queue(:.*)?|sig:.*|queues|seq)$"),
    ("status indexes", r"^status:"),
    ("leases", r"^leases$"),
    ("inbox", r"^(host:[^:]+:)?inbox$"),
    ("wake-ups", r"(^|:)wake$"),
    ("device history", r"^device:[^:]+:history$"),
    ("device hash", r"^device:[^:]+$"),
    ("host hash and auth", r"^host:[^:]+$"),
    ("events", r"^events$"),
    ("idle sets", r"^idle(:c:.*)?$"),
    ("holding counts", r"^(host|tenant)_held$"),
    ("settings", r"^config$"),
]
COMPILED = [(row, re.compile(rx)) for row, rx in RECORDS]
EXPIRY = "expiry step"
READS = "scheduler's reads"
CLOCK = "clock"
OTHER = "other"
ROWS = [r for r, _ in RECORDS] + [CLOCK, READS, EXPIRY, OTHER]
"""Rows in the table's order."""


def record_of(phase: str, lua: bool, name: str, key: str) -> str:
    """The row of one data command: ``name`` on ``key`` (the pool prefix taken off), run by a
    script (``lua``) or by a client, in ``phase``."""
    if name == "TIME":
        return CLOCK
    if phase == "pass" and not lua:
        return READS
    if phase == "pass" and name == "ZRANGEBYSCORE":
        return EXPIRY
    for row, rx in COMPILED:
        if rx.search(key):
            return row
    return OTHER


class Monitor:
    """Every command the server runs, from a ``MONITOR`` connection read in a thread; a phase
    is marked by an ``ECHO`` of its name."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url, decode_responses=True)
        self.mon = self.client.monitor()
        self.mon.connection.send_command("MONITOR")
        self.mon.connection.read_response()
        self.lines: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while True:
            try:
                self.lines.append(self.mon.next_command())
            except (redis.ConnectionError, OSError, ValueError):
                return

    def counts(self, r: redis.Redis, prefix: str) -> dict[str, Counter[str]]:
        """Data commands by phase and row (waits until the closing mark arrives)."""
        r.echo("PHASE end")
        deadline = time.monotonic() + 30
        while not any(x["command"] == "ECHO PHASE end" for x in self.lines[-50:]):
            if time.monotonic() > deadline:
                raise RuntimeError("MONITOR did not deliver the closing mark")
            time.sleep(0.05)
        out: dict[str, Counter[str]] = {p: Counter() for p in (*PHASES, UPKEEP)}
        phase = None
        for line in self.lines:
            words = line["command"].split(" ")
            name = words[0].upper()
            if name == "ECHO" and words[1:2] == ["PHASE"]:
                phase = words[2]
                continue
            if phase not in out or name in NOT_DATA:
                continue
            key = words[1].strip('"').removeprefix(prefix) if len(words) > 1 else ""
            out[phase][record_of(phase, line.get("client_type") == "lua", name, key)] += 1
        self.client.close()
        return out


def mark(r: redis.Redis, phase: str) -> None:
    r.echo(f"PHASE {phase}")


def run_deviceq(tasks: int, batch: int) -> dict[str, Counter[str]]:
    with private_redis() as server:
        lb = lab(server.url, 2 * batch)
        r, pool, client, host = lb.r, lb.pool, lb.client, lb.host
        sched = TaskScheduler(r, pool)
        sched.assign()  # (its set-up reads, not counted)
        devices = [DeviceReport(f"{host.host_id}-d{d:03d}", DRIVER) for d in range(2 * batch)]
        mon = Monitor(server.url)
        for i in range(0, tasks, batch):
            mark(r, "submit")
            client.submit_many([{"goal": GOAL, "driver_type": DRIVER}] * min(batch, tasks - i))
        first = [True]

        def sched_pass() -> Any:
            out = sched.assign(expire=first[0])
            first[0] = False
            return out

        def timed(phase: str, call: Callable[[], Any]) -> Any:
            mark(r, phase)
            return call()

        staggered_rounds(host, devices, batch, tasks, timed, sched_pass)
        out = mon.counts(r, f"dq:{{{pool}}}:")
        if client.counts().get("done") != tasks:
            raise RuntimeError("not every task ended done")
        return out


def run_floor(tasks: int, batch: int) -> dict[str, Counter[str]]:
    with private_redis() as server:
        r = raw_client(server.url)
        p = "dq:{floor}:"
        assign, claim, report = (r.register_script(s) for s in (FLOOR_ASSIGN, FLOOR_CLAIM,
                                                                 FLOOR_REPORT))  # fmt: skip
        for fn in (assign, claim, report):
            r.script_load(fn.script)
        devices = [f"d{i}" for i in range(batch)]
        mon = Monitor(server.url)
        for lo in range(0, tasks, batch):
            mark(r, "submit")
            floor_submit(r, p, lo, min(lo + batch, tasks))
        done = 0
        while done < tasks:
            mark(r, "pass")
            ids: list[Any] = r.zrange(p + "queue", 0, batch - 1)
            assign(keys=[p], args=[v for pair in zip(ids, devices, strict=False) for v in pair])
            mark(r, "claim")
            got = claim(keys=[p], args=[batch])
            mark(r, "report")
            report(keys=[p], args=[v for g in got for v in g[:2]])
            done += len(got)
        return mon.counts(r, p)


Counts = dict[str, Counter[str]]
"""Data commands by phase, then by row."""


def rows(dq: Counts, floor: Counts, tasks: int) -> list[list[str]]:
    def f(x: float) -> str:
        return f"{x:.2f}".rstrip("0").rstrip(".") if x else "-"

    def total(c: dict[str, Counter[str]], row: str) -> float:
        return sum(c[p][row] for p in PHASES) / tasks

    out = []
    for row in ROWS:
        if not total(dq, row) and not total(floor, row) and not dq[UPKEEP][row]:
            continue
        out.append([row, *(f(dq[p][row] / tasks) for p in PHASES), f(total(dq, row)),
                    f(total(floor, row)), f(dq[UPKEEP][row] / tasks)])  # fmt: skip
    everything: Callable[[dict[str, Counter[str]], str], float] = lambda c, p: (  # noqa: E731
        sum(c[p].values()) / tasks
    )
    out.append(["**all**", *(f(everything(dq, p)) for p in PHASES),
                f(sum(everything(dq, p) for p in PHASES)),
                f(sum(everything(floor, p) for p in PHASES)),
                f(everything(dq, UPKEEP))])  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=200, help="lifecycles to count (default 200)")
    ap.add_argument("--batch", type=int, default=5, help="items per script call (default 5)")
    ap.add_argument("--out", type=Path, help="write the table here too (bench.ab)")
    args = ap.parse_args()
    if args.tasks < 1 or args.batch < 1:
        ap.error("--tasks and --batch must be at least 1")
    dq = run_deviceq(args.tasks, args.batch)
    floor = run_floor(args.tasks, args.batch)
    text = table(
        [
            "record",
            *(f"deviceq {p}" for p in PHASES),
            "deviceq lifecycle",
            "floor lifecycle",
            "deviceq upkeep",
        ],
        rows(dq, floor, args.tasks),
    )
    print(text)
    print(f"\ndata commands per task; {args.tasks} tasks, {args.batch} items per call, one host "
          f"of {2 * args.batch} devices (two groups ending in turn), the expiry step "
          "once")  # fmt: skip
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
