"""The HTTP API against direct Redis, producer side, in the same run on one private
redis-server: real daemons (``deviceq scheduler run`` and ``deviceq host run`` with the command
runner running ``true``, hosts on Redis directly) and a ``deviceq api`` process on a loopback
port. For each path (direct ``Client`` on Redis, ``ApiClient`` over HTTP):

- submit latency: one ``submit`` call at a time (p50, p99, mean, ms);
- lifecycles per second: N tasks submitted one by one, then waited for until done
  (``wait`` per task), from the first submit to the last done.

Printed as a table with the raw numbers and the API/direct ratios.

Usage: ``python bench/bench_api.py [--tasks N] [--devices D]`` from the repository root (a
smoke size by default: 60 tasks, 4 devices)."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import machine, percentile, private_redis, raw_client, table
from deviceq.api.tokens import TokenStore
from deviceq.api_client import ApiClient
from deviceq.embedded import free_port
from deviceq.ops.admin import PoolAdmin
from deviceq.producer import Client

POOL = "benchapi"
CLI = [sys.executable, "-c", "import sys; from deviceq.cli import main; sys.exit(main())"]
SRC = str(Path(__file__).resolve().parents[1] / "src")


def spawn(url: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "DEVICEQ_REDIS_URL": url, "DEVICEQ_POOL": POOL,
           "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    with open(log, "ab") as out:
        return subprocess.Popen([*CLI, *args], env=env, stdout=out, stderr=out,
                                stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip


def wait_until(cond: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/v1/openapi.json", timeout=2):
            return True
    except (urllib.error.URLError, OSError):
        return False


def measure(client: Any, n: int) -> dict[str, float]:
    """Submit ``n`` tasks one by one (latency each), then wait for every one to be done."""
    lat: list[float] = []
    t0 = time.perf_counter()
    ids = []
    for i in range(n):
        s = time.perf_counter()
        ids.append(client.submit(f"true {i}", driver_type="bench"))
        lat.append((time.perf_counter() - s) * 1000)
    for tid in ids:
        task = client.wait(tid, timeout=120)
        if task.status.value != "done":
            raise SystemExit(f"task {tid} ended {task.status.value}: {task.error}")
    total = time.perf_counter() - t0
    return {
        "p50": percentile(lat, 50),
        "p99": percentile(lat, 99),
        "mean": statistics.fmean(lat),
        "per_s": n / total,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=60, help="tasks per path (default 60)")
    p.add_argument("--devices", type=int, default=4, help="devices of the host (default 4)")
    args = p.parse_args()
    procs: list[subprocess.Popen[bytes]] = []
    with private_redis() as server, tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        r = raw_client(server.url)
        admin = PoolAdmin(r, POOL)
        token_file = tmp / "h1.token"
        token_file.write_text(admin.add_host("h1"))
        api_token = TokenStore(r, admin.keys).add("bench", "producer")
        port = free_port()
        devices = [a for d in range(args.devices) for a in ("--device", f"d{d}:bench")]
        try:
            procs.append(spawn(server.url, tmp / "sched.log", "scheduler", "run", "--tick", "0.2"))
            procs.append(spawn(server.url, tmp / "host.log", "host", "run", "--host-id", "h1",
                               "--token-file", str(token_file), *devices,
                               "--goal-runner", "command", "--command", "true"))  # fmt: skip
            procs.append(spawn(server.url, tmp / "api.log", "api", "--port", str(port),
                               "--no-access-log"))  # fmt: skip
            api_url = f"http://127.0.0.1:{port}"
            wait_until(lambda: answers(api_url), "deviceq api")
            wait_until(lambda: bool(admin.host("h1").alive), "host h1")
            direct = Client(raw_client(server.url), POOL)
            via_api = ApiClient(api_url, api_token)
            measure(direct, min(10, args.tasks))  # warm up both paths
            measure(via_api, min(10, args.tasks))
            d = measure(direct, args.tasks)
            a = measure(via_api, args.tasks)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
    rows = [
        ["submit p50 (ms)", d["p50"], a["p50"], a["p50"] / d["p50"]],
        ["submit p99 (ms)", d["p99"], a["p99"], a["p99"] / d["p99"]],
        ["submit mean (ms)", d["mean"], a["mean"], a["mean"] / d["mean"]],
        ["lifecycles/s", d["per_s"], a["per_s"], a["per_s"] / d["per_s"]],
    ]
    print(f"# deviceq HTTP API vs direct Redis ({args.tasks} tasks, {args.devices} devices)")
    print(machine())
    print(table(["metric", "direct Redis", "HTTP API", "API/direct"], rows))


if __name__ == "__main__":
    main()
