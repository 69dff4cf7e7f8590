"""Gates hold devices out of new work while their attributes say so: held and released as
attributes change (by an operator or the owning host), checked over every device when a gate
is added or removed, shown in device list/show, events and explain; never a quarantine."""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import Fleet
from deviceq.core.errors import AlreadyExists, InvalidInput, NotFound
from deviceq.ops.gates import add_gate, gates, held_devices, remove_gate


@pytest.fixture
def phones(real_fleet: Fleet) -> Fleet:
    f = real_fleet
    f.add_host("h1", ("p1", "android", ()), ("p2", "android", ()), ("w1", "web", ()))
    f.admin.set_attributes("p1", {"battery": 90})
    f.admin.set_attributes("p2", {"battery": 15})
    f.admin.set_attributes("w1", {"battery": 5})
    return f


def idle(f: Fleet) -> set[str]:
    return {str(d) for d in f.r.zrange(f.admin.keys.idle, 0, -1)}


def events(f: Fleet, kind: str) -> list[dict[str, str]]:
    return [e for _, e in f.r.xrange(f.admin.keys.events) if e.get("type") == kind]


def test_a_gate_holds_low_devices_and_releases_them_after_charging(phones: Fleet) -> None:
    f = phones
    g, held = add_gate(f.admin, "low-battery", ["battery<20"], ["battery>=80"], "android")
    assert held == 1 and idle(f) == {"p1", "w1"}  # w1 is no android: not this gate's
    p2 = f.admin.device("p2")
    assert (p2.gated, p2.gated_reason) == ("low-battery", "battery 15")
    assert events(f, "device_gated")[0]["device"] == "p2"
    # charging: still held until the --until holds, the reason follows the value
    f.admin.set_attributes("p2", {"battery": 50})
    assert f.admin.device("p2").gated_reason == "battery 50" and "p2" not in idle(f)
    f.admin.set_attributes("p2", {"battery": 80})
    assert f.admin.device("p2").gated is None and "p2" in idle(f)
    assert [e["device"] for e in events(f, "device_ungated")] == ["p2"]
    # p1 drains: held at its next report; never quarantined, no failure counted
    f.admin.set_attributes("p1", {"battery": 19})
    p1 = f.admin.device("p1")
    assert p1.gated == "low-battery" and not p1.quarantined and p1.consecutive_failures == 0
    assert held_devices(f.admin) == {"low-battery": ["p1"]}
    # an assignment to a held device is refused
    tid = f.client.submit("x", driver_type="android")
    assert f.store.commit([(tid, "p1")]) == ["err:device_gated"]
    assert remove_gate(f.admin, "low-battery") == 1
    assert "p1" in idle(f) and gates(f.admin) == []


def test_without_until_a_gate_lets_go_when_its_rule_no_longer_holds(phones: Fleet) -> None:
    f = phones
    add_gate(f.admin, "hot", ["temperature>=45"])
    f.admin.set_attributes("p1", {"temperature": 47.5})
    assert f.admin.device("p1").gated_reason == "temperature 47.5"
    f.admin.set_attributes("p1", {"temperature": 44})
    assert f.admin.device("p1").gated is None and "p1" in idle(f)


def test_a_running_task_finishes_on_a_device_a_gate_takes(phones: Fleet) -> None:
    f = phones
    tid = f.client.submit("x", driver_type="android")
    (ok,) = f.store.commit([(tid, "p1")])
    assert ok.startswith("ok:")
    (a,) = f.host("h1").claim(1)
    h = f.host("h1")
    f.admin.unset_attributes("p1", ["battery"])  # (an operator's value wins over the host's)
    h.send_attributes({"p1": ({"battery": 3}, ())})
    add_gate(f.admin, "low", ["battery<20"])
    assert f.admin.device("p1").gated == "low"
    assert h.report(tid, a.lease_id, "done") == "ok:done"
    assert f.client.get(tid).status.value == "done"
    assert "p1" not in idle(f)  # still held once its run ended


