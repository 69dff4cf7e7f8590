"""The short path for script calls (`deviceq.core.lane`): used on a plain standalone client,
never on fakeredis or behind Sentinel; its answers and errors are the client's, and a dropped
connection, a restarted server (its scripts gone) or a repointed pool are ridden out."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis

from deviceq import Client, HostClient, PoolAdmin
from deviceq.core.connection import connect
from deviceq.core.errors import AuthError, InvalidInput
from deviceq.core.lane import MAX_IDLE, Batch, Lane, batch, lane_of
from deviceq.core.redirects import repoint
from deviceq.core.redis_server import RedisServer
from harness import wait_for


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as s:
        yield s


def _warm(server: RedisServer) -> tuple[redis.Redis, Client, Lane]:
    """A daemon-like client that ran one script call (its lane keeps the connection)."""
    r = connect(server.url)
    client = Client(r, "lane")
    client.submit("g", driver_type="x")
    lane = lane_of(r)
    assert lane is not None and lane._idle
    return r, client, lane


def _last_commands(r: redis.Redis, conns: list[object]) -> set[str]:
    """What the server says ``conns`` (a lane's connections) ran last."""
    addrs = {"{}:{}".format(*c._sock.getsockname()[:2]) for c in conns}  # type: ignore[attr-defined]
    return {c["cmd"] for c in r.client_list() if c["addr"] in addrs}


def test_a_standalone_client_gets_a_lane_once_it_knows_there_is_no_cluster(
    server: RedisServer,
) -> None:
    r = connect(server.url)
    assert lane_of(r) is None  # nothing sent yet: a cluster is still possible
    r.exists("x")  # the first command asks (CLUSTER SLOTS): standalone
    lane = lane_of(r)
    assert lane is not None and lane_of(r) is lane
    assert lane.call("SET", "k", "v") == "OK" and lane.call("GET", "k") == "v"
    plain = redis.Redis.from_url(server.url, decode_responses=True)
    assert lane_of(plain) is not None
    r.close()
    plain.close()


def test_no_lane_on_fakeredis_or_a_subclassed_client() -> None:
    assert lane_of(fakeredis.FakeRedis(decode_responses=True)) is None

    class Custom(redis.Redis):
        pass

    assert lane_of(Custom()) is None


def test_script_calls_go_by_the_lane_and_give_the_clients_answers_and_errors(
    server: RedisServer,
) -> None:
    r = connect(server.url)
    admin = PoolAdmin(r, "lane")
    token = admin.add_host("h1")
    host = HostClient(r, "lane", "h1", token)
    host.start_session("s1")
    assert host.claim(5) == []  # a script call, answered
    lane = lane_of(r)
    assert lane is not None
    idle_before = len(lane._idle)
    assert idle_before >= 1  # the call's connection went back for the next one
    with pytest.raises(AuthError):  # a script's error reply, typed as on the client's path
        HostClient(r, "lane", "h1", "wrong-token").claim(1)
    with pytest.raises(InvalidInput):
        host._run("claim", [*host._auth(), "not-a-number"])
    assert lane.fallbacks == 0
    observer = redis.Redis.from_url(server.url, decode_responses=True)
    assert _last_commands(observer, list(lane._idle)) == {"evalsha"}  # the lane ran them
    observer.close()
    r.close()


def test_a_restarted_server_without_its_scripts_is_ridden_out(server: RedisServer) -> None:
    r = connect(server.url)
    client = Client(r, "lane")
    client.submit("g", driver_type="x")
    assert lane_of(r) is not None
    server.restart()  # (no persistence: the scripts and the task are gone)
    ids = client.submit_many([{"goal": "g", "driver_type": "x"}] * 3)
    assert len(ids) == 3  # the dead connection fell back; NOSCRIPT sent the body
    lane = lane_of(r)
    assert lane is not None and lane.fallbacks >= 1
    assert client.get(ids[0]).status == "queued"
    r.close()


def test_a_killed_connection_falls_back_once_and_the_next_call_uses_a_new_one(
    server: RedisServer,
) -> None:
    r, client, lane = _warm(server)
    killer = redis.Redis.from_url(server.url, decode_responses=True)
    for c in killer.client_list():
        if c.get("cmd") in ("eval", "evalsha"):
            killer.client_kill_filter(_id=c["id"])
    client.submit("g", driver_type="x")
    assert lane.fallbacks == 1
    client.submit("g", driver_type="x")
    assert lane.fallbacks == 1  # a fresh lane connection
    assert client.counts().get("queued") == 3
    killer.close()
    r.close()


def test_a_repointed_pool_moves_the_lane_with_it() -> None:
    with RedisServer() as a, RedisServer() as b:
        r = connect(a.url)
        r.set("where", "a")
        redis.Redis.from_url(b.url).set("where", "b")
        lane = lane_of(r)
        assert lane is not None and lane.call("GET", "where") == "a"
        repoint(r.connection_pool, "127.0.0.1", b.port)
        assert lane.call("GET", "where") == "b"  # the kept connection to a was dropped
        r.close()


def test_arguments_are_sent_as_the_client_sends_them(server: RedisServer) -> None:
    r, _, lane = _warm(server)
    assert lane._c_pack  # (UTF-8, strict: hiredis packs)
    lane.call("SET", "k", "é ✓ 日本")
    assert lane.call("GET", "k") == "é ✓ 日本"
    lane.call("MSET", "i", 12, "f", 2.5, "b", b"\x00raw")
    assert lane.call("MGET", "i", "f", "b") == ["12", "2.5", "\x00raw"]
    # what hiredis refuses goes through redis-py's packer, which raises as it always did
    for bad in (None, True):
        with pytest.raises(redis.DataError):
            lane.call("SET", "k", bad)
    with pytest.raises(UnicodeEncodeError):
        lane.call("SET", "k", "\ud800")
    assert lane.call("GET", "k") == "é ✓ 日本" and lane.fallbacks == 0  # (none sent)
    # in one round trip too
    assert lane.call_many(("SET", "k", "ü"), ("GET", "k")) == ["OK", "ü"]
    r.close()


def test_calls_racing_from_threads_each_get_their_own_connection(server: RedisServer) -> None:
    r = connect(server.url)
    client = Client(r, "lane")
    errors: list[BaseException] = []
    go = threading.Barrier(12)

    def submit() -> None:
        try:
            go.wait()
            for _ in range(40):
                client.submit("g", driver_type="x")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=submit) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert client.counts().get("queued") == 12 * 40
    lane = lane_of(r)
    assert lane is not None and 1 <= len(lane._idle) <= MAX_IDLE
    r.close()


