"""``max_tasks_per_host`` through real daemons: `deviceq scheduler run` and one `deviceq host
run` with three devices, on a private Redis, the pool set to one task per host. Three tasks of
about a second each run one after another on that host (never two at once: not in the runs'
own log, not in the leases held, not in the event stream) and all finish; verify finds
nothing."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from deviceq import TaskStatus
from deviceq.host.runners import Task
from deviceq.ops.verify import verify
from harness import Deployment, wait_for


def record(task: Task) -> str:
    """``sleep SECONDS``: each start and end is a line of $HOST_CAP_LOG."""
    secs = float(task.goal.split()[1])
    log = Path(os.environ["HOST_CAP_LOG"])

    def note(ev: str) -> None:
        line = {"ev": ev, "task": task.task_id, "device": task.device_id, "t": time.time()}
        with log.open("a") as f:
            f.write(json.dumps(line) + "\n")

    note("start")
    task.cancel.wait(secs)
    note("end")
    return "ok"


def runs(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def start_recording_host(deploy: Deployment, log: Path) -> None:
    """The scheduler and host h1 with three android devices whose runs `record` to ``log``."""
    deploy.scheduler()
    deploy.host(
        "h1", "d1:android", "d2:android", "d3:android", env={"HOST_CAP_LOG": str(log)},
        extra=("--goal-runner", "test_host_cap_daemons:record", "--isolation", "thread"),
    )  # fmt: skip
    wait_for(lambda: deploy.alive("h1"), 20, "host h1 up")
    wait_for(lambda: len(deploy.admin.devices()) == 3, 10, "three devices registered")


def test_one_task_per_host_at_a_time_and_all_finish(deploy: Deployment, tmp_path: Path) -> None:
    deploy.configure(max_tasks_per_host=1)
    log = tmp_path / "runs.jsonl"
    start_recording_host(deploy, log)

    # sampled all along: leases on h1 (the tasks' own state, and the host_held count)
    most = {"active": 0, "held": 0}
    stop = threading.Event()

    def sample() -> None:
        k = deploy.admin.keys
        while not stop.is_set():
            active = sum(
                1
                for d in deploy.admin.devices()
                if d.reserved_by is not None  # a lease (assigned or running) holds it
            )
            n = int(deploy.r.hget(k.host_held, "h1") or 0)
            most["active"] = max(most["active"], active)
            most["held"] = max(most["held"], n)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        ids = [deploy.client.submit("sleep 1.0", driver_type="android") for _ in range(3)]
        for tid in ids:
            t = deploy.client.wait(tid, timeout=60)
            assert t.status is TaskStatus.done, (tid, t.status, t.error)
    finally:
        stop.set()
        sampler.join(5)

    assert most == {"active": 1, "held": 1}
    # the runs' own log: three runs, none overlapping another
    rs = runs(log)
    starts = sorted((e["t"], e["task"]) for e in rs if e["ev"] == "start")
    ends = {e["task"]: e["t"] for e in rs if e["ev"] == "end"}
    assert [t for _, t in starts] and sorted(t for _, t in starts) == sorted(ids)
    for (_, prev), (at, _) in zip(starts, starts[1:], strict=False):
        assert ends[prev] <= at, "two runs overlapped on h1"
    # the event stream: the leases of h1, counted up at each assignment and down at each end
    held, peak = 0, 0
    for e in deploy.client.events():
        if e.task not in ids:
            continue
        if e.type == "assigned":
            held += 1
        elif e.type in ("done", "failed", "cancelled", "expired", "released"):
            held -= 1
        peak = max(peak, held)
    assert (peak, held) == (1, 0)
    assert not deploy.r.hget(deploy.admin.keys.host_held, "h1")
    res = verify(deploy.r, deploy.pool)
    assert res.ok, [str(v) for v in res.violations]
