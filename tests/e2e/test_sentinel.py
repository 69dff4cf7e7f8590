"""deviceq behind Redis Sentinel (a primary, a replica and three sentinels, all real processes):
a ``redis+sentinel://`` URL follows the primary, and the same clients and the real daemons go
on after the primary is SIGKILLed and the replica promoted."""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from deviceq import Client, ConfigError, DeviceReport, HostClient, TaskStatus, verify
from deviceq.core.connection import connect
from deviceq.core.redis_server import RedisServer
from deviceq.core.redis_urls import check_redis_url
from deviceq.ops.admin import PoolAdmin
from deviceq.scheduler import SchedulerClient, TaskScheduler
from harness import Deployment, deviceq, free_port, wait_for

SERVICE = "dq-primary"


class Sentinelled:
    """A primary, its replica and three sentinels (quorum 2) watching them."""

    def __init__(self) -> None:
        self.primary, self.replica = RedisServer(), RedisServer()
        self.ports = [free_port() for _ in range(3)]
        self.dir = Path(tempfile.mkdtemp(prefix="deviceq-sentinel-"))
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        return f"redis+sentinel://{hosts}/{SERVICE}"

    def start(self) -> Sentinelled:
        self.primary.start()
        self.replica.start()
        redis.Redis(port=self.replica.port).replicaof("127.0.0.1", self.primary.port)
        for port in self.ports:
            conf = self.dir / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} 1000\n"
                f"sentinel failover-timeout {SERVICE} 5000\n"
            )
            log = open(self.dir / f"sentinel-{port}.log", "wb")  # noqa: SIM115
            self.procs.append(subprocess.Popen(
                [str(self.primary.binary), str(conf), "--sentinel"], stdout=log, stderr=log
            ))  # fmt: skip
            log.close()
        wait_for(lambda: self.primary_port() == self.primary.port, 20, "sentinels up")
        wait_for(self._replica_synced, 20, "replica in sync")
        wait_for(self._sentinels_see_each_other, 20, "sentinels know each other")
        return self

    def sentinel(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, decode_responses=True, socket_timeout=2)

    def primary_port(self) -> int | None:
        """The primary every sentinel names (None while they disagree or do not answer)."""
        seen = set()
        for port in self.ports:
            try:
                with self.sentinel(port) as s:
                    addr = s.execute_command("SENTINEL", "get-master-addr-by-name", SERVICE)
            except redis.RedisError:
                return None
            seen.add(int(addr[1]) if addr else None)
        return seen.pop() if len(seen) == 1 else None

    def _sentinels_see_each_other(self) -> bool:
        for port in self.ports:
            with self.sentinel(port) as s:
                info = s.execute_command("SENTINEL", "master", SERVICE)
            if not isinstance(info, dict):
                info = dict(zip(info[::2], info[1::2], strict=True))
            fields = info
            if int(fields["num-other-sentinels"]) < len(self.ports) - 1:
                return False
        return True

    def _replica_synced(self) -> bool:
        with redis.Redis(port=self.replica.port, decode_responses=True) as r:
            return r.info("replication").get("master_link_status") == "up"

    def fail_over(self) -> None:
        """Make sure the replica has everything, SIGKILL the primary, wait for the sentinels
        to promote the replica."""
        with redis.Redis(port=self.primary.port) as r:
            assert r.wait(1, 5000) == 1
        self.primary.kill()
        wait_for(lambda: self.primary_port() == self.replica.port, 30, "replica promoted")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        self.primary.stop()
        self.replica.stop()


@pytest.fixture
def sentinelled() -> Iterator[Sentinelled]:
    s = Sentinelled()
    try:
        yield s.start()
    finally:
        s.stop()


def test_sentinel_urls_are_checked_before_anything_is_contacted() -> None:
    ok = "redis+sentinel://:pw@10.0.0.1:26379,10.0.0.2:26380/mymaster/2"
    assert check_redis_url(ok) == ok
    for bad, why in [
        ("redis+sentinel://10.0.0.1/mymaster", "HOST:PORT"),
        ("redis+sentinel://10.0.0.1:26379", "name the monitored service"),
        ("redis+sentinel://10.0.0.1:26379/m/x", "database must be a number"),
        ("redis+sentinel://:secret@10.0.0.1:99999/m", "HOST:PORT"),
    ]:
        with pytest.raises(ConfigError, match=why) as info:
            check_redis_url(bad)
        assert "secret" not in str(info.value)