def test_a_forked_child_never_uses_its_parents_connections(server: RedisServer) -> None:
    r, client, lane = _warm(server)
    parents = list(lane._idle)
    pid = os.fork()
    if pid == 0:  # the child: submit, and tell by its exit status whether it shared a socket
        try:
            client.submit("g", driver_type="x")
            shared = any(c in parents for c in lane._idle)
            os._exit(3 if shared else 0)
        except BaseException:  # noqa: BLE001
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    client.submit("g", driver_type="x")  # the parent's connection still works
    assert client.counts().get("queued") == 3
    r.close()


def test_closing_the_pool_connection_closes_the_lanes_connections(server: RedisServer) -> None:
    _, client, lane = _warm(server)
    observer = redis.Redis.from_url(server.url, decode_responses=True)
    before = len(observer.client_list())
    client.close()
    assert lane._idle == []
    # (the server sees a closed connection on its next turn: the count drops soon after)
    wait_for(lambda: len(observer.client_list()) < before, 5, "connections closed")
    observer.close()


def _queue_reads(p: Any) -> None:
    """The reads a scheduler pass queues, on ``p`` (a `Batch` or a redis-py pipeline)."""
    p.time()
    p.hmget("h", "a", "missing")
    p.hmget("h", ["a", "b"])
    p.hget("h", "b")
    p.hgetall("h")
    p.hgetall("nothing")
    p.hlen("h")
    p.get("s")
    p.zcard("z")
    p.execute_command("ZRANGE", "z", 0, -1, "WITHSCORES")


def test_a_batch_answers_what_the_clients_pipeline_answers(server: RedisServer) -> None:
    r = connect(server.url)
    r.hset("h", mapping={"a": "1", "b": "2"})
    r.set("s", "v")
    r.zadd("z", {"m1": 1.5, "m2": 2})
    lane = lane_of(r)
    assert lane is not None
    quick, plain = batch(r), r.pipeline(transaction=False)
    assert isinstance(quick, Batch)
    _queue_reads(quick)
    _queue_reads(plain)
    got, want = quick.execute(), plain.execute()
    assert got[1:] == want[1:] and got[0][0] - want[0][0] in (-1, 0)  # (TIME: a second apart)
    assert got[4] == {"a": "1", "b": "2"} and got[5] == {}  # (HGETALL: a dict, as ever)
    assert quick.execute() == []  # (sent once)
    assert batch(fakeredis.FakeRedis(decode_responses=True)).__class__ is not Batch
    r.close()


def test_a_batch_raises_the_first_error_or_keeps_errors_in_place(server: RedisServer) -> None:
    r = connect(server.url)
    r.set("s", "v")
    assert lane_of(r) is not None
    b = batch(r)
    b.get("s").hgetall("s").get("s")  # HGETALL of a string: WRONGTYPE
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        b.execute()
    b.get("s").evalsha("0" * 40, 0).get("s")
    got = b.execute(raise_on_error=False)
    assert got[0] == got[2] == "v" and isinstance(got[1], redis.exceptions.NoScriptError)
    r.close()


def test_a_batch_on_a_killed_connection_goes_through_the_clients_pipeline(
    server: RedisServer,
) -> None:
    r = connect(server.url)
    r.hset("h", mapping={"a": "1"})
    lane = lane_of(r)
    assert lane is not None
    assert batch(r).get("nothing").execute() == [None]  # (the lane keeps a connection)
    killer = redis.Redis.from_url(server.url, decode_responses=True)
    addr = "{}:{}".format(*lane._idle[0]._sock.getsockname()[:2])  # type: ignore[attr-defined]
    assert killer.client_kill(addr)
    killer.close()
    before = lane.fallbacks
    assert batch(r).hgetall("h").time().execute()[0] == {"a": "1"}
    assert lane.fallbacks == before + 1
    r.close()
