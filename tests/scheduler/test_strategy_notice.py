"""A priority is never silently ignored: with a real scheduler process leading the pool, a
priority set while the strategy in force ignores it (the default fifo_match) is said on
stderr by ``submit`` and ``task set-priority`` (one line naming the strategy and how to change
it), returned as ``warnings`` by the HTTP API, warned (`PriorityIgnored`) by the Python
clients; ``status`` names the strategy in force; under priority_match nothing is said."""

from __future__ import annotations

import json
import warnings

import pytest
from test_api_server import call, start_api

from deviceq.api.tokens import TokenStore
from deviceq.core.connection import PriorityIgnored
from deviceq.producer.http_client import ApiClient
from harness import Deployment, deviceq, wait_for

HOW = "deviceq scheduler run --strategy priority_match"


def _strategy(d: Deployment) -> str | None:
    return d.r.get(d.client.keys.leader_strategy)


def test_a_priority_the_strategy_ignores_is_said_everywhere(deploy: Deployment) -> None:
    d = deploy
    # no scheduler led yet: the default is in force, and said to be
    out = deviceq(d.url, d.pool, "submit", "early", "--priority", "9")
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.split()) == 1  # stdout: the id alone
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "default strategy fifo_match" in lines[0] and HOW in lines[0]

    d.scheduler()  # fifo_match, the default
    wait_for(lambda: _strategy(d) == "fifo_match:0", 30, "the leader to record its strategy")
    out = deviceq(d.url, d.pool, "submit", "second", "--priority", "9")
    assert out.returncode == 0 and out.stderr.count("\n") == 1, out.stderr
    assert "the scheduler runs fifo_match" in out.stderr and HOW in out.stderr
    task_id = out.stdout.strip()
    out = deviceq(d.url, d.pool, "task", "set-priority", task_id, "8")
    assert out.returncode == 0 and out.stdout.strip() == f"{task_id} priority 8"
    assert out.stderr.count("\n") == 1 and "fifo_match" in out.stderr and HOW in out.stderr
    out = deviceq(d.url, d.pool, "submit", "plain")  # no priority: nothing said
    assert out.returncode == 0 and out.stderr == ""

    status = deviceq(d.url, d.pool, "status")
    assert "strategy fifo_match ignores priority" in " ".join(status.stdout.split())
    got = json.loads(deviceq(d.url, d.pool, "status", "--json").stdout)["strategy"]
    assert (got["name"], got["orders_by_priority"], got["recorded"]) == ("fifo_match", False, True)

    # the Python client warns; a task without a priority does not
    with pytest.warns(PriorityIgnored, match="fifo_match"):
        d.client.submit("py", priority=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d.client.submit("py-plain")
    with pytest.warns(PriorityIgnored, match="fifo_match"):
        d.admin.set_priority([task_id], 7)

    # the HTTP API answers it as warnings; its client warns with them
    token = TokenStore(d.r, d.client.keys).add("tester", "producer")
    url = start_api(d, "api")
    status_code, body, _ = call(f"{url}/api/v1/tasks", "POST", {"goal": "g", "priority": 4}, token)
    assert status_code == 201 and len(body["warnings"]) == 1 and HOW in body["warnings"][0]
    status_code, body, _ = call(f"{url}/api/v1/tasks", "POST", {"goal": "g"}, token)
    assert status_code == 201 and "warnings" not in body
    with pytest.warns(PriorityIgnored, match="fifo_match"):
        ApiClient(url, token).submit("via api", priority=3)
    assert "PriorityIgnored" not in d.log("api")  # the server answers it, never logs it

    # a scheduler running priority_match: a priority takes effect, nothing is said
    d.procs.pop("scheduler").kill()
    d.r.delete(d.client.keys.leader)  # (the next leader without waiting for the lease)
    d.spawn("scheduler2", "scheduler", "run", "--tick", "0.2", "--strategy", "priority_match")
    wait_for(lambda: _strategy(d) == "priority_match:1", 30, "the new leader's strategy")
    out = deviceq(d.url, d.pool, "submit", "urgent", "--priority", "9")
    assert out.returncode == 0 and out.stderr == ""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        d.client.submit("py", priority=5)
    status = deviceq(d.url, d.pool, "status")
    assert "strategy priority_match orders by priority" in " ".join(status.stdout.split())