def test_clients_follow_the_primary_across_a_failover(sentinelled: Sentinelled) -> None:
    """Claimed before the failover, reported after it, through the same objects."""
    pool = "sent"
    r = connect(sentinelled.url)
    admin = PoolAdmin(r, pool)
    h = HostClient(r, pool, "h1", admin.add_host("h1"))
    devices = [DeviceReport("d1", "android", ()), DeviceReport("d2", "android", ())]
    h.heartbeat(devices)
    client = Client(r, pool)
    first = client.submit_many([{"goal": f"t{i}", "driver_type": "android"} for i in range(3)])
    sched = TaskScheduler(admin, owner="s1")
    assert sched.assign(expire=True).assigned == 2
    claimed = h.claim(2)

    sentinelled.fail_over()

    for a in claimed:  # scripts on the promoted replica (NOSCRIPT there: sent whole)
        assert h.report(a.task.id, a.lease_id, "done") == "ok:done"
    more = client.submit_many([{"goal": "after", "driver_type": "android"}])
    deadline = time.monotonic() + 20
    while client.counts()["done"] < 4:
        assert time.monotonic() < deadline, client.counts()
        h.heartbeat(devices)
        sched.assign(expire=True)
        for a in h.claim(2):
            assert h.report(a.task.id, a.lease_id, "done") == "ok:done"
    assert [t.status for t in client.get_many([*first, *more])] == [TaskStatus.done] * 4
    assert verify(r, pool).ok
    r.close()


def test_real_daemons_go_on_after_a_failover(sentinelled: Sentinelled, tmp_path: Path) -> None:
    """The scheduler's and the host's blocking waits, leases and reports survive the primary's
    death without restarting either daemon."""
    d = Deployment("redis://unused", "sentd", tmp_path)
    d.r.close()
    d.url = sentinelled.url
    d.r = connect(sentinelled.url, socket_timeout=30)
    d.client, d.admin, d.store = (
        Client(d.r, d.pool),
        PoolAdmin(d.r, d.pool),
        SchedulerClient(d.r, d.pool),
    )
    try:
        d.configure(lease_ttl=10, claim_ttl=10, host_timeout=10)
        d.scheduler()
        d.command_host("h1", "e1:android", "e2:android")
        before = [d.client.submit(f"echo b{i}", driver_type="android") for i in range(6)]
        assert [t.status for t in d.wait_all(before, 60)] == [TaskStatus.done] * 6

        sentinelled.fail_over()

        after = [d.client.submit(f"echo a{i}", driver_type="android") for i in range(6)]
        done = d.wait_all(after, 60)
        assert [t.status for t in done] == [TaskStatus.done] * 6, [t.error for t in done]
        assert [t.attempt for t in done] == [1] * 6
        assert d.procs["scheduler"].poll() is None and d.procs["h1"].poll() is None
        assert verify(d.r, d.pool).ok
    finally:
        d.close()


def test_a_call_made_while_the_primary_is_down_waits_for_the_new_one(
    sentinelled: Sentinelled,
) -> None:
    """No failover wait in the caller's code: the submission right after the SIGKILL blocks
    until the sentinels name the promoted replica, then goes through there."""
    r = connect(sentinelled.url)
    client = Client(r, "sentwait")
    client.submit("before", driver_type="android")
    with redis.Redis(port=sentinelled.primary.port) as p:
        assert p.wait(1, 5000) == 1
    sentinelled.primary.kill()
    t0 = time.monotonic()
    tid = client.submit("during", driver_type="android")
    waited = time.monotonic() - t0
    # the sentinel the client asked named the replica; the others learn it from its hello
    # messages, a moment later
    deadline = time.monotonic() + 10
    while sentinelled.primary_port() != sentinelled.replica.port:
        assert time.monotonic() < deadline, "the sentinels do not agree on the new primary"
        time.sleep(0.1)
    assert client.get(tid).status is TaskStatus.queued and client.counts()["queued"] == 2
    assert waited > 0.5, waited  # it did wait for the failover
    r.close()


def test_no_sentinel_answering_fails_in_one_line_without_a_long_wait() -> None:
    """Found by trying it: with no sentinel reachable every command waited ~15 s per Redis
    call (redis-py's default backoff) and then for a failover that cannot come."""
    url = f"redis+sentinel://127.0.0.1:{free_port()}/nosuch"
    res = deviceq(url, "p", "status")  # bounded by the helper's 60 s timeout
    assert res.returncode == 1 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot reach Redis"), res.stderr
    assert "No master found for 'nosuch'" in lines[0]
