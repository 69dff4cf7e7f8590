"""``max_tasks_per_tenant_per_host`` through real daemons: `deviceq scheduler run` and one
`deviceq host run` with three devices, on a private Redis, the pool set to one lease per tenant
per host. Tenant a's three tasks of about a second run one after another on that host, while
tenant b's task and a task without a tenant run beside them; all finish, the counts end empty
and verify finds nothing."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from test_host_cap_daemons import runs, start_recording_host

from deviceq import TaskStatus
from deviceq.core.limits import BY_NAME
from deviceq.ops.verify import verify
from harness import Deployment


def test_one_lease_per_tenant_per_host_and_all_finish(deploy: Deployment, tmp_path: Path) -> None:
    deploy.configure(max_tasks_per_tenant_per_host=1)
    log = tmp_path / "runs.jsonl"
    start_recording_host(deploy, log)
    counter = deploy.admin.keys.counter(BY_NAME["tenant_host"].counter)

    most: dict[str, int] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for key, n in deploy.r.hgetall(counter).items():
                most[key] = max(most.get(key, 0), int(n))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        a = [deploy.client.submit("sleep 1.0", driver_type="android", tenant="a") for _ in range(3)]
        b = deploy.client.submit("sleep 1.0", driver_type="android", tenant="b")
        plain = deploy.client.submit("sleep 1.0", driver_type="android")
        for tid in [*a, b, plain]:
            t = deploy.client.wait(tid, timeout=60)
            assert t.status is TaskStatus.done, (tid, t.status, t.error)
    finally:
        stop.set()
        sampler.join(5)

    assert most == {"a|h1": 1, "b|h1": 1}
    rs = runs(log)
    starts = sorted((e["t"], e["task"]) for e in rs if e["ev"] == "start")
    ends = {e["task"]: e["t"] for e in rs if e["ev"] == "end"}
    a_starts = [(t, tid) for t, tid in starts if tid in a]
    assert sorted(tid for _, tid in a_starts) == sorted(a)
    for (_, prev), (at, _) in zip(a_starts, a_starts[1:], strict=False):
        assert ends[prev] <= at, "two of tenant a's runs overlapped on h1"
    # b and the task without a tenant were not held back: each started before a's last run
    first = {tid: t for t, tid in starts}
    assert first[b] < a_starts[-1][0] and first[plain] < a_starts[-1][0]
    assert not deploy.r.exists(counter)
    res = verify(deploy.r, deploy.pool)
    assert res.ok, [str(v) for v in res.violations]
