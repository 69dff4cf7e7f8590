"""``python -m bench --json`` carries the CPU of a whole job beside the fastest peer's: built
here from made-up drains (no queue runs), so the report's arithmetic is checked, not timed."""

from __future__ import annotations

import json

from bench.peers.report import Results, as_json, fastest_peer
from bench.support.deviceq_daemons import DeviceqRun
from bench.support.drain import Drain
from bench.support.redisstats import Usage


def drain(jobs_per_s: float, procs: dict[str, float], redis_cpu_s: float) -> Drain:
    """1,000 jobs drained at ``jobs_per_s``: ``procs`` CPU seconds per process, Redis's."""
    return Drain(
        jobs=1000,
        rate_jobs=1000,
        cost_jobs=1000,
        startup_s=0.5,
        drain_s=1000 / jobs_per_s,
        usage=Usage({"evalsha": 2000}, redis_cpu_s, 0.0),
        proc_cpu_s=procs,
        final_counter=1000,
    )


def test_json_carries_total_cpu_per_job_beside_the_fastest_peer() -> None:
    res = Results(jobs=1000, runs=3, rate=0.0, duration=0.0, quick=True, argv=[])
    for sched, host in ((0.1, 0.4), (0.2, 0.5), (0.3, 0.6)):  # medians: 200 + 500 + Redis 250
        res.deviceq.append(DeviceqRun(drain(1500, {"scheduler": sched, "host": host}, 0.25),
                                      None, {}, 1000))  # fmt: skip
    res.peers["rq"] = [drain(900, {"worker": 0.3}, 0.1)] * 3
    res.peers["dramatiq"] = [drain(r, {"worker": w}, 0.1) for r, w in
                             ((1800, 0.6), (2000, 0.7), (1700, 0.8))]  # fmt: skip
    assert fastest_peer(res) == "dramatiq"
    out = json.loads(json.dumps(as_json(res, {})))
    assert out["runs"] == 3
    assert out["total_cpu_us_per_job"] == 950.0  # (200 + 500 + 250 µs, the median run's)
    assert out["fastest_peer"] == "dramatiq"
    assert out["peer_total_cpu_us_per_job"] == 800.0  # its worker 700 + Redis 100
    assert out["systems"]["rq"]["total_cpu_us_per_job"] == 400.0
    assert out["daemon_cpu_us_per_task"] == {"scheduler": 200.0, "host": 500.0}


def test_json_without_peers_or_deviceq_says_none() -> None:
    res = Results(jobs=10, runs=1, rate=0.0, duration=0.0, quick=True, argv=[])
    out = as_json(res, {})
    assert out["total_cpu_us_per_job"] is None
    assert out["fastest_peer"] is None and out["peer_total_cpu_us_per_job"] is None


def test_fleet_json_carries_host_cpu_per_task_for_both_runners() -> None:
    from bench.fleet.daemons import ASYNC_RUNNER, Utilization
    from bench.fleet.report import Size, summary

    util = Utilization(100, 0.5, 10.0, 1000, 0.4, 0.1)
    util_async = Utilization(100, 0.5, 10.0, 1000, 0.3, 0.1, runner=ASYNC_RUNNER)
    out = json.loads(json.dumps(summary([Size(1000)], None, util, util_async)))
    assert out["host_cpu_us_per_task"] == util.host_cpu_us_per_task
    assert out["host_cpu_us_per_task_async"] == util_async.host_cpu_us_per_task
    assert out["host_cpu_us_per_task_async"] < out["host_cpu_us_per_task"]
