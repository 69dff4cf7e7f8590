"""Words that say what happened: ``explain`` of a delayed task says delayed (not failed and
retried), an unknown host is named unknown whatever its token, ``device unquarantine`` of a
device that is not quarantined says so and changes nothing, a device running a task shows
``running`` in ``device list``, and ``host run`` that cannot start exits 2 as its help says."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

import pytest

from deviceq import HostClient
from deviceq.core.errors import AuthError
from harness import CLI, Deployment, deviceq, wait_for


def test_explain_of_a_delayed_task_says_delayed_and_of_a_retry_says_retried(
    deploy: Deployment,
) -> None:
    d = deploy
    out = deviceq(d.url, d.pool, "submit", "later", "--delay", "1h")
    task_id = out.stdout.strip()
    text = deviceq(d.url, d.pool, "explain", task_id)
    assert text.returncode == 0, text.stderr
    words = " ".join(text.stdout.split())
    assert "delayed until" in words and "failed" not in words and "retried" not in words, words
    got = json.loads(deviceq(d.url, d.pool, "explain", task_id, "--json").stdout)
    assert got["reasons"][0]["code"] == "not_before", got
    # a real retry waiting out its backoff is still said to be one
    d.command_host("h1", "d1:x")
    d.scheduler()
    tid = d.client.submit("exit 1", driver_type="x", max_attempts=2,
                          retry_on="runner_failed", retry_backoff="fixed:600")  # fmt: skip
    wait_for(lambda: d.client.get(tid, attempts=False).eligible_at, 30, "the retry to wait")
    words = " ".join(deviceq(d.url, d.pool, "explain", tid).stdout.split())
    assert "attempt 1 failed (runner_failed)" in words and "retried in" in words, words


def test_an_unknown_host_is_said_to_be_unknown_whatever_its_token(deploy: Deployment) -> None:
    deploy.admin.add_host("h1")
    for token in ("short", "a-token-long-enough-0123456789"):
        with pytest.raises(AuthError, match="unknown host nosuch: not registered in this pool"):
            HostClient(deploy.r, deploy.pool, "nosuch", token).heartbeat([])
    with pytest.raises(AuthError, match="wrong token for host h1"):
        HostClient(deploy.r, deploy.pool, "h1", "short").heartbeat([])


def _device(d: Deployment, did: str) -> dict[str, Any]:
    return dict(d.r.hgetall(d.client.keys.device(did)))


def test_unquarantine_of_a_device_not_quarantined_changes_nothing(deploy: Deployment) -> None:
    d = deploy
    d.command_host("h1", "d1:x")
    wait_for(lambda: _device(d, "d1").get("state") == "idle", 30, "d1 idle")
    d.r.hset(d.client.keys.device("d1"), "consecutive_failures", "2")
    before = _device(d, "d1")
    events = d.r.xlen(d.client.keys.events)
    out = deviceq(d.url, d.pool, "device", "unquarantine", "d1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "d1 was not quarantined: nothing changed"
    after = _device(d, "d1")
    assert after["consecutive_failures"] == "2"
    assert {k: v for k, v in after.items() if k != "last_seen"} == {
        k: v for k, v in before.items() if k != "last_seen"
    }
    assert d.r.xlen(d.client.keys.events) == events or not any(
        e[1].get("type") == "device_unquarantined" for e in d.r.xrange(d.client.keys.events)
    )
    # a quarantined one is released, as before
    assert deviceq(d.url, d.pool, "device", "quarantine", "d1").returncode == 0
    out = deviceq(d.url, d.pool, "device", "unquarantine", "d1")
    assert out.stdout.strip() == "d1 released from quarantine (failure count reset)"


def test_a_device_running_a_task_shows_running(deploy: Deployment) -> None:
    d = deploy
    d.command_host("h1", "d1:x")
    d.scheduler()
    tid = d.client.submit("sleep 30", driver_type="x")
    wait_for(
        lambda: d.client.get(tid, attempts=False).status.value == "dispatched", 30, "dispatched"
    )
    table = deviceq(d.url, d.pool, "device", "list").stdout
    row = next(line for line in table.splitlines() if "d1" in line)
    assert "running" in row and "reserved" not in row, table
    show = deviceq(d.url, d.pool, "device", "show", "d1").stdout
    assert any(line.split() == ["state", "running"] for line in show.splitlines()), show
    got = json.loads(deviceq(d.url, d.pool, "device", "list", "--json").stdout)
    assert got[0]["effective_state"] == "reserved"  # (JSON keeps the effective state)


def test_host_run_that_cannot_start_exits_2(deploy: Deployment) -> None:
    env = {"DEVICEQ_REDIS_URL": deploy.url, "DEVICEQ_POOL": deploy.pool}
    token = deploy.tmp / "t"
    token.write_text(deploy.admin.add_host("h1"))
    proc = subprocess.run(
        [*CLI, "host", "run", "--host-id", "h1", "--token-file", str(token), "--device", "d1:x"],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "say how tasks run" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_an_answer_to_a_call_sent_before_an_outage_does_not_end_it() -> None:
    """A long poll answered as the server goes away is no sign it is back: only a call sent
    after the outage began ends it ("reachable again")."""
    from deviceq.core.backoff import Outage

    now = [100.0]
    said: list[str] = []
    o = Outage("api:1", lambda lvl, msg: said.append(msg), what="deviceq api",
               clock=lambda: now[0])  # fmt: skip
    o.failed(ConnectionError("refused"))
    now[0] = 101.0
    o.ok(sent=99.0)  # a long poll sent before the outage: answered, proves nothing
    assert o.down and not any("reachable again" in m for m in said)
    o.ok(sent=100.5)
    assert not o.down and said[-1].startswith("deviceq api reachable again after")
