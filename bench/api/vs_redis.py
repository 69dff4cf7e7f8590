"""The HTTP API against direct Redis, in one run on one private redis-server, with real
daemons for each setup (on a pool of its own): ``deviceq scheduler run``, 2 ``deviceq host
run`` daemons with 16 devices in all (goal runner ``bench.support.runners:noop`` in threads: the
cost measured is deviceq's, not a runner's) and, when used, a ``deviceq api`` process on a
loopback port. The setups:

- ``a``: everything direct (producer `Client` on Redis, hosts on Redis);
- ``b``: the producer through the API (`ApiClient`), hosts direct;
- ``c``: the producer and the hosts through the API (``host run --api-url``);
- ``b0``/``c0``: ``b``/``c`` with a new TCP connection per request (``keep_alive`` off in
  `ApiClient` and `ApiHostClient`): what the clients did before reusing connections.

Each setup (``--rounds`` times, interleaved; each metric's median reported): a warm-up, then
N tasks submitted one by one by one producer thread (each ``submit`` call timed), then every
task waited for (on Redis directly, not counted). Reported:
lifecycles per second (N over first submit -> last ``finished_at``), submit -> done latency
(``finished_at - submitted_at`` of each task, server clock), submit call latency, CPU of the
API process and of the host daemons per task, and each setup's ratio to ``a``.

Usage: ``python bench/api/vs_redis.py [--tasks N] [--devices D] [--hosts H] [--rounds R]`` from
the repository root (500 tasks, 16 devices, 2 hosts, 1 round by default: under a minute on 2
cores; ``--rounds 3`` for steadier medians on a shared machine)."""

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # (run by path: the repository root)

from bench.support.common import machine, percentile, private_redis, raw_client, table  # noqa: E402
from deviceq.api.tokens import TokenStore  # noqa: E402
from deviceq.core.redis_server import free_port  # noqa: E402
from deviceq.ops.admin import PoolAdmin  # noqa: E402
from deviceq.producer import Client  # noqa: E402
from deviceq.producer.http_client import ApiClient  # noqa: E402

DRIVER = "bench"
GOAL = "open the settings app, enable wifi, check the connection: ok"
CLI_CODE = "import sys; from deviceq.cli import main; sys.exit(main())"
NO_KEEP_ALIVE = (  # a host daemon whose ApiHostClient opens a connection per request
    "import sys; from deviceq.host.http_link import ApiHostClient; "
    "ApiHostClient.keep_alive = False; from deviceq.cli import main; sys.exit(main())"
)
SRC = str(ROOT / "src")


@dataclass(frozen=True)
class Setup:
    name: str
    producer_api: bool
    hosts_api: bool
    keep_alive: bool = True

    @property
    def label(self) -> str:
        where = "producer + hosts via API" if self.hosts_api else "producer via API"
        if not self.producer_api:
            return f"{self.name}: all direct"
        ka = " (keep-alive)" if self.keep_alive else " (a connection per request)"
        return f"{self.name}: {where}{ka}"


SETUPS = [
    Setup("a", False, False),
    Setup("b0", True, False, keep_alive=False),
    Setup("b", True, False),
    Setup("c0", True, True, keep_alive=False),
    Setup("c", True, True),
]


