"""Full task lifecycles per second (submit -> assign -> claim -> report) on one private
redis-server, driven the way a deployment uses the batch APIs, in separate processes:

- producer: an open-loop submitter at a fixed offered rate (or as fast as it can, with a
  backlog cap, for the saturation run), batching what is due into ``Client.submit_many``;
- assigner: the scheduler daemon ``deviceq.scheduler.TaskScheduler(...).run()`` (woken by the
  ``sched:wake`` signal list, expiry on its 2 s tick) when that module exists, else a minimal
  FIFO matcher in this file (snapshot of idle devices and bucket heads, greedy match,
  ``PoolAdmin.commit`` in one batch);
- hosts: W worker processes serving N hosts of M devices; each blocks on its hosts' wake lists,
  ``HostClient.claim(M)`` then ``HostClient.report_many(done)`` at once (a zero-work runner:
  this measures the queue, not the work).

Latency submit -> dispatched is ``dispatched_at - submitted_at`` of each claimed task (both
Redis server times, ms). The reference, in the same run, is a bare Redis list queue with the
same processes and batch round trips: producer LPUSH (variadic), consumers BRPOP + RPOP COUNT,
then INCRBY (the "report").

Usage: ``python bench/lifecycle/throughput.py [--quick] [--rates 1000,2500,5000] [--duration S]``"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (run by path: the repository root)

from bench.support.common import (
    GOAL,
    Timer,
    add_hosts,
    machine,
    percentile,
    private_redis,
    raw_client,
    table,
)
from deviceq.core.keys import Keys
from deviceq.host.link import DeviceReport, Report
from deviceq.host.redis_link import HostClient
from deviceq.ops.admin import PoolAdmin
from deviceq.producer import Client
from deviceq.scheduler.client import SchedulerClient

POOL = "bench"
BACKLOG = 3000  # saturation run: the producer pauses while this many tasks are queued
CTX = mp.get_context("fork")


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system


# --- deviceq processes -------------------------------------------------------------------------
def producer(url: str, rate: float | None, duration: float, out: Any) -> None:
    """Open loop: at time t, rate*t tasks are due; whatever is due is one submit_many call."""
    r = raw_client(url)
    client = Client(r, POOL)
    keys = Keys(POOL)
    spec = {"goal": GOAL, "driver_type": "android"}
    submitted, max_lag, calls = 0, 0.0, 0
    t0 = time.perf_counter()
    while (el := time.perf_counter() - t0) < duration:
        if rate is None:
            if r.zcard(keys.status("queued")) > BACKLOG:
                time.sleep(0.001)
                continue
            n = 200
        else:
            n = min(int(rate * el) + 1 - submitted, 500)
            if n <= 0:
                time.sleep(min(0.002, (submitted - rate * el) / rate))
                continue
            max_lag = max(max_lag, el - submitted / rate)
        client.submit_many([spec] * n)
        submitted += n
        calls += 1
    out.put(
        (
            "producer",
            {
                "submitted": submitted,
                "max_lag_ms": max_lag * 1000,
                "calls": calls,
                "cpu_s": cpu_s(),
            },
        )
    )


def assigner_minimal(url: str, stop: Any, out: Any) -> None:
    """Minimal FIFO matcher: idle devices x bucket heads, oldest task first, one commit."""
    r = raw_client(url)
    admin = SchedulerClient(r, POOL)
    keys = admin.keys
    dev_info: dict[str, tuple[str, frozenset[str]]] = {}
    sig_info: dict[str, tuple[str, frozenset[str]]] = {}
    ok = rejected = commits = 0
    busy_s = 0.0
    while not stop.is_set():
        r.blpop([keys.sched_wake], timeout=0.05)
        t0 = time.perf_counter()
        while True:
            p = r.pipeline(transaction=False)
            p.zrange(keys.idle, 0, 999)
            p.zrange(keys.queues, 0, 19)
            idle, sigs = p.execute()
            if not idle or not sigs:
                break
            p = r.pipeline(transaction=False)
            new_devs = [d for d in idle if d not in dev_info]
            new_sigs = [s for s in sigs if s not in sig_info]
            for d in new_devs:
                p.hmget(keys.device(d), "driver_type", "tags")
            for s in new_sigs:
                p.hmget(keys.sig(s), "driver_type", "tags")
            for s in sigs:
                p.zrange(keys.queue(s), 0, len(idle) - 1, withscores=True)
            res = p.execute()
            for d, (drv, tags) in zip(new_devs, res, strict=False):
                dev_info[d] = (drv or "", frozenset(t for t in (tags or "").split(",") if t))
            res = res[len(new_devs) :]
            for s, (drv, tags) in zip(new_sigs, res, strict=False):
                sig_info[s] = (drv or "", frozenset(t for t in (tags or "").split(",") if t))
            heads = res[len(new_sigs) :]
            tasks = sorted(
                (seq, tid, s) for s, h in zip(sigs, heads, strict=True) for tid, seq in h
            )
            free = list(idle)
            pairs = []
            for _, tid, s in tasks:
                drv, tags = sig_info[s]
                for i, d in enumerate(free):
                    ddrv, dtags = dev_info[d]
                    if (not drv or drv == ddrv) and tags <= dtags:
                        pairs.append((tid, d))
                        del free[i]
                        break
                if not free:
                    break
            if not pairs:
                break
            res = admin.commit(pairs)
            commits += 1
            n_ok = sum(1 for x in res if x.startswith("ok:"))
            ok += n_ok
            rejected += len(res) - n_ok
            if n_ok == 0:
                break
        busy_s += time.perf_counter() - t0
    out.put(
        (
            "assigner",
            {
                "assigned": ok,
                "rejected": rejected,
                "commits": commits,
                "busy_s": busy_s,
                "cpu_s": cpu_s(),
                "kind": "minimal matcher (bench)",
            },
        )
    )


def assigner_scheduler(url: str, stop: Any, out: Any) -> None:
    """The project's scheduler daemon, ``TaskScheduler.run()`` (leader lease, wake-ups on
    ``sched:wake``, expiry on its tick), as deployed; every pass is counted."""
    import threading

    from deviceq.scheduler import TaskScheduler  # type: ignore[import-not-found]

    r = raw_client(url)
    sched = TaskScheduler(r, POOL)
    stats = {"passes": 0, "assigned": 0, "rejected": 0, "busy_s": 0.0}
    real_pass = sched.assign

    def counted(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        res = real_pass(*a, **kw)
        if res.assigned or res.rejected_total:  # passes that did something
            stats["passes"] += 1
            stats["busy_s"] += time.perf_counter() - t0
        stats["assigned"] += res.assigned
        stats["rejected"] += res.rejected_total
        return res

    sched.assign = counted  # type: ignore[method-assign]

    def watch() -> None:
        stop.wait()
        sched.stop(wake=True)

    threading.Thread(target=watch, daemon=True).start()
    sched.run(tick=2.0)
    out.put(
        (
            "assigner",
            {
                "assigned": stats["assigned"],
                "rejected": stats["rejected"],
                "commits": stats["passes"],
                "busy_s": stats["busy_s"],
                "cpu_s": cpu_s(),
                "kind": "scheduler daemon",
            },
        )
    )


def host_worker(
    url: str, hosts: list[tuple[str, str, list[DeviceReport]]], per_host: int, stop: Any, out: Any
) -> None:
    """Serve several hosts: block on their wake lists, claim a batch, report it done."""
    r = raw_client(url)
    clients = {h: HostClient(r, POOL, h, tok) for h, tok, _ in hosts}
    devs = {h: d for h, _, d in hosts}
    wake = {Keys(POOL).host_wake(h): h for h in clients}
    lat: list[int] = []
    lat_assign: list[int] = []  # submitted -> assigned (the scheduler's share)
    claims = reports = 0
    last_hb = time.monotonic()
    idle_rounds = 0
    while True:
        res = r.blpop(list(wake), timeout=0.05)
        if res is None:
            # after stop, leave once every inbox stayed empty for a while
            idle_rounds = idle_rounds + 1 if stop.is_set() else 0
            if idle_rounds >= 3:
                break
            if time.monotonic() - last_hb > 10:
                for h, c in clients.items():
                    c.heartbeat(devs[h])
                last_hb = time.monotonic()
            continue
        hc = clients[wake[res[0]]]
        while True:
            got = hc.claim(per_host)
            claims += 1
            if not got:
                break
            lat += [a.task.dispatched_at - a.task.submitted_at for a in got]  # type: ignore[operator]
            lat_assign += [a.task.assigned_at - a.task.submitted_at for a in got]  # type: ignore[operator]
            hc.report_many([Report(a.task.id, a.lease_id, "done", None, "ok") for a in got])
            reports += 1
            if len(got) < per_host:
                break  # the inbox was empty: a new assignment pushes the wake list
    out.put(
        (
            "host",
            {
                "lat": lat,
                "lat_assign": lat_assign,
                "claims": claims,
                "reports": reports,
                "cpu_s": cpu_s(),
            },
        )
    )


def redis_cpu(r: Any) -> float:
    c = r.info("cpu")
    return float(c["used_cpu_user"]) + float(c["used_cpu_sys"])


def check_alive(procs: list[Any]) -> None:
    for p in procs:
        if p.exitcode not in (None, 0):
            raise RuntimeError(f"bench process {p.name} died with exit code {p.exitcode}")


def stop_and_collect(procs: list[Any], stop: Any, out: Any) -> list[Any]:
    """Tell the processes to stop, take each one's result, and join them."""
    stop.set()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    return results


