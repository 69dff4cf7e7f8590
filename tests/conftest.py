"""Shared fixtures. Tests talk to a private ``redis-server`` started on a free port (one per
session, i.e. one per pytest-xdist worker, plus per-test servers for restart and fault tests).
Set DEVICEQ_TEST_BACKEND=fakeredis to run the suites marked ``both`` on fakeredis as well (they
are parametrized over backends)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
from click.testing import CliRunner, Result

from deviceq import Client, DeviceReport, HostClient, PoolAdmin, SchedulerClient
from deviceq.cli import main
from deviceq.core import fakeredis_compat
from deviceq.core import redis_server as local_redis
from deviceq.core.redis_server import RedisServer
from harness import Deployment, free_port
from reaper import Session

# every process this run starts carries its mark and is killed when the run ends, however it
# ends (see tests/reaper.py)
REAPER = Session()
REAPER.install()

fakeredis_compat.enable()  # redis.sha1hex in fakeredis's Lua, as real Redis has it
# the servers started in this process (RedisServer, LocalCluster) take their ports from this
# pytest-xdist worker's block (harness.free_port), as every other server a test starts does
local_redis.free_port = free_port


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    """A server of this test's own (restart, kill and persistence tests)."""
    with RedisServer(appendonly=True) as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


def _backends() -> list[str]:
    extra = os.environ.get("DEVICEQ_TEST_BACKEND", "redis,fakeredis")
    return [b for b in extra.split(",") if b]


@pytest.fixture(params=_backends())
def r(request: pytest.FixtureRequest, redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A decoded client to the real private server, or to fakeredis."""
    if request.param == "fakeredis":
        client = fakeredis.FakeRedis(decode_responses=True)
    else:
        client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def real_r(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A decoded client to the real private server only."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def pool() -> str:
    return "t" + uuid.uuid4().hex[:12]


class Fleet:
    """A pool with producer, admin and helpers to add hosts with devices."""

    def __init__(self, r: redis.Redis, pool: str) -> None:
        self.r = r
        self.pool = pool
        self.client = Client(r, pool)
        self.admin = PoolAdmin(r, pool)
        self.store = SchedulerClient(r, pool)
        self.tokens: dict[str, str] = {}
        self.snapshots: dict[str, list[DeviceReport]] = {}

    def add_host(self, host_id: str, *devices: tuple[str, str, tuple[str, ...]]) -> HostClient:
        token = self.admin.add_host(host_id)
        self.tokens[host_id] = token
        h = HostClient(self.r, self.pool, host_id, token)
        self.snapshots[host_id] = [DeviceReport(d, drv, tags) for d, drv, tags in devices]
        h.heartbeat(self.snapshots[host_id])
        return h

    def beat(self, *host_ids: str) -> None:
        """Heartbeat hosts with their snapshot again (proves them alive after a lost lease:
        their devices return to the candidates)."""
        for host_id in host_ids or tuple(self.snapshots):
            self.host(host_id).heartbeat(self.snapshots[host_id])

    def host(self, host_id: str) -> HostClient:
        return HostClient(self.r, self.pool, host_id, self.tokens[host_id])


@pytest.fixture
def fleet(r: redis.Redis, pool: str) -> Fleet:
    return Fleet(r, pool)


@pytest.fixture
def real_fleet(real_r: redis.Redis, pool: str) -> Fleet:
    return Fleet(real_r, pool)


@pytest.fixture
def deploy(redis_server: Any, pool: str, tmp_path: Path) -> Iterator[Deployment]:
    d = Deployment(redis_server.url, pool, tmp_path)
    d.configure(lease_ttl=2.0, claim_ttl=2.0, host_timeout=2.0, quarantine_after=10)
    try:
        yield d
    finally:
        d.close()


@pytest.fixture
def cli(redis_url: str, pool: str) -> Any:
    """The CLI in-process (click's CliRunner) on this test's pool: ``cli("task", "list")``."""
    runner = CliRunner()

    def run(*args: str) -> Result:
        return runner.invoke(main, ["--redis-url", redis_url, "--pool", pool, *args])

    return run


def pytest_unconfigure(config: pytest.Config) -> None:
    REAPER.end()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first: the ``slow`` ones (processes, wheels, fresh environments)
    and the modules one worker runs whole (``xdist_group``: a shared browser, a cluster),
    then those with real daemons (``deploy``), then the rest, each in collection order. Under
    pytest-xdist (``--dist loadgroup`` hands tests out in this order, one at a time) the long
    ones start early on every worker instead of ending the run on one; every worker sorts
    the same way, so their collections agree."""

    def weight(item: pytest.Item) -> int:
        if item.get_closest_marker("slow") or item.get_closest_marker("xdist_group"):
            return 0
        return 1 if "deploy" in getattr(item, "fixturenames", ()) else 2

    items.sort(key=weight)  # (stable: the collection order within each weight)
