"""Durable mode (``durability = aof | replica``), against a real primary and replica started by
the fixtures: a confirmed write returns, an unconfirmed one raises NotConfirmed (and was
applied), a host keeps a report Redis did not confirm and sends it again; every process warns
about an evicting maxmemory-policy; ``status`` shows the persistence in force."""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from deviceq import Client, DeviceReport, HostClient, PoolAdmin, SchedulerClient, TaskStatus
from deviceq.cli import main
from deviceq.core.errors import NotConfirmed
from deviceq.core.redis_server import RedisServer
from harness import Deployment, RunLog, wait_for


def link_up(replica: RedisServer) -> bool:
    info = redis.Redis(port=replica.port).info("replication")
    return info.get("master_link_status") == "up"


class Pair:
    """A primary (AOF on) and one replica of it, on loopback."""

    def __init__(self) -> None:
        self.primary = RedisServer(appendonly=True).start()
        self.replica = RedisServer().start()
        self.follow()

    def follow(self) -> None:
        redis.Redis(port=self.replica.port).replicaof("127.0.0.1", self.primary.port)
        wait_for(lambda: link_up(self.replica), 20, "replica link up")
        # the replica's side says "up" a moment before the primary counts it for WAIT
        wait_for(lambda: self.acknowledged() >= 1, 20, "the primary counts the replica")

    def acknowledged(self) -> int:
        return int(redis.Redis(port=self.primary.port).execute_command("WAIT", 1, 200))

    def stop(self) -> None:
        self.replica.stop()
        self.primary.stop()


@pytest.fixture
def pair() -> Iterator[Pair]:
    p = Pair()
    try:
        yield p
    finally:
        p.stop()


def clients(url: str, pool: str) -> tuple[Client, PoolAdmin, SchedulerClient, redis.Redis]:
    r = redis.Redis.from_url(url, decode_responses=True, socket_timeout=10)
    return Client(r, pool), PoolAdmin(r, pool), SchedulerClient(r, pool), r


def test_durable_submissions_and_reports_confirm_or_say_so(pair: Pair) -> None:
    pool = "d" + uuid.uuid4().hex[:10]
    client, admin, store, r = clients(pair.primary.url, pool)
    token = admin.add_host("h1")
    host = HostClient(r, pool, "h1", token)
    host.heartbeat([DeviceReport("d1", "android")])
    admin.set_config("durability", "replica")
    admin.set_config("durability_timeout", 0.5)
    tid = client.submit("confirmed")  # the replica acknowledges
    assert client.get(tid).status is TaskStatus.queued

    pair.replica.kill()  # no replica: nothing can be confirmed
    time.sleep(1.2)  # the pool's setting and the link state are re-read
    with pytest.raises(NotConfirmed) as info:
        client.submit("applied but not confirmed", idempotency_key="k1")
    (lost_id,) = info.value.result
    assert client.get(lost_id).status is TaskStatus.queued, "applied on the primary"
    # a retried submission with the same idempotency key gives the same task, not a copy
    with pytest.raises(NotConfirmed) as again:
        client.submit("applied but not confirmed", idempotency_key="k1")
    assert again.value.result == [lost_id]

    assert store.commit([(tid, "d1")])[0].startswith("ok:")
    (a,) = host.claim(1)
    with pytest.raises(NotConfirmed) as rep:
        host.report(tid, a.lease_id, "done", None, "r")
    assert rep.value.result == ["ok:done"]
    pair.replica.start()
    pair.follow()
    time.sleep(1.2)
    # sent again once a replica is back: confirmed, and the same answer (applied once)
    assert host.report(tid, a.lease_id, "done", None, "r") == "dup:done"
    assert len([e for e in client.events(task=tid) if e.type == "done"]) == 1
    admin.set_config("durability", "none")
    time.sleep(1.1)
    pair.replica.kill()
    client.submit("not durable: returns at once")  # no wait at all with durability none


def submit_confirmed(client: Client, goal: str) -> str:
    """Submit as a producer would under durability: the same idempotency key again until a
    replica confirms it (on a loaded machine one WAIT of 0.3 s right after a resync can miss)."""
    key = uuid.uuid4().hex
    for _ in range(20):
        try:
            return client.submit(goal, idempotency_key=key)
        except NotConfirmed:
            time.sleep(0.2)
    raise AssertionError(f"submit of {goal!r} never confirmed")


