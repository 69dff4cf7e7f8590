"""Delta heartbeats (``lua/heartbeat.lua`` modes delta/full/commit, `deviceq.host.heartbeat_sync`)
on a real Redis: an unchanged heartbeat sends no device, a change is sent alone, a Redis that
lost state (restarted from an older snapshot, a lost reply, a removed device) gets the full
snapshot again, the devices left out of a full snapshot go offline, and a 5,000-device host
registers in bounded chunks with the state a single call would leave."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
import redis

from deviceq import Client, DeviceReport, HostClient, PoolAdmin, SchedulerClient
from deviceq.core.errors import DeviceOwned, InvalidInput
from deviceq.core.keys import Keys
from deviceq.core.redis_server import RedisServer
from deviceq.host import heartbeat_sync
from deviceq.host.heartbeat_sync import CHUNK, FIRST, Reply, Row

Call = tuple[str, list[Row], str]  # mode, rows, answer status


class Recorder:
    """The heartbeat calls a `HostClient` makes (each still runs the real script)."""

    def __init__(self, host: HostClient) -> None:
        self.calls: list[Call] = []
        self._real = host.heartbeat_call
        host.heartbeat_call = self  # type: ignore[method-assign]

    def __call__(self, mode: str, ver: str, arg: str, total: int, rows: Sequence[Row]) -> Reply:
        try:
            reply = self._real(mode, ver, arg, total, rows)
        except Exception as exc:
            self.calls.append((mode, list(rows), type(exc).__name__))
            raise
        self.calls.append((mode, list(rows), reply.status))
        return reply

    def take(self) -> list[Call]:
        out, self.calls = self.calls, []
        return out


def devs(n: int, prefix: str = "d", state: str = "idle") -> list[DeviceReport]:
    return [DeviceReport(f"{prefix}{i}", "android", ("wifi",), state) for i in range(n)]  # type: ignore[arg-type]


def device_events(r: redis.Redis, pool: str) -> list[dict[str, str]]:
    return [f for _, f in r.xrange(Keys(pool).events) if f.get("type") == "device_state"]


@pytest.fixture
def setup(real_r: redis.Redis, pool: str) -> tuple[redis.Redis, str, PoolAdmin]:
    return real_r, pool, PoolAdmin(real_r, pool)


def host(r: redis.Redis, pool: str, admin: PoolAdmin, host_id: str = "h1") -> HostClient:
    return HostClient(r, pool, host_id, admin.add_host(host_id))


def test_unchanged_heartbeat_sends_no_device(setup: Any) -> None:
    r, pool, admin = setup
    h = host(r, pool, admin)
    rec = Recorder(h)
    first = h.heartbeat(devs(3))
    assert [(m, len(rows), s) for m, rows, s in rec.take()] == [
        ("full", 3, "part"),
        ("commit", 0, "ok"),
    ]
    assert (first.devices, first.idle) == (3, 3)
    n_events = len(device_events(r, pool))
    before = r.hget(Keys(pool).host("h1"), "last_heartbeat")
    time.sleep(0.01)
    hb = h.heartbeat(devs(3))
    assert rec.take() == [("delta", [], "ok")]
    assert (hb.devices, hb.idle, hb.draining, hb.quarantined) == (3, 3, False, frozenset())
    assert len(device_events(r, pool)) == n_events, "nothing changed, nothing emitted"
    assert int(r.hget(Keys(pool).host("h1"), "last_heartbeat")) > int(before), "alive again"


def test_a_changed_device_alone_is_sent_and_applied(setup: Any) -> None:
    r, pool, admin = setup
    h = host(r, pool, admin)
    rec = Recorder(h)
    snap = devs(4)
    h.heartbeat(snap)
    rec.take()
    snap[2] = DeviceReport("d2", "android", ("wifi",), "busy", "flashing")  # type: ignore[arg-type]
    snap.append(DeviceReport("d9", "ios", ()))
    hb = h.heartbeat(snap)
    calls = rec.take()
    assert [(m, [row[0] for row in rows], s) for m, rows, s in calls] == [
        ("delta", ["d2", "d9"], "ok")
    ]
    assert (hb.devices, hb.idle) == (5, 4)
    d2 = admin.device("d2")
    assert (d2.state.value, d2.reason) == ("busy", "flashing")
    assert admin.device("d9").host_id == "h1"
    idle = set(r.zrange(Keys(pool).idle, 0, -1))
    assert idle == {"d0", "d1", "d3", "d9"}
    # a device the host no longer has: sent as gone, offline
    del snap[0]
    hb = h.heartbeat(snap)
    assert [(m, rows) for m, rows, _ in rec.take()] == [("delta", [("d0", "", "", "gone", "")])]
    assert admin.device("d0").state.value == "offline"
    assert "d0" not in r.zrange(Keys(pool).idle, 0, -1)
    assert (hb.devices, hb.idle) == (4, 3)


def test_delta_with_another_hosts_device_changes_nothing(setup: Any) -> None:
    r, pool, admin = setup
    other = host(r, pool, admin, "h2")
    other.heartbeat([DeviceReport("x1", "android")])
    h = host(r, pool, admin)
    h.heartbeat(devs(2))
    rec = Recorder(h)
    ver = r.hget(Keys(pool).host("h1"), "hb_ver")
    with pytest.raises(DeviceOwned):
        h.heartbeat([*devs(2), DeviceReport("x1", "android")])
    assert [(m, s) for m, _, s in rec.take()] == [("delta", "DeviceOwned")]
    assert r.hget(Keys(pool).host("h1"), "hb_ver") == ver
    assert admin.device("x1").host_id == "h2"
    h.heartbeat(devs(2))
    assert [m for m, _, _ in rec.take()] == ["delta"], "still in step with Redis"


def test_redis_restarted_from_an_older_snapshot_gets_the_full_snapshot() -> None:
    pool = "t" + uuid.uuid4().hex[:12]
    with RedisServer(appendonly=False) as srv:
        r = redis.Redis.from_url(srv.url, decode_responses=True)
        admin = PoolAdmin(r, pool)
        h = host(r, pool, admin)
        snap = devs(3)
        h.heartbeat(snap)
        r.save()  # what the restarted server will load: d1 idle
        snap[1] = DeviceReport("d1", "android", ("wifi",), "offline", "unplugged")  # type: ignore[arg-type]
        h.heartbeat(snap)
        assert admin.device("d1").state.value == "offline"
        srv.restart()  # the last heartbeat's writes are lost
        with contextlib.suppress(redis.ConnectionError):
            r.ping()  # the client's connection to the old process fails once, then reconnects
        assert admin.device("d1").state.value == "idle"
        rec = Recorder(h)
        h.heartbeat(snap)  # nothing changed on the host: Redis disagrees and asks for it all
        assert [(m, len(rows), s) for m, rows, s in rec.take()] == [
            ("delta", 0, "full"),
            ("full", 3, "part"),
            ("commit", 0, "ok"),
        ]
        assert admin.device("d1").state.value == "offline"
        assert set(r.zrange(Keys(pool).idle, 0, -1)) == {"d0", "d2"}
        h.heartbeat(snap)
        assert [m for m, _, _ in rec.take()] == ["delta"]
        r.close()


def test_a_lost_reply_and_a_removed_device_get_the_full_snapshot(setup: Any) -> None:
    r, pool, admin = setup
    h = host(r, pool, admin)
    h.heartbeat(devs(2))
    rec = Recorder(h)
    # a delta that got through without the host learning it (its reply was lost)
    ver = r.hget(Keys(pool).host("h1"), "hb_ver")
    assert h.heartbeat_call("delta", ver, "lost-reply", 2, []).status == "ok"
    h.heartbeat(devs(2))
    assert [(m, s) for m, _, s in rec.calls] == [
        ("delta", "ok"),
        ("delta", "full"),
        ("full", "part"),
        ("commit", "ok"),
    ]
    rec.take()
    admin.remove_device("d1", force=True)
    h.heartbeat(devs(2))
    assert [m for m, _, _ in rec.take()] == ["delta", "full", "commit"]
    assert admin.device("d1").host_id == "h1", "registered again by the full snapshot"


def test_a_new_session_starts_with_a_full_snapshot(setup: Any) -> None:
    r, pool, admin = setup
    token = admin.add_host("h1")
    h = HostClient(r, pool, "h1", token)
    h.start_session("s1")
    h.heartbeat(devs(2))
    rec = Recorder(h)
    h.heartbeat(devs(2))
    assert [m for m, _, _ in rec.take()] == ["delta"]
    h.start_session("s2", mode="takeover")
    h.heartbeat(devs(2))
    assert [m for m, _, _ in rec.take()] == ["full", "commit"]


def test_left_out_devices_go_offline_on_full_resync(setup: Any) -> None:
    r, pool, admin = setup
    token = admin.add_host("h1")
    HostClient(r, pool, "h1", token).heartbeat(devs(700))
    fresh = HostClient(r, pool, "h1", token)
    rec = Recorder(fresh)
    hb = fresh.heartbeat(devs(5))  # a client that never heartbeated: the full snapshot
    calls = rec.take()
    assert [m for m, _, _ in calls][:2] == ["full", "commit"]
    # 695 left out, at most 250 put offline a call: commit answers more until done
    assert [s for m, _, s in calls if m == "commit"] == ["more", "more", "ok"]
    assert (hb.devices, hb.idle) == (5, 5)
    assert set(r.zrange(Keys(pool).idle, 0, -1)) == {f"d{i}" for i in range(5)}
    states = {admin.device(f"d{i}").state.value for i in range(5, 700, 97)}
    assert states == {"offline"}
    assert admin.device("d699").reason == "not in the host snapshot"
    assert r.exists(Keys(pool).host_sync("h1"), Keys(pool).host_leftout("h1")) == 0
    fresh.heartbeat(devs(5))
    assert [m for m, _, _ in rec.take()] == ["delta"]


def test_held_marks_and_quarantine_without_a_full_snapshot(setup: Any) -> None:
    r, pool, admin = setup
    h = host(r, pool, admin)
    h.heartbeat(devs(3))
    rec = Recorder(h)
    admin.quarantine("d1")
    hb = h.heartbeat(devs(3))
    assert hb.quarantined == frozenset({"d1"})
    admin.set_config("claim_ttl", 1)
    tid = Client(r, pool).submit("g")
    store = SchedulerClient(r, pool)
    assert store.commit([(tid, "d2")])[0].startswith("ok:")
    time.sleep(1.2)
    assert store.expire()["requeued"] == 1
    assert admin.device("d2").held == "suspect"
    assert "d2" not in r.zrange(Keys(pool).idle, 0, -1)
    admin.quarantine("d1", False)
    hb = h.heartbeat(devs(3))
    assert hb.quarantined == frozenset()
    assert admin.device("d2").held in (None, "")
    assert set(r.zrange(Keys(pool).idle, 0, -1)) == {"d0", "d1", "d2"}
    assert [(m, rows) for m, rows, _ in rec.take()] == [("delta", []), ("delta", [])]


def normalized(r: redis.Redis, pool: str) -> dict[str, Any]:
    """The pool's device and host state with times, versions, token digests, idle scores and
    the cache generation (one per call that registered devices) left out."""
    keys = Keys(pool)
    out: dict[str, Any] = {}
    skip = {"registered_at", "created_at", "updated_at", "last_heartbeat", "hb_ver", "token_digest"}
    for key in r.scan_iter(match=f"dq:{{{pool}}}:*", count=1000):
        kind = r.type(key)
        if kind == "hash":
            out[key] = {f: v for f, v in r.hgetall(key).items() if f not in skip}
        elif kind == "set":
            out[key] = sorted(r.smembers(key))
        elif kind == "zset":
            out[key] = sorted(r.zrange(key, 0, -1))
        elif kind == "string":
            out[key] = r.get(key)
    out.pop(keys.events, None)
    out.pop(keys.devgen, None)
    n_events = sum(1 for _, f in r.xrange(keys.events) if f.get("type") == "device_registered")
    out["registered events"] = n_events
    return out


def test_5000_devices_register_in_chunks_with_the_same_state(setup: Any, monkeypatch: Any) -> None:
    r, _, _ = setup
    """Chunks of 100 (the default) and of 400 (the script's most) in a full snapshot, and
    100 in deltas after an empty first heartbeat, leave the same state."""
    r, _, _ = setup
    states: list[dict[str, Any]] = []
    snap = [
        DeviceReport(f"big-d{i}", f"drv{i % 3}", ("t" + str(i % 5),), "busy" if i % 7 else "idle")  # type: ignore[arg-type]
        for i in range(5000)
    ]
    monkeypatch.setattr(heartbeat_sync, "PACE_MS", 1e9)  # chunks of CHUNK, however slow
    for chunk, mode in ((CHUNK, "full"), (400, "full"), (CHUNK, "delta")):
        pool = "t" + uuid.uuid4().hex[:12]
        admin = PoolAdmin(r, pool)
        monkeypatch.setattr(heartbeat_sync, "CHUNK", chunk)
        monkeypatch.setattr(heartbeat_sync, "FIRST", chunk)
        h = host(r, pool, admin)
        if mode == "delta":
            h.heartbeat([])
        rec = Recorder(h)
        hb = h.heartbeat(snap)
        calls = rec.take()
        assert all(len(rows) <= chunk for _, rows, _ in calls)
        assert {m for m, _, _ in calls} == ({"full", "commit"} if mode == "full" else {"delta"})
        assert len(calls) == -(-5000 // chunk) + (1 if mode == "full" else 0)
        assert (hb.devices, hb.idle) == (5000, len([d for d in snap if d.state == "idle"]))
        assert r.zcard(Keys(pool).idle) == hb.idle
        assert r.scard(Keys(pool).host_devices("h1")) == 5000
        states.append({k.replace(pool, "P"): v for k, v in normalized(r, pool).items()})
        h.heartbeat(snap)
        assert [(m, rows) for m, rows, _ in rec.take()] == [("delta", [])]
    host_key = "dq:{P}:host:h1"
    assert [s[host_key] for s in states[1:]] == [states[0][host_key]] * 2
    assert states[0] == states[1] == states[2]
    assert states[0]["dq:{P}:drivers"] == {"drv0": "1667", "drv1": "1667", "drv2": "1666"}
    assert states[0]["registered events"] == 5000


def test_the_script_refuses_an_oversized_chunk_and_an_unknown_mode(setup: Any) -> None:
    r, pool, admin = setup
    h = host(r, pool, admin)
    rows = [(f"d{i}", "android", "", "idle", "") for i in range(401)]
    with pytest.raises(InvalidInput, match="bad argument count"):
        h.heartbeat_call("full", "sync1", "first", 0, rows)
    with pytest.raises(InvalidInput, match="mode must be"):
        h.heartbeat_call("snapshot", "sync1", "first", 0, rows[:1])
    assert r.scard(Keys(pool).devices) == 0


def test_a_commit_or_a_chunk_of_no_current_sync_is_refused(setup: Any) -> None:
    r, pool, admin = setup
    h = host(r, pool, admin)
    h.heartbeat(devs(3))
    assert h.heartbeat_call("commit", "no-such-sync", "first", 0, []).status == "full"
    assert h.heartbeat_call("full", "no-such-sync", "", 0, []).status == "full"
    assert set(r.zrange(Keys(pool).idle, 0, -1)) == {"d0", "d1", "d2"}, "nothing went offline"


def test_a_full_snapshot_rebuilds_the_quarantined_set(setup: Any) -> None:
    r, pool, admin = setup
    token = admin.add_host("h1")
    HostClient(r, pool, "h1", token).heartbeat(devs(3))
    admin.quarantine("d0")
    qk = Keys(pool).host_quarantined("h1")
    r.sadd(qk, "d2")  # a stale member (as a set written before this layout would lack)
    r.srem(qk, "d0")  # and a missing one
    hb = HostClient(r, pool, "h1", token).heartbeat(devs(3))  # a new client: full snapshot
    assert hb.quarantined == frozenset({"d0"})
    assert r.smembers(qk) == {"d0"}


class SlowRedis(Recorder):
    """The real calls, each made to take 100 µs per device longer (a loaded Redis)."""

    def __call__(self, mode: str, ver: str, arg: str, total: int, rows: Sequence[Row]) -> Reply:
        time.sleep(len(rows) * 1e-4)
        return super().__call__(mode, ver, arg, total, rows)


def test_chunks_shrink_when_the_calls_take_longer_than_the_pace(setup: Any) -> None:
    r, pool, admin = setup
    h = host(r, pool, admin)
    rec = SlowRedis(h)
    hb = h.heartbeat(devs(1000))
    calls = rec.take()
    sizes = [len(rows) for m, rows, _ in calls if m == "full"]
    assert sizes[0] == FIRST and sum(sizes) == 1000  # every device, once
    assert max(sizes[1:]) <= 25  # 40 devices took 4 ms: toward 2.5 ms a call
    assert (hb.devices, r.scard(Keys(pool).host_devices("h1"))) == (1000, 1000)
    changed = devs(30, state="busy") + devs(1000)[30:]  # a delta of 30 changes: paced alike
    h.heartbeat(changed)
    delta = [len(rows) for m, rows, _ in rec.take() if m == "delta"]
    assert sum(delta) == 30 and max(delta) <= 25
