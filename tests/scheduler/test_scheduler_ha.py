"""Several ``deviceq scheduler run`` processes on one pool, on a private redis-server.

Hosts are simulated by threads that heartbeat, claim and report through ``HostClient`` (one
of them ignores its inbox at first, so assignments expire and are retried). The leader is
SIGKILLed mid-run (and, with three schedulers, the next leader SIGTERMed); a standby must take
over within one leader lease TTL. Afterwards the whole event stream is replayed: no device is
ever reserved by two leases at once, every (task, attempt) is assigned exactly once, every
task ends done."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from deviceq import Client, DeviceReport, HostClient, PoolAdmin
from deviceq.core.events import read_events
from deviceq.core.keys import Keys
from deviceq.core.redis_server import RedisServer

pytestmark = pytest.mark.slow

LEADER_TTL = 1.5
DRIVERS = ["android", "ios", "chrome"]
TAGSETS = [(), ("wifi",), ("camera",), ("wifi", "camera")]


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


class HostSim(threading.Thread):
    """A host: heartbeats its devices, waits on its inbox, claims and reports at once.
    A ``deaf_for`` host ignores its inbox for that long after its first assignment arrives
    (those assignments expire and are retried elsewhere)."""

    def __init__(
        self,
        url: str,
        pool: str,
        host_id: str,
        token: str,
        devices: list[DeviceReport],
        deaf_for: float = 0.0,
    ) -> None:
        super().__init__(daemon=True, name=host_id)
        self.client = HostClient(url, pool, host_id, token)
        self.devices = devices
        self.deaf_for = deaf_for
        self.deaf_since: float | None = None
        self.stop = threading.Event()
        self.done = 0
        self.released = 0
        self.error: BaseException | None = None
        self.rng = random.Random(host_id)

    def run(self) -> None:
        try:
            last_hb = 0.0
            while not self.stop.is_set():
                if time.monotonic() - last_hb > 0.5:
                    self.client.heartbeat(self.devices)
                    last_hb = time.monotonic()
                woken = self.client.wait_for_work(0.2)
                if self.deaf_for:
                    if woken and self.deaf_since is None:
                        self.deaf_since = time.monotonic()
                    since = self.deaf_since
                    if since is None or time.monotonic() - since < self.deaf_for:
                        continue
                for a in self.client.claim(16):
                    if a.attempt == 1 and self.rng.random() < 0.05:
                        self.client.release(a.task.id, a.lease_id, "handed back")
                        self.released += 1
                    else:
                        res = self.client.report(a.task.id, a.lease_id, "done", payload="ok")
                        assert res == "ok:done", res
                        self.done += 1
        except BaseException as exc:  # surfaced by the test
            self.error = exc


def start_scheduler(url: str, pool: str, owner: str, logdir: Path) -> subprocess.Popen[bytes]:
    log = open(logdir / f"{owner}.log", "wb")  # noqa: SIM115 (closed with the process)
    cmd = [
        sys.executable,
        "-c",
        "from deviceq.cli import main; main()",
        "--redis-url",
        url,
        "--pool",
        pool,
        "--log-format",
        "json",
        "--log-level",
        "debug",
        "scheduler",
        "run",
        "--owner",
        owner,
        "--tick",
        "0.5",
    ]
    return subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )


def leader_owner(r: redis.Redis, keys: Keys) -> str | None:
    raw = r.get(keys.leader)
    return None if raw is None else str(raw).rpartition(":")[0]


def wait_for(pred, timeout: float, step: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return None


def replay(r: redis.Redis, keys: Keys) -> dict[str, object]:
    """Walk the event stream checking invariant 1 and one assignment per (task, attempt)."""
    holder: dict[str, str] = {}  # device -> lease
    lease_dev: dict[str, str] = {}
    per_attempt: Counter[tuple[str, str]] = Counter()
    leaders: list[tuple[str, int]] = []
    types: Counter[str] = Counter()
    cursor = "0-0"
    while True:
        cursor, batch = read_events(r, keys, cursor, block_ms=None, count=5000)
        if not batch:
            break
        for e in batch:
            f = e.fields
            types[e.type] += 1
            if e.type == "assigned":
                dev, lease = f["device"], f["lease"]
                assert dev not in holder, f"device {dev} reserved twice: {holder[dev]} and {lease}"
                holder[dev] = lease
                lease_dev[lease] = dev
                per_attempt[(f["task"], f["attempt"])] += 1
            elif e.type in ("done", "failed", "cancelled", "released", "expired"):
                lease = f.get("lease", "")
                dev = lease_dev.pop(lease, None)
                if dev is not None:
                    assert holder.get(dev) == lease, (e, holder.get(dev))
                    del holder[dev]
            elif e.type == "leader_elected":
                leaders.append((f["owner"], int(f["epoch"])))
    return {"per_attempt": per_attempt, "leaders": leaders, "types": types, "holder": holder}


@pytest.mark.parametrize(("n_sched", "n_tasks"), [(2, 2000), (3, 3000)])
def test_schedulers_race_leader_dies_nothing_double_booked(
    server: RedisServer, tmp_path: Path, n_sched: int, n_tasks: int
) -> None:
    url, pool = server.url, f"ha{n_sched}"
    r = redis.Redis.from_url(url, decode_responses=True)
    keys = Keys(pool)
    admin = PoolAdmin(url, pool)
    client = Client(url, pool)
    for k, v in {
        "leader_ttl": LEADER_TTL,
        "claim_ttl": 1.0,
        "max_attempts": 20,
        "host_timeout": 10,
    }.items():
        admin.set_config(k, v)

    # 6 hosts x 6 devices = 36 devices over 3 driver types; every tag set is servable
    hosts: list[HostSim] = []
    for h in range(6):
        devs = [
            DeviceReport(f"h{h}-d{i}", DRIVERS[(h + i) % 3], ("wifi", "camera")) for i in range(6)
        ]
        token = admin.add_host(f"h{h}")
        hosts.append(HostSim(url, pool, f"h{h}", token, devs, deaf_for=2.0 if h == 5 else 0.0))
    rng = random.Random(7)
    specs = [
        {
            "goal": f"t{i}",
            "driver_type": rng.choice([None, *DRIVERS]),
            "tags": list(rng.choice(TAGSETS)),
        }
        for i in range(n_tasks)
    ]
    ids = client.submit_many(specs)

    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for h in hosts:
            h.start()
        for i in range(n_sched):
            procs[f"s{i}"] = start_scheduler(url, pool, f"s{i}", tmp_path)

        def finished() -> int:
            return int(r.zcard(keys.status("done")))

        # let them race for a third of the work, then SIGKILL the leader
        assert wait_for(lambda: finished() >= n_tasks // 3, 60), "no progress"
        first = leader_owner(r, keys)
        assert first in procs
        procs[first].send_signal(signal.SIGKILL)
        t_kill = time.monotonic()
        procs[first].wait(10)
        second = wait_for(
            lambda: (o := leader_owner(r, keys)) not in (None, first) and o, LEADER_TTL + 3.0
        )
        takeover = time.monotonic() - t_kill
        assert second in procs, f"no standby took over after {takeover:.1f}s"
        # within one lease TTL of the lease lapsing (plus the standby's poll and CI slack)
        assert takeover <= LEADER_TTL + 1.5, takeover
        print(f"leader {first} killed; {second} took over after {takeover:.2f}s")

        if n_sched == 3:
            assert wait_for(lambda: finished() >= 2 * n_tasks // 3, 60)
            leader = leader_owner(r, keys)
            procs[leader].send_signal(signal.SIGTERM)
            assert procs[leader].wait(10) == 0  # clean stop between passes
            third = wait_for(
                lambda: (o := leader_owner(r, keys)) not in (None, leader) and o, LEADER_TTL + 3.0
            )
            assert third in procs and third not in (first, leader)

        assert wait_for(lambda: finished() >= n_tasks, 90, step=0.1), (
            f"only {finished()} of {n_tasks} done: {client.counts()}"
        )
    finally:
        for h in hosts:
            h.stop.set()
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for h in hosts:
            h.join(5)

    for h in hosts:
        assert h.error is None, repr(h.error)
    survivors = [o for o, p in procs.items() if o != first and p.returncode is not None]
    assert all(procs[o].returncode == 0 for o in survivors), {
        o: p.returncode for o, p in procs.items()
    }

    facts = replay(r, keys)
    per_attempt: Counter[tuple[str, str]] = facts["per_attempt"]  # type: ignore[assignment]
    assert max(per_attempt.values()) == 1  # every (task, attempt) assigned exactly once
    tasks = client.get_many(ids)
    assert all(t.status.value == "done" for t in tasks)
    for t in tasks:  # and every attempt of every task was assigned once
        assert all(per_attempt[(t.id, str(a))] == 1 for a in range(1, t.attempt + 1))
    assert len(per_attempt) == sum(t.attempt for t in tasks)
    types: Counter[str] = facts["types"]  # type: ignore[assignment]
    assert types["done"] == n_tasks
    assert types["expired"] > 0 and types["released"] > 0  # retries did happen
    leaders: list[tuple[str, int]] = facts["leaders"]  # type: ignore[assignment]
    epochs = [e for _, e in leaders]
    assert epochs == sorted(epochs) and len(set(epochs)) == len(epochs)
    assert len({o for o, _ in leaders}) >= (3 if n_sched == 3 else 2)
    assert not facts["holder"]  # nothing left reserved
    # every scheduler logged one structured line per pass (at DEBUG)
    logs = (tmp_path / f"{second}.log").read_text()
    assert '"msg": "pass"' in logs and '"assigned"' in logs
    r.close()