def test_a_host_keeps_an_unconfirmed_report_and_sends_it_again(pair: Pair, tmp_path: Path,
                                                               pool: str) -> None:  # fmt: skip
    """The run ends while the replica is down: the report is applied but not confirmed; the
    host keeps sending it until a replica confirms it. Then Redis is SIGKILLed between the end
    of a run and its report: the report waits for Redis and goes through after its restart."""
    deploy = Deployment(pair.primary.url, pool, tmp_path)
    try:
        runlog = RunLog(tmp_path / "runs")
        deploy.configure(durability="replica", durability_timeout=0.3, lease_ttl=30,
                         claim_ttl=30)  # fmt: skip
        deploy.scheduler()
        deploy.runner_host("h1", "d1:android", runlog=runlog)
        tid = submit_confirmed(deploy.client, "2")
        wait_for(lambda: runlog.starts(tid), 30, "task running")
        pair.replica.kill()
        wait_for(lambda: "not confirmed durable" in deploy.log("h1"), 30, "unconfirmed report")
        pair.replica.start()
        pair.follow()
        t = deploy.client.wait(tid, timeout=30)
        assert (t.status, t.attempt) == (TaskStatus.done, 1)
        assert len(runlog.starts(tid)) == 1

        # Redis killed between the run's end and its report: the report is kept and sent
        # after Redis is back (the task's state survived in the AOF: appendfsync everysec)
        tid2 = submit_confirmed(deploy.client, "3")
        wait_for(lambda: runlog.starts(tid2), 30, "second task running")
        time.sleep(1.5)  # its dispatch is in the AOF
        pair.primary.kill()
        wait_for(lambda: runlog.ends(tid2), 10, "the run ended while Redis was down")
        time.sleep(1.0)
        pair.primary.start()
        pair.follow()
        t2 = deploy.client.wait(tid2, timeout=60)
        assert (t2.status, t2.attempt) == (TaskStatus.done, 1)
        assert len(runlog.starts(tid2)) == 1
    finally:
        deploy.close()


def test_every_process_warns_about_an_evicting_maxmemory_policy(tmp_path: Path) -> None:
    with RedisServer() as server:
        r = redis.Redis(port=server.port)
        r.config_set("maxmemory-policy", "allkeys-lru")
        res = CliRunner().invoke(main, ["--redis-url", server.url, "--pool", "p1", "status"])
        assert res.exit_code == 0
        assert "maxmemory-policy is 'allkeys-lru'" in res.stderr
        deploy = Deployment(server.url, "p1", tmp_path)
        try:
            proc = deploy.spawn("sched", "scheduler", "run", "--once")
            assert proc.wait(30) == 0
            assert "allkeys-lru" in deploy.log("sched")
            h = deploy.host("h1", "d1:x", extra=("--command", "true"))
            wait_for(lambda: "allkeys-lru" in deploy.log("h1"), 20, "the host warned")
            h.send_signal(signal.SIGTERM)
            h.wait(20)
        finally:
            deploy.close()
        r.config_set("maxmemory-policy", "noeviction")
        res = CliRunner().invoke(main, ["--redis-url", server.url, "--pool", "p1", "status"])
        assert "maxmemory-policy is" not in res.stderr


def test_status_shows_the_persistence_in_force(pair: Pair) -> None:
    base = ["--redis-url", pair.primary.url, "--pool", "p" + uuid.uuid4().hex[:8]]
    CliRunner().invoke(main, [*base, "config", "set", "durability", "replica"])
    res = CliRunner().invoke(main, [*base, "status", "--json"])
    assert res.exit_code == 0, res.output
    data: dict[str, Any] = json.loads(res.stdout)
    assert data["durability"] == "replica"
    rd = data["redis"]
    assert (rd["aof_enabled"], rd["role"], rd["connected_replicas"]) == (True, "master", 1)
    assert rd["maxmemory_policy"] == "noeviction"
    text = " ".join(CliRunner().invoke(main, [*base, "status"]).stdout.split())
    assert "aof on" in text and "replicas 1" in text and "durability replica" in text
    bad = CliRunner().invoke(main, [*base, "config", "set", "durability", "paranoid"])
    assert bad.exit_code == 1 and "durability" in bad.stderr
