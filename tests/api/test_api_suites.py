"""The suite routes of a real ``deviceq api`` process over real HTTP: in the OpenAPI document,
a token needed, a suite submitted, shown, listed, waited for (a long poll) and cancelled; bad
bodies and an unsatisfiable deadline answered 400 on one line with nothing written."""

from __future__ import annotations

from typing import Any

import pytest
from test_api_server import call, start_api

from deviceq.api.tokens import TokenStore
from harness import Deployment

TESTS = [f"com.ex.A#t{i}" for i in range(6)]


@pytest.fixture
def served(deploy: Deployment) -> tuple[Deployment, str, str]:
    token = TokenStore(deploy.r, deploy.client.keys).add("tester", "producer")
    deploy.admin.add_host("h1")
    from deviceq import DeviceReport, HostClient

    HostClient(deploy.r, deploy.pool, "h1", deploy.admin.rotate_token("h1")).heartbeat(
        [DeviceReport("p1", "android"), DeviceReport("p2", "android")]
    )
    return deploy, start_api(deploy, "api", "--max-wait", "2"), token


def queued(d: Deployment) -> int:
    return int(d.r.zcard(d.client.keys.status("queued")))


def test_suites_over_http(served: tuple[Deployment, str, str]) -> None:
    d, url, token = served
    _, schema, _ = call(f"{url}/api/v1/openapi.json")
    assert {"/api/v1/suites", "/api/v1/suites/{suite_id}", "/api/v1/suites/{suite_id}/wait",
            "/api/v1/suites/{suite_id}/cancel"} <= set(schema["paths"])  # fmt: skip
    assert call(f"{url}/api/v1/suites")[0] == 401
    body: dict[str, Any] = {"name": "smoke", "tests": TESTS, "command": "run {tests}",
                            "driver_type": "android", "shards": 2}  # fmt: skip
    status, made, _ = call(f"{url}/api/v1/suites", "POST", body, token=token)
    assert status == 201, made
    assert len(made["shards"]) == 2 and made["eta_s"] > 0
    assert sorted(t for s in made["shards"] for t in s["tests"]) == sorted(TESTS)
    sid = made["id"]
    status, shown, _ = call(f"{url}/api/v1/suites/{sid}", token=token)
    assert status == 200 and shown["status"] == "running" and shown["tests"] == 6
    assert [s["task_id"] for s in shown["shards"]] == [s["task_id"] for s in made["shards"]]
    status, listed, _ = call(f"{url}/api/v1/suites?limit=5", token=token)
    assert [s["id"] for s in listed["suites"]] == [sid]
    status, waited, _ = call(f"{url}/api/v1/suites/{sid}/wait?timeout=0.5", token=token)
    assert status == 200 and waited["terminal"] is False
    status, cancelled, _ = call(f"{url}/api/v1/suites/{sid}/cancel", "POST", token=token)
    assert status == 200 and set(cancelled["tasks"].values()) == {"cancelled"}
    status, waited, _ = call(f"{url}/api/v1/suites/{sid}/wait", token=token)
    assert waited["terminal"] is True and waited["suite"]["status"] == "cancelled"
    assert call(f"{url}/api/v1/suites/nosuch", token=token)[0] == 404


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"deadline": 6, "shards": None}, "unsatisfiable: needs 6 devices, 2 match"),
        ({"tests": ["a", "a"]}, "listed twice"),
        ({"tests": "a"}, "tests must be a list"),
        ({"command": " "}, "must not be blank"),
        ({"include_joining": 60}, "goes with --each-device"),
        ({"shards": 0}, "--shards must be"),
        ({"bogus": 1}, "fields:"),
    ],
)
def test_bad_suites_are_400_on_one_line_and_write_nothing(
    served: tuple[Deployment, str, str], change: dict[str, Any], message: str
) -> None:
    d, url, token = served
    d.r.hset(d.client.keys.suite_durations("smoke"), mapping=dict.fromkeys(TESTS, 5000))
    body: dict[str, Any] = {"name": "smoke", "tests": TESTS, "command": "run {tests}",
                            "driver_type": "android", "shards": 2, **change}  # fmt: skip
    body = {k: v for k, v in body.items() if v is not None}
    status, err, _ = call(f"{url}/api/v1/suites", "POST", body, token=token)
    assert status == 400, err
    assert message in err["error"]["message"] and "\n" not in err["error"]["message"]
    assert queued(d) == 0 and d.r.zcard(d.client.keys.suites) == 0
