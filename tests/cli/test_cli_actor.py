"""Who acted, from the command line: ``task cancel|retry|set-priority``, ``device
quarantine|unquarantine``, ``host drain|undrain``, ``pause`` and ``resume`` record
``DEVICEQ_ACTOR`` (else the login name, when it is a valid id) as the ``by`` of the events
they emit, on a real Redis."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from conftest import Fleet
from deviceq.cli import main
from deviceq.core.keys import Keys


def run(url: str, pool: str, env: dict[str, str | None], *args: str) -> Result:
    return CliRunner().invoke(main, ["--redis-url", url, "--pool", pool, *args], env=env)


def events(r: redis.Redis, pool: str) -> list[dict[str, Any]]:
    return [dict(f, type=f.get("type")) for _, f in r.xrange(Keys(pool).events)]


def by_of(r: redis.Redis, pool: str, kind: str) -> list[str | None]:
    return [e.get("by") for e in events(r, pool) if e.get("type") == kind]


def test_every_cli_action_records_deviceq_actor_as_by(
    real_fleet: Fleet, real_r: redis.Redis, redis_url: str, pool: str
) -> None:
    real_fleet.add_host("lab-1", ("pixel-7", "android", ()))
    env: dict[str, str | None] = {"DEVICEQ_ACTOR": "bob"}
    queued = real_fleet.client.submit("a", driver_type="android")
    other = real_fleet.client.submit("c", driver_type="android")
    steps = [
        ("task", "set-priority", other, "5"),
        ("task", "cancel", queued),
        ("task", "retry", queued),
        ("device", "quarantine", "pixel-7", "--reason", "cracked"),
        ("device", "unquarantine", "pixel-7"),
        ("host", "drain", "lab-1"),
        ("host", "undrain", "lab-1"),
        ("pause", "--reason", "power"),
    ]
    for args in steps:
        res = run(redis_url, pool, env, *args)
        assert res.exit_code == 0, (args, res.output)
    status = run(redis_url, pool, env, "status", "--json")
    assert json.loads(status.stdout)["paused"]["by"] == "bob"
    assert "PAUSED by bob (power)" in run(redis_url, pool, env, "status").stdout
    assert run(redis_url, pool, env, "resume").exit_code == 0

    assert by_of(real_r, pool, "priority_changed") == ["bob"]
    assert by_of(real_r, pool, "cancelled") == ["bob"]
    retried = [e for e in events(real_r, pool) if e.get("type") == "submitted"][-1]
    assert retried.get("by") == "bob"
    assert real_fleet.client.get(retried["task"]).submitted_by == "bob"
    assert by_of(real_r, pool, "device_quarantined") == ["bob"]
    assert by_of(real_r, pool, "device_unquarantined") == ["bob"]
    assert by_of(real_r, pool, "host_draining") == ["bob"]
    assert by_of(real_r, pool, "host_undrained") == ["bob"]
    assert by_of(real_r, pool, "pool_paused") == ["bob"]
    assert by_of(real_r, pool, "pool_resumed") == ["bob"]


def test_without_deviceq_actor_the_login_name_is_by_and_a_name_no_id_is_not_recorded(
    real_fleet: Fleet, real_r: redis.Redis, redis_url: str, pool: str
) -> None:
    real_fleet.add_host("lab-1", ("pixel-7", "android", ()))
    # getpass.getuser() reads LOGNAME first: the login name as the process sees it
    carol: dict[str, str | None] = {"DEVICEQ_ACTOR": None, "LOGNAME": "carol"}
    assert run(redis_url, pool, carol, "pause").exit_code == 0
    spaced: dict[str, str | None] = {"DEVICEQ_ACTOR": None, "LOGNAME": "Jean Dupont"}
    assert run(redis_url, pool, spaced, "resume").exit_code == 0
    assert by_of(real_r, pool, "pool_paused") == ["carol"]
    assert by_of(real_r, pool, "pool_resumed") == [None]


@pytest.mark.parametrize(
    "args",
    [
        ("pause",),
        ("task", "set-priority", "QUEUED", "5"),
        ("host", "drain", "lab-1"),
        ("device", "quarantine", "pixel-7"),
        ("task", "cancel", "QUEUED"),
        ("task", "retry", "CANCELLED", "--yes"),
    ],
)
def test_a_malformed_deviceq_actor_is_one_line_and_changes_nothing(
    args: tuple[str, ...], real_fleet: Fleet, real_r: redis.Redis, redis_url: str, pool: str
) -> None:
    real_fleet.add_host("lab-1", ("pixel-7", "android", ()))
    queued = real_fleet.client.submit("a", driver_type="android")
    cancelled = real_fleet.client.submit("b", driver_type="android")
    real_fleet.client.cancel(cancelled)
    before = len(events(real_r, pool))
    args = tuple({"QUEUED": queued, "CANCELLED": cancelled}.get(a, a) for a in args)
    res = run(redis_url, pool, {"DEVICEQ_ACTOR": "bob the builder"}, *args)
    assert res.exit_code != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "DEVICEQ_ACTOR" in lines[0], res.stderr
    assert len(events(real_r, pool)) == before
    assert real_fleet.client.get(queued).status.value == "queued"
    assert real_fleet.client.get(queued).priority == 0
    assert real_r.exists(Keys(pool).paused) == 0
