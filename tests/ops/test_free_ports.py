"""Ports under pytest-xdist: `harness.free_port` hands out ports of this worker's own block,
and a `RedisServer` is ready only when the server answering on its port is its own process (a
port another process took is replaced when the server chose it, refused when it was given)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import redis

import harness
from deviceq.core.redis_server import RedisServer


def test_free_ports_are_distinct_bindable_and_of_this_workers_block() -> None:
    ports = [harness.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(p in harness._BLOCK for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # nothing holds it


def test_the_blocks_of_the_workers_do_not_overlap(monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = []
    for i in range(4):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{i}")
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
        blocks.append(set(harness._port_block()))
    assert all(len(b) >= 1000 for b in blocks)
    assert sum(len(b) for b in blocks) == len(set().union(*blocks))
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert max(max(b) for b in blocks) < low  # below the ephemeral range


def test_a_server_whose_port_another_server_holds_starts_on_another(
    redis_server: RedisServer,
) -> None:
    mine = RedisServer()
    mine.port = redis_server.port  # as if another process took the port it chose
    with mine:
        assert mine.port != redis_server.port
        with redis.Redis(port=mine.port) as r:
            assert int(r.info("server")["process_id"]) == mine.proc.pid  # type: ignore[union-attr]
    given = RedisServer(port=redis_server.port)
    with pytest.raises(RuntimeError, match="another process holds it"):
        given.start()
    given.stop()
    with redis.Redis(port=redis_server.port) as r:
        assert r.ping()  # the other one is untouched