def test_bad_gates_change_nothing(phones: Fleet) -> None:
    f = phones
    with pytest.raises(InvalidInput):
        add_gate(f.admin, "x", ["battery <"])
    with pytest.raises(InvalidInput):
        add_gate(f.admin, "x", [])
    with pytest.raises(InvalidInput):
        add_gate(f.admin, "b@d", ["battery<3"])
    add_gate(f.admin, "a", ["battery<3"])
    with pytest.raises(AlreadyExists):
        add_gate(f.admin, "a", ["battery<4"])
    with pytest.raises(NotFound):
        remove_gate(f.admin, "nope")
    for i in range(15):
        add_gate(f.admin, f"g{i:02}", [f"level{i}>1"])
    with pytest.raises(InvalidInput, match="at most 16"):
        add_gate(f.admin, "one-too-many", ["battery<1"])
    assert len(gates(f.admin)) == 16


def test_cli_gate_add_list_remove_and_where_it_shows(phones: Fleet, cli: Any) -> None:
    out = cli("gate", "add", "low-battery", "--when", "battery<20", "--until", "battery>=80",
              "--driver-type", "android")  # fmt: skip
    assert out.exit_code == 0 and "holds 1 device" in out.stdout, out.output
    listed = json.loads(cli("gate", "list", "--json").stdout)
    assert listed[0]["name"] == "low-battery" and listed[0]["devices"] == ["p2"]
    assert listed[0]["when"] == ["battery<20"] and listed[0]["until"] == ["battery>=80"]
    table = cli("device", "list")
    assert "gated" in table.stdout and "low-battery: battery 15" in " ".join(table.stdout.split())
    row = {r["device_id"]: r for r in json.loads(cli("device", "list", "--json").stdout)}["p2"]
    assert row["effective_state"] == "gated" and "low-battery: battery 15" in row["why"]
    assert "gated" in cli("device", "show", "p2").stdout
    assert cli("gate", "add", "x", "--when", "battery <").exit_code == 2
    assert cli("gate", "add", "x").exit_code == 2
    assert cli("gate", "remove", "low-battery").stdout.startswith("gate low-battery removed")
    assert json.loads(cli("gate", "list", "--json").stdout) == []


def test_metrics_show_numeric_attributes_and_gated_devices(phones: Fleet) -> None:
    import urllib.request

    from deviceq.services.metrics import parse_metrics, serve_metrics
    from harness import free_port

    f = phones
    f.admin.set_attributes("p1", {"model": "Pixel 8", "charging": True, "temperature": 31.5})
    add_gate(f.admin, "low", ["battery<20"])
    server = serve_metrics(f.admin, free_port(), lambda: True, addr="127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as r:
            samples = parse_metrics(r.read().decode())
    finally:
        server.stop()

    def value(name: str, **labels: str) -> float | None:
        return samples.get((name, tuple(sorted({"pool": f.pool, **labels}.items()))))

    assert value("deviceq_device_attribute", device="p1", attribute="battery") == 90
    assert value("deviceq_device_attribute", device="p1", attribute="temperature") == 31.5
    assert value("deviceq_device_attribute", device="p1", attribute="charging") == 1
    assert value("deviceq_device_attribute", device="p1", attribute="model") is None  # text
    assert value("deviceq_gated_devices", gate="low") == 2  # p2 (15) and w1 (5)


def test_the_dashboard_device_view_has_attributes_and_gate(phones: Fleet) -> None:
    from deviceq.dashboard.device_page import device_view

    f = phones
    add_gate(f.admin, "low", ["battery<20"])
    v = device_view(f.admin, "p2")
    assert v["state"] == "gated" and v["d"].gated == "low" and "low: battery 15" in v["why"]
    ((name, value, at, by),) = v["attributes"]
    assert (name, value, by) == ("battery", "15", "operator") and at and at > 1.6e12
