"""``where`` over the HTTP API: a task's (and each role's) --where expressions go through
``POST /api/v1/tasks`` and ``/api/v1/tasks/batch`` like any submit field, a malformed one is
a one-line 400 that writes nothing, and an attribute no device has comes back as a warning."""

from __future__ import annotations

from typing import Any

import pytest
from test_api_server import call, start_api

from deviceq.api.tokens import TokenStore
from harness import Deployment


@pytest.fixture
def served(deploy: Deployment) -> tuple[Deployment, str, str]:
    token = TokenStore(deploy.r, deploy.client.keys).add("tester", "producer")
    deploy.admin.add_host("h1")
    deploy.r.hset(deploy.client.keys.attr_names, "sdk", 1)  # (one device has sdk)
    return deploy, start_api(deploy, "api", "--max-wait", "3"), token


def test_where_through_the_api(served: Any) -> None:
    d, url, token = served
    status, body, _ = call(f"{url}/api/v1/tasks", "POST",
                           {"goal": "camera", "where": ["sdk>=33"]}, token)  # fmt: skip
    assert status == 201 and "warnings" not in body, body
    assert d.client.get(body["id"]).where == ("sdk>=33",)
    status, body, _ = call(f"{url}/api/v1/tasks", "POST",
                           {"goal": "camera", "where": ["sdkk>=33"]}, token)  # fmt: skip
    assert status == 201
    assert body["warnings"] == ["no device has attribute 'sdkk' (known: sdk)"]
    status, body, _ = call(f"{url}/api/v1/tasks/batch", "POST", {"tasks": [
        {"goal": "pair", "roles": {"phone": {"driver_type": "android", "where": ["sdk>=34"]},
                                   "web": "browser where gps=true"}}]}, token)  # fmt: skip
    assert status == 201, body
    assert body["warnings"] == ["no device has attribute 'gps' (known: sdk)"]
    t = d.client.get(body["ids"][0])
    assert t.roles["phone"].where == ("sdk>=34",) and t.roles["web"].where == ("gps=true",)
    before = d.r.zcard(d.client.keys.status("queued"))
    for bad in (["sdk >"], ["sdk>>33"], 3):
        status, body, _ = call(f"{url}/api/v1/tasks", "POST", {"goal": "x", "where": bad}, token)
        assert status == 400 and "\n" not in str(body), body
    assert d.r.zcard(d.client.keys.status("queued")) == before
