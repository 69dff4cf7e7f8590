"""`HostClient.wait_and_claim`: the inbox wait and the claim after it in one round trip (on a
real server; two calls on fakeredis): an assignment made during the wait is claimed when the
wait ends, a wait that times out still claims, and a script's refusal is typed as `claim`'s."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from deviceq.core.connection import connect
from deviceq.core.errors import AuthError
from deviceq.core.lane import lane_of
from deviceq.core.redis_server import RedisServer
from deviceq.host.redis_link import HostClient


def _assign_later(fleet: Any, tid: str, device: str, after: float) -> threading.Thread:
    def run() -> None:
        time.sleep(after)
        assert fleet.store.commit([(tid, device)])[0].startswith("ok:")

    t = threading.Thread(target=run)
    t.start()
    return t


def test_an_assignment_made_during_the_wait_is_claimed_when_it_ends(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    h.start_session("s1")
    tid = fleet.client.submit("g", driver_type="android")
    t = _assign_later(fleet, tid, "d1", 0.3)
    t0 = time.monotonic()
    got = h.wait_and_claim(5.0, 1)
    took = time.monotonic() - t0
    t.join()
    assert [a.task.id for a in got] == [tid]
    assert 0.2 < took < 4.0  # woken by the assignment, not by the timeout
    assert fleet.client.get(tid).status.value == "dispatched"
    assert got[0].lease_ms > 0 and got[0].device_id == "d1"


def test_a_wait_that_times_out_still_claims(fleet: Any) -> None:
    h = fleet.add_host("h1", ("d1", "android", ()))
    h.start_session("s1")
    t0 = time.monotonic()
    assert h.wait_and_claim(0.3, 1) == []
    assert time.monotonic() - t0 >= 0.25
    # an assignment whose wake-up was already taken is still claimed by the next call
    tid = fleet.client.submit("g", driver_type="android")
    fleet.store.commit([(tid, "d1")])
    fleet.r.delete(fleet.store.keys.host_wake("h1"))
    assert [a.task.id for a in h.wait_and_claim(0.2, 1)] == [tid]


def test_a_refused_claim_is_typed_as_claims(fleet: Any) -> None:
    fleet.add_host("h1", ("d1", "android", ()))
    wrong = HostClient(fleet.r, fleet.pool, "h1", "not-the-token")
    with pytest.raises(AuthError):
        wrong.wait_and_claim(0.1, 1)
    with pytest.raises(AuthError):
        wrong.claim(1)


def test_one_round_trip_on_a_real_server_and_a_restart_is_ridden_out() -> None:
    with RedisServer() as server:
        r = connect(server.url)
        from conftest import Fleet

        fleet = Fleet(r, "wc")
        h = fleet.add_host("h1", ("d1", "android", ()))
        h.start_session("s1")
        assert lane_of(r) is not None  # the pipelined path
        tid = fleet.client.submit("g", driver_type="android")
        fleet.store.commit([(tid, "d1")])
        assert [a.task.id for a in h.wait_and_claim(1.0, 1)] == [tid]
        server.restart()  # (no persistence: scripts, pool and session gone)
        with pytest.raises(AuthError):  # the dead connection fell back; the host is unknown
            h.wait_and_claim(0.1, 1)
        lane = lane_of(r)
        assert lane is not None and lane.fallbacks >= 1
        observer = redis.Redis.from_url(server.url)
        assert observer.ping()
        observer.close()
        r.close()