def kill_stragglers(procs: list[Any]) -> None:
    for p in procs:
        if p.is_alive():
            p.kill()


def run_deviceq(
    rate: float | None,
    duration: float,
    n_hosts: int,
    per_host: int,
    workers: int,
    use_scheduler: bool,
) -> dict[str, Any]:
    with private_redis() as server:
        r = raw_client(server.url)
        admin = PoolAdmin(r, POOL)
        admin.set_config("max_queue_depth", 10_000_000)
        fleet = add_hosts(admin, server.url, n_hosts, per_host)
        assigner = assigner_scheduler if use_scheduler else assigner_minimal
        stop, out = CTX.Event(), CTX.Queue()
        procs = [
            CTX.Process(target=producer, args=(server.url, rate, duration, out)),
            CTX.Process(target=assigner, args=(server.url, stop, out)),
        ]
        procs += [
            CTX.Process(
                target=host_worker, args=(server.url, fleet[w::workers], per_host, stop, out)
            )
            for w in range(workers)
        ]
        keys = admin.keys
        cpu0 = redis_cpu(r)
        samples: list[list[int]] = []  # idle devices, queued, assigned, dispatched

        def sample() -> list[int]:
            p = r.pipeline(transaction=False)
            p.zcard(keys.idle)
            for st in ("queued", "assigned", "dispatched"):
                p.zcard(keys.status(st))
            row = [int(x) for x in p.execute()]
            samples.append(row)
            return row

        try:
            t0 = time.perf_counter()
            for p in procs:
                p.start()
            while procs[0].is_alive():  # the producer ends after `duration`
                check_alive(procs)
                procs[0].join(0.1)
                sample()
            while True:
                check_alive(procs)
                el = time.perf_counter() - t0
                if sum(sample()[1:]) == 0 or el > duration + 60:
                    break
                time.sleep(0.05)
            t_end = time.perf_counter() - t0
            results = stop_and_collect(procs, stop, out)
        finally:
            kill_stragglers(procs)
        redis_cpu_s = redis_cpu(r) - cpu0
        done = int(r.zcard(keys.status("done")))
        load = os.getloadavg()[0]
        r.close()
    prod = next(v for k, v in results if k == "producer")
    asg = next(v for k, v in results if k == "assigner")
    hosts = [v for k, v in results if k == "host"]
    lat = [x for h in hosts for x in h["lat"]]
    lat_a = [x for h in hosts for x in h["lat_assign"]]
    avg = [sum(c) / max(1, len(samples)) for c in zip(*samples, strict=True)] or [0.0] * 4
    return {
        "avg_idle": avg[0],
        "avg_queued": avg[1],
        "avg_active": avg[2] + avg[3],
        "p50_assign": percentile(lat_a, 50),
        "p99_assign": percentile(lat_a, 99),
        "rate": rate,
        "submitted": prod["submitted"],
        "done": done,
        "wall_s": t_end,
        "per_s": done / t_end,
        "p50": percentile(lat, 50),
        "p95": percentile(lat, 95),
        "p99": percentile(lat, 99),
        "max": max(lat) if lat else float("nan"),
        "lag_ms": prod["max_lag_ms"],
        "redis_cpu_us": redis_cpu_s / max(done, 1) * 1e6,
        "client_cpu_us": (prod["cpu_s"] + asg["cpu_s"] + sum(h["cpu_s"] for h in hosts))
        / max(done, 1)
        * 1e6,
        "assigner": asg.get("kind", "?"),
        "submit_calls": prod["calls"],
        "load": load,
        "commits": asg["commits"],
        "rejected": asg["rejected"],
        "pass": f"{asg['commits']:,} / {asg['assigned'] / max(1, asg['commits']):.0f} / "
        f"{asg['busy_s'] * 1000 / max(1, asg['commits']):.1f}",
        "claims": sum(h["claims"] for h in hosts),
        "reports": sum(h["reports"] for h in hosts),
        "cpu_pct": f"redis {redis_cpu_s / t_end:.0%}, producer {prod['cpu_s'] / t_end:.0%}, "
        f"scheduler {asg['cpu_s'] / t_end:.0%}, workers "
        + " ".join(f"{h['cpu_s'] / t_end:.0%}" for h in hosts),
    }


