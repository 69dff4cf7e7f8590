"""The machine's upper bound of script calls per second: ``redis-benchmark`` running a trivial
script (``return 1``) through EVALSHA against a fresh private redis-server started the same
way as the measured ones (50 clients, no pipelining)."""

from __future__ import annotations

import csv
import io
import shutil
from dataclasses import dataclass

from bench.support.procs import Registry, child_env
from bench.support.redisstats import Probe

CLIENTS = 50


@dataclass
class Ceiling:
    calls: int
    per_s: float
    redis_cpu_us_per_call: float
    command: str


def run_ceiling(reg: Registry, calls: int) -> Ceiling:
    binary = shutil.which("redis-benchmark")
    if binary is None:
        raise FileNotFoundError("redis-benchmark is not installed")
    server = reg.redis_server()
    try:
        probe = Probe(server.url)
        sha = str(probe.r.script_load("return 1"))
        argv = [
            binary, "-h", "127.0.0.1", "-p", str(server.port), "-n", str(calls),
            "-P", "1", "-c", str(CLIENTS), "--csv", "EVALSHA", sha, "0",
        ]  # fmt: skip
        mark = probe.mark()
        before = probe.snapshot()
        out = reg.run("redis-benchmark", argv, child_env({}), timeout=600)
        usage = probe.usage(before, probe.snapshot(), mark)
        probe.close()
        rows = [r for r in csv.reader(io.StringIO(out)) if len(r) > 1]
        rps = float(rows[-1][1])  # header "test","rps",... then one row
        executed = usage.commands.get("evalsha", calls)
        hide = {sha: "<sha of 'return 1'>", str(server.port): "<port>"}
        shown = " ".join(hide.get(a, a) for a in argv[1:])
        return Ceiling(calls, rps, usage.cpu_s * 1e6 / executed, f"redis-benchmark {shown}")
    finally:
        reg.stop_server(server)