def spawn(
    url: str, pool: str, log: Path, *args: str, code: str = CLI_CODE
) -> subprocess.Popen[bytes]:
    path = os.pathsep.join([SRC, str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "DEVICEQ_REDIS_URL": url, "DEVICEQ_POOL": pool, "PYTHONPATH": path}
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", code, *args],
            env=env,
            stdout=out,
            stderr=out,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


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


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process and its reaped children (/proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def cpu(procs: list[subprocess.Popen[bytes]]) -> float:
    return sum(cpu_s(p.pid) for p in procs)


def run_tasks(producer: Any, direct: Client, n: int) -> tuple[list[float], list[str], float]:
    """Submit ``n`` tasks one by one (each call timed, ms), then wait for all on Redis."""
    lat: list[float] = []
    ids: list[str] = []
    t0 = time.time()
    for _ in range(n):
        s = time.perf_counter()
        ids.append(producer.submit(GOAL, driver_type=DRIVER))
        lat.append((time.perf_counter() - s) * 1000)
    for tid in ids:
        task = direct.wait(tid, timeout=300)
        if task.status.value != "done":
            raise SystemExit(f"task {tid} ended {task.status.value}: {task.error}")
    return lat, ids, t0


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each metric's median over the rounds."""
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def measure(
    setup: Setup, url: str, tmp: Path, args: argparse.Namespace, round_no: int = 0
) -> dict[str, float]:
    pool = f"benchapi-{setup.name}-{round_no}"
    r = raw_client(url)
    admin = PoolAdmin(r, pool)
    direct = Client(raw_client(url), pool)
    api_url = f"http://127.0.0.1:{free_port()}"
    per_host = max(1, args.devices // args.hosts)
    api: list[subprocess.Popen[bytes]] = []
    hosts: list[subprocess.Popen[bytes]] = []
    others: list[subprocess.Popen[bytes]] = []
    log = tmp / setup.name
    log.mkdir()
    try:
        if setup.producer_api or setup.hosts_api:
            port = api_url.rsplit(":", 1)[1]
            api.append(spawn(url, pool, log / "api.log", "api", "--port", port, "--no-access-log"))
            wait_until(lambda: answers(api_url), f"deviceq api of {setup.name}")
        others.append(spawn(url, pool, log / "sched.log", "scheduler", "run"))
        for h in range(args.hosts):
            hid = f"h{h}"
            token_file = tmp / f"{setup.name}-{hid}.token"
            token_file.write_text(admin.add_host(hid))
            devices = [a for d in range(per_host) for a in ("--device", f"{hid}d{d}:{DRIVER}")]
            via = ("--api-url", api_url) if setup.hosts_api else ()
            code = CLI_CODE if setup.keep_alive or not setup.hosts_api else NO_KEEP_ALIVE
            run = [
                "host",
                "run",
                "--host-id",
                hid,
                "--token-file",
                str(token_file),
                *devices,
                *via,
                "--goal-runner",
                "bench.support.runners:noop",
                "--isolation",
                "thread",
            ]
            hosts.append(spawn(url, pool, log / f"{hid}.log", *run, code=code))
        for h in range(args.hosts):
            wait_until(lambda h=h: bool(admin.host(f"h{h}").alive), f"host h{h}")
        producer: Any = direct
        if setup.producer_api:
            token = TokenStore(r, admin.keys).add("bench", "producer")
            producer = ApiClient(api_url, token)
            producer.keep_alive = setup.keep_alive
        started = time.perf_counter()
        run_tasks(producer, direct, args.warmup)
        warm = time.perf_counter() - started
        cpu_api, cpu_hosts = cpu(api), cpu(hosts)
        lat, ids, t0 = run_tasks(producer, direct, args.tasks)
        cpu_api, cpu_hosts = cpu(api) - cpu_api, cpu(hosts) - cpu_hosts
        tasks = [direct.get(t, attempts=False) for t in ids]
        print(f"  {setup.name}: warm-up {warm:.1f} s, measured {time.time() - t0:.1f} s",
              file=sys.stderr, flush=True)  # fmt: skip
    finally:
        stop(hosts)  # first: a host through the API drains through it
        stop([*others, *api])
    e2e = [float((t.finished_at or 0) - t.submitted_at) for t in tasks]
    last_done = max(t.finished_at or 0 for t in tasks) / 1000
    n = args.tasks
    return {
        "per_s": n / max(1e-3, last_done - t0),
        "e2e_p50": percentile(e2e, 50),
        "e2e_p99": percentile(e2e, 99),
        "sub_p50": percentile(lat, 50),
        "sub_p99": percentile(lat, 99),
        "api_cpu_ms": cpu_api * 1000 / n if api else float("nan"),
        "hosts_cpu_ms": cpu_hosts * 1000 / n,
    }


METRICS = [
    ("lifecycles/s", "per_s"),
    ("submit->done p50 (ms)", "e2e_p50"),
    ("submit->done p99 (ms)", "e2e_p99"),
    ("submit call p50 (ms)", "sub_p50"),
    ("submit call p99 (ms)", "sub_p99"),
    ("API CPU per task (ms)", "api_cpu_ms"),
    ("hosts CPU per task (ms)", "hosts_cpu_ms"),
]


def report(results: dict[str, dict[str, float]], args: argparse.Namespace) -> str:
    names = [s.name for s in SETUPS]
    base = results["a"]
    rows = []
    for label, key in METRICS:
        row: list[Any] = [label, *(results[s][key] for s in names)]
        for s in names[1:]:
            ratio = results[s][key] / base[key] if base[key] else float("nan")
            row.append(f"{ratio:.2f}x" if ratio == ratio else "-")  # NaN: not measured
        rows.append(row)
    head = ["metric", *names, *(f"{s}/a" for s in names[1:])]
    lines = [
        f"# deviceq HTTP API vs direct Redis ({args.tasks} tasks per setup, {args.hosts} hosts, "
        f"{args.devices} devices, warm-up {args.warmup}, median of {args.rounds} round(s))",
        machine(),
        "",
        *(f"- {s.label}" for s in SETUPS),
        "",
        table(head, rows),
    ]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", type=int, default=500, help="tasks per setup (default 500)")
    p.add_argument("--devices", type=int, default=16, help="devices in all (default 16)")
    p.add_argument("--hosts", type=int, default=2, help="host daemons (default 2)")
    p.add_argument("--warmup", type=int, default=30, help="warm-up tasks per setup (default 30)")
    p.add_argument("--rounds", type=int, default=1,
                   help="rounds of the setups, interleaved; medians (default 1)")  # fmt: skip
    p.add_argument("--logs", default="", help="keep the daemons' logs in this (new) folder")
    p.add_argument("--only", default="", help="comma-separated setups to run (default: all)")
    args = p.parse_args()
    if args.only:
        wanted = set(args.only.split(","))
        SETUPS[:] = [s for s in SETUPS if s.name in wanted or s.name == "a"]
    rounds: dict[str, list[dict[str, float]]] = {s.name: [] for s in SETUPS}
    with private_redis() as server, tempfile.TemporaryDirectory() as tmp_dir:
        tmp_dir = args.logs or tmp_dir
        for i in range(args.rounds):  # the setups interleaved: a load change hits all alike
            for setup in SETUPS:
                t = time.perf_counter()
                tmp = Path(tmp_dir) / f"round{i}"
                tmp.mkdir(parents=True, exist_ok=True)
                rounds[setup.name].append(measure(setup, server.url, tmp, args, i))
                print(f"round {i + 1} {setup.label}: {time.perf_counter() - t:.1f} s",
                      file=sys.stderr, flush=True)  # fmt: skip
    results = {name: median_of(runs) for name, runs in rounds.items()}
    print(report(results, args))


if __name__ == "__main__":
    main()