# --- bare list queue reference -----------------------------------------------------------------
def list_producer(url: str, rate: float | None, duration: float, out: Any) -> None:
    r = raw_client(url)
    submitted, calls, max_lag = 0, 0, 0.0
    t0 = time.perf_counter()
    while (el := time.perf_counter() - t0) < duration:
        if rate is None:
            if r.llen("q") > BACKLOG:
                time.sleep(0.001)
                continue
            n = 200
        else:
            n = min(int(rate * el) + 1 - submitted, 500)
            if n <= 0:
                time.sleep(min(0.002, (submitted - rate * el) / rate))
                continue
            max_lag = max(max_lag, el - submitted / rate)
        now = f"{time.time():.6f}"
        r.lpush("q", *([now] * n))
        submitted += n
        calls += 1
    out.put(
        (
            "producer",
            {
                "submitted": submitted,
                "max_lag_ms": max_lag * 1000,
                "calls": calls,
                "cpu_s": cpu_s(),
            },
        )
    )


def list_consumer(url: str, batch: int, stop: Any, out: Any) -> None:
    r = raw_client(url)
    lat: list[float] = []
    idle_rounds = 0
    while True:
        res = r.brpop(["q"], timeout=0.05)
        if res is None:
            idle_rounds = idle_rounds + 1 if stop.is_set() else 0
            if idle_rounds >= 3:
                break
            continue
        items = [res[1]] + (r.rpop("q", batch - 1) or [])
        now = time.time()
        lat += [(now - float(x)) * 1000 for x in items]
        r.incrby("done", len(items))
    out.put(("host", {"lat": lat, "cpu_s": cpu_s()}))


