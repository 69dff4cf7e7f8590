"""``deviceq explain``: where matching stops (driver type, tags, then each --where clause,
for a task and for each role of a multi-device task), and the order the pool's ``prefer``
gives the candidate devices, with the value each was ranked by (the first 10)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import Fleet
from deviceq.ops.explain.devices import RANKED_SHOWN


@pytest.fixture
def lab(real_fleet: Fleet) -> Fleet:
    f = real_fleet
    f.add_host("h1", ("a", "android", ("wifi",)), ("b", "android", ("wifi",)),
               ("c", "android", ("wifi",)), ("d", "android", ()), ("w", "browser", ()))  # fmt: skip
    for did, sdk, battery in (("a", 33, 50), ("b", 34, 80), ("c", 30, None), ("d", 35, 99)):
        f.admin.set_attributes(did, {"sdk": sdk, **({"battery": battery} if battery else {})})
    return f


def explained(cli: Any, tid: str) -> dict[str, Any]:
    out = cli("explain", tid, "--json")
    assert out.exit_code == 0, out.output
    return dict(json.loads(out.stdout))


def test_explain_says_where_matching_stops_after_driver_type_and_tag(lab: Fleet, cli: Any) -> None:
    tid = lab.client.submit("x", driver_type="android", tags=["wifi"], where=["sdk>=35"])
    text = " ".join(cli("explain", tid).stdout.split())
    assert "3 devices have driver type android and tags wifi; none has sdk>=35 (highest: 34)" \
        in text, text  # fmt: skip
    one = lab.client.submit("y", driver_type="android", tags=["wifi"],
                            where=["sdk>=35", "battery>=60"])  # fmt: skip
    text = " ".join(cli("explain", one).stdout.split())
    assert "1 device has driver type android and tags wifi and battery>=60; none has sdk>=35 " \
        "(highest: 34)" in text, text  # fmt: skip


def test_explain_shows_the_prefer_ranking(lab: Fleet, cli: Any) -> None:
    lab.admin.set_config("prefer", "max:battery")
    tid = lab.client.submit("x", driver_type="android")
    ex = explained(cli, tid)
    (pref,) = [r for r in ex["reasons"] if r["code"] == "prefer"]
    assert [x["device_id"] for x in pref["detail"]["ranking"]] == ["d", "b", "a", "c"]
    assert [x["value"] for x in pref["detail"]["ranking"]] == [99, 80, 50, None]
    text = " ".join(cli("explain", tid).stdout.split())
    assert "prefer max:battery ranks its 4 idle device(s): d (battery 99), b (battery 80), " \
        "a (battery 50), c (battery none)" in text, text  # fmt: skip
    # with --where, only the devices that satisfy it are ranked
    lab.admin.set_config("prefer", "min:sdk")
    other = lab.client.submit("y", driver_type="android", where=["sdk>=33"])
    (pref,) = [r for r in explained(cli, other)["reasons"] if r["code"] == "prefer"]
    assert [x["device_id"] for x in pref["detail"]["ranking"]] == ["a", "b", "d"]


def test_the_ranking_is_bounded(real_fleet: Fleet, cli: Any) -> None:
    f = real_fleet
    f.add_host("h1", *[(f"p{i:02}", "android", ()) for i in range(14)])
    for i in range(14):
        f.admin.set_attributes(f"p{i:02}", {"battery": i})
    f.admin.set_config("prefer", "max:battery")
    tid = f.client.submit("x", driver_type="android")
    (pref,) = [r for r in explained(cli, tid)["reasons"] if r["code"] == "prefer"]
    assert len(pref["detail"]["ranking"]) == RANKED_SHOWN
    assert pref["detail"]["ranking"][0] == {"device_id": "p13", "value": 13}
    assert ", 4 more" in pref["message"]


def test_explain_of_a_multi_device_task_per_role(lab: Fleet, cli: Any) -> None:
    lab.admin.set_config("prefer", "max:sdk")
    tid = lab.client.submit("pair", roles={"phone": "android:wifi where sdk>=34",
                                           "web": "browser"})  # fmt: skip
    reasons = explained(cli, tid)["reasons"]
    (pref,) = [r for r in reasons if r["code"] == "prefer" and r["detail"]["role"] == "phone"]
    assert [x["device_id"] for x in pref["detail"]["ranking"]] == ["b"]
    stuck = lab.client.submit("pair", roles={"phone": "android:wifi where sdk>=40",
                                             "web": "browser"})  # fmt: skip
    text = " ".join(cli("explain", stuck).stdout.split())
    assert "role phone: 3 devices have driver type android and tags wifi; none has sdk>=40 " \
        "(highest: 34)" in text, text  # fmt: skip