def run_listq(rate: float | None, duration: float, workers: int, batch: int) -> dict[str, Any]:
    with private_redis() as server:
        r = raw_client(server.url)
        stop, out = CTX.Event(), CTX.Queue()
        procs = [CTX.Process(target=list_producer, args=(server.url, rate, duration, out))]
        procs += [
            CTX.Process(target=list_consumer, args=(server.url, batch, stop, out))
            for _ in range(workers)
        ]
        cpu0 = redis_cpu(r)
        try:
            t0 = time.perf_counter()
            for p in procs:
                p.start()
            procs[0].join()
            while r.llen("q") and time.perf_counter() - t0 < duration + 60:
                time.sleep(0.02)
            t_end = time.perf_counter() - t0
            results = stop_and_collect(procs, stop, out)
        finally:
            kill_stragglers(procs)
        redis_cpu_s = redis_cpu(r) - cpu0
        done = int(r.get("done") or 0)
        load = os.getloadavg()[0]
        r.close()
    prod = next(v for k, v in results if k == "producer")
    cons = [v for k, v in results if k == "host"]
    lat = [x for c in cons for x in c["lat"]]
    return {
        "rate": rate,
        "submitted": prod["submitted"],
        "done": done,
        "wall_s": t_end,
        "per_s": done / t_end,
        "p50": percentile(lat, 50),
        "p95": percentile(lat, 95),
        "p99": percentile(lat, 99),
        "max": max(lat) if lat else float("nan"),
        "p50_assign": float("nan"),
        "p99_assign": float("nan"),
        "avg_idle": float("nan"),
        "avg_queued": float("nan"),
        "avg_active": float("nan"),
        "lag_ms": prod["max_lag_ms"],
        "redis_cpu_us": redis_cpu_s / max(done, 1) * 1e6,
        "client_cpu_us": (prod["cpu_s"] + sum(c["cpu_s"] for c in cons)) / max(done, 1) * 1e6,
        "assigner": "-",
        "submit_calls": prod["calls"],
        "load": load,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one rate, short runs (< 30 s)")
    ap.add_argument("--rates", default=None, help="offered submit rates, tasks/s (comma list)")
    ap.add_argument("--duration", type=float, default=None, help="seconds of submission per run")
    ap.add_argument("--hosts", type=int, default=8, help="hosts (N)")
    ap.add_argument("--devices", type=int, default=25, help="devices per host (M)")
    ap.add_argument("--workers", type=int, default=2, help="host worker processes")
    ap.add_argument("--no-saturation", action="store_true", help="skip the max-throughput run")
    ap.add_argument(
        "--assigner",
        choices=["auto", "scheduler", "minimal"],
        default="auto",
        help="TaskScheduler (auto: if deviceq.scheduler exists) or the bench matcher",
    )
    args = ap.parse_args()
    if args.assigner == "auto":
        try:
            import deviceq.scheduler  # noqa: F401

            args.assigner = "scheduler"
        except ImportError:
            args.assigner = "minimal"
    rates = [
        float(x) for x in (args.rates or ("2000" if args.quick else "1000,2500,5000")).split(",")
    ]
    duration = args.duration or (3.0 if args.quick else 10.0)
    print(f"machine: {machine()}")
    print(
        f"fleet: {args.hosts} hosts x {args.devices} devices, {args.workers} host worker "
        f"processes, 1 producer, 1 assigner; {duration:g} s of submission per run"
    )
    rows = []
    with Timer() as t:
        runs: list[tuple[str, float | None]] = [("deviceq", x) for x in rates]
        if not args.no_saturation:
            runs.append(("deviceq", None))
        runs += [("list queue", rates[-1])]
        if not args.no_saturation:
            runs.append(("list queue", None))
        results = []
        for kind, rate in runs:
            if kind == "deviceq":
                res = run_deviceq(
                    rate,
                    duration,
                    args.hosts,
                    args.devices,
                    args.workers,
                    args.assigner == "scheduler",
                )
            else:
                res = run_listq(rate, duration, args.workers, args.devices)
            results.append((kind, res))
            print(
                f"  {kind} rate={rate or 'max'}: {res['per_s']:,.0f}/s, p99 {res['p99']:.1f} ms"
                f" (load {res['load']:.2f})"
                + (f"; CPU of one core: {res['cpu_pct']}" if "cpu_pct" in res else ""),
                flush=True,
            )
    ref = {
        rate: res
        for kind, res in ((k, r) for k, r in results if k == "list queue")
        for rate in [res["rate"]]
    }
    for kind, res in results:
        base = ref.get(res["rate"])
        rows.append(
            [
                kind + ("" if kind != "deviceq" else f" ({res['assigner']})"),
                "max" if res["rate"] is None else int(res["rate"]),
                res["submitted"],
                res["done"],
                res["wall_s"],
                res["per_s"],
                res["p50"],
                res["p95"],
                res["p99"],
                res["max"],
                "-"
                if res["p50_assign"] != res["p50_assign"]
                else f"{res['p50_assign']:.0f} / {res['p99_assign']:.0f}",
                "-"
                if res["avg_idle"] != res["avg_idle"]
                else f"{res['avg_idle']:.0f} / {res['avg_queued']:.0f} / {res['avg_active']:.0f}",
                res.get("pass", "-"),
                res["lag_ms"],
                res["redis_cpu_us"],
                res["client_cpu_us"],
                min(1e6 / res["redis_cpu_us"], 2e6 / (res["redis_cpu_us"] + res["client_cpu_us"])),
                res["per_s"] / base["per_s"] if base else float("nan"),
                res["load"],
            ]
        )
    print(
        table(
            [
                "system",
                "offered/s",
                "submitted",
                "done",
                "wall s",
                "lifecycles/s",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "max ms",
                "submit->assigned p50/p99 ms",
                "avg idle dev / queued / active",
                "assign passes / pairs per pass / ms per pass",
                "producer lag ms",
                "redis CPU µs/task",
                "client CPU µs/task",
                "CPU ceiling/s",
                "x list queue /s",
                "load 1m",
            ],
            rows,
        )
    )
    print(
        "latency: submit->dispatched (deviceq, Redis server ms) or LPUSH->RPOP (list queue, "
        "client clock); x list queue compares with the list run at the same offered rate "
        "(max with max); CPU ceiling = min(1e6/redis CPU, 2e6/(redis+client CPU)): the rate "
        "2 dedicated cores would allow at the measured CPU cost per lifecycle"
        f"\nmachine after: {machine()}; bench took {t.s:.1f} s"
    )


if __name__ == "__main__":
    main()
