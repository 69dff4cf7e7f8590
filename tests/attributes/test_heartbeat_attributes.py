"""Device attributes ride on the heartbeat's device rows (``lua/heartbeat.lua``, field
``attrs``): a delta carries only the attributes that changed (a device whose attributes
changed even when its state did not; an unchanged attribute costs nothing), a full snapshot
carries them all (those the host reported before and leaves out are removed). An operator's
value wins over the host's until the operator unsets it; gates follow what a heartbeat
reports; a malformed entry changes nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from conftest import Fleet
from deviceq.core.errors import InvalidInput
from deviceq.host.heartbeat_sync import Reply, Row, attrs_delta, attrs_text
from deviceq.host.link import DeviceReport
from deviceq.host.redis_link import HostClient
from deviceq.ops.gates import add_gate

N = 200


class Recording:
    """Records each heartbeat call's mode and rows (then makes the call)."""

    def __init__(self, h: HostClient) -> None:
        self.calls: list[tuple[str, list[Row]]] = []
        real = h.heartbeat_call

        def call(mode: str, ver: str, arg: str, total: int, rows: Sequence[Row]) -> Reply:
            self.calls.append((mode, list(rows)))
            return real(mode, ver, arg, total, rows)

        h.heartbeat_call = call  # type: ignore[method-assign]

    def rows(self) -> list[Row]:
        out = [r for _, rows in self.calls for r in rows]
        self.calls.clear()
        return out


@pytest.fixture
def lab(real_fleet: Fleet) -> tuple[Fleet, HostClient, list[DeviceReport], Recording]:
    reports = [DeviceReport(f"p{i}", "android") for i in range(N)]
    h = real_fleet.add_host("h1", *((r.device_id, "android", ()) for r in reports))
    return real_fleet, h, reports, Recording(h)


def battery(n: int) -> dict[str, dict[str, object]]:
    return {f"p{i}": {"battery": 50, "sdk": 34} for i in range(n)}


def attrs(f: Fleet, did: str) -> dict[str, Any]:
    return f.admin.attributes([did])[did][0]


def test_the_text_of_a_change() -> None:
    assert attrs_text({"battery": "n:49", "model": "s:Pixel 8"}, ["gps"]) == (
        "battery=n:49\nmodel=s:Pixel 8\n-gps"
    )
    assert attrs_delta({"a": "n:1"}, {"a": "n:1"}) is None
    assert attrs_delta({"a": "n:2", "b": "b:1"}, {"a": "n:1", "c": "n:3"}) == "a=n:2\nb=b:1\n-c"


def test_a_delta_carries_only_the_attributes_that_changed(lab: Any) -> None:
    f, h, reports, rec = lab
    h.heartbeat(reports, attributes=battery(N))
    rows = rec.rows()
    assert len(rows) == N and {r[5] for r in rows} == {"battery=n:50\nsdk=n:34"}
    assert attrs(f, "p3") == {"battery": 50, "sdk": 34}
    assert f.r.hget(f.admin.keys.attr_names, "battery") == str(N)
    h.heartbeat(reports, attributes=battery(N))  # nothing changed: no row
    assert [rows for _, rows in rec.calls] == [[]]
    rec.calls.clear()
    changed = battery(N)
    changed["p7"] = {"battery": 49, "sdk": 34}
    changed["p8"] = {"sdk": 34}
    h.heartbeat(reports, attributes=changed)
    rows = rec.rows()
    assert sorted((r[0], r[5]) for r in rows) == [("p7", "battery=n:49"), ("p8", "-battery")]
    assert rows[0][1:5] == ("android", "", "idle", "")  # (the state rides along unchanged)
    assert attrs(f, "p7")["battery"] == 49 and attrs(f, "p8") == {"sdk": 34}
    assert f.r.hget(f.admin.keys.attr_names, "battery") == str(N - 1)
    _, times = f.admin.attributes(["p7"], with_times=True)["p7"]
    assert set(times) == {"battery", "sdk"}


def test_a_full_snapshot_carries_every_attribute_and_drops_the_rest(lab: Any) -> None:
    f, h, reports, rec = lab
    h.heartbeat(reports, attributes=battery(N))
    f.admin.set_attributes("p1", {"rack": "r2"})  # an operator's: stays
    rec.rows()
    now = battery(N)
    now["p1"] = {"sdk": 35}
    del now["p2"]
    h.heartbeat(reports, full=True, attributes=now)
    rows = rec.rows()
    assert len(rows) == N and {r[0]: r[5] for r in rows}["p2"] == ""
    assert attrs(f, "p1") == {"sdk": 35, "rack": "r2"} and attrs(f, "p2") == {}
    assert attrs(f, "p3") == {"battery": 50, "sdk": 34}


def test_an_operator_value_wins_until_it_is_unset(lab: Any) -> None:
    f, h, reports, _ = lab
    h.heartbeat(reports, attributes=battery(N))
    f.admin.set_attributes("p1", {"battery": 5})
    assert attrs(f, "p1")["battery"] == 5
    now = battery(N)
    now["p1"] = {"battery": 60, "sdk": 34}
    h.heartbeat(reports, attributes=now)
    assert attrs(f, "p1")["battery"] == 5  # the operator's
    assert f.r.hget(f.admin.keys.device_attrs_host("p1"), "battery") == "n:60"
    f.admin.unset_attributes("p1", ["battery"])
    assert attrs(f, "p1")["battery"] == 60  # the host's comes back
    assert f.r.exists(f.admin.keys.device_attrs_host("p1")) == 0
    f.admin.unset_attributes("p3", ["battery"])  # a host's value an operator removes: gone
    assert "battery" not in attrs(f, "p3")


def test_a_heartbeat_gates_and_releases_a_device(lab: Any) -> None:
    f, h, reports, _ = lab
    add_gate(f.admin, "low", ["battery<20"], ["battery>=80"])
    hb = h.heartbeat(reports, attributes=battery(N))
    assert hb.idle == N
    now = battery(N)
    now["p4"] = {"battery": 12}
    hb = h.heartbeat(reports, attributes=now)
    d = f.admin.device("p4")
    assert (d.gated, d.gated_reason) == ("low", "battery 12")
    assert hb.idle == N - 1 and f.r.zscore(f.admin.keys.idle, "p4") is None
    now["p4"] = {"battery": 50}  # above when, below until: still held
    assert h.heartbeat(reports, attributes=now).idle == N - 1
    now["p4"] = {"battery": 85}
    hb = h.heartbeat(reports, attributes=now)
    assert f.admin.device("p4").gated is None and hb.idle == N
    assert f.r.zscore(f.admin.keys.idle, "p4") is not None


def test_a_malformed_or_oversized_entry_changes_nothing(lab: Any) -> None:
    f, h, reports, _ = lab
    rows: list[Row] = [("p1", "android", "", "idle", "", "battery=n:1"),
                       ("p2", "android", "", "idle", "", "Bad=n:1")]  # fmt: skip
    for bad in ("Bad=n:1", "battery=x:1", "battery", "a=n:1\na=n:2", "s=s:\x01"):
        rows[1] = ("p2", "android", "", "idle", "", bad)
        with pytest.raises(InvalidInput):
            h.heartbeat_call("full", "sync1", "first", 0, rows)
    assert attrs(f, "p1") == {}
    many = {f"a{i}": i for i in range(32)}
    h.heartbeat(reports, attributes={"p1": many})
    assert len(attrs(f, "p1")) == 32
    f.admin.set_attributes("p2", {"rack": "r1"})
    h.heartbeat(reports, full=True, attributes={"p1": many})  # 32: still fine
    with pytest.raises(InvalidInput, match="more than 32"):  # p2: 32 and the operator's
        h.heartbeat(reports, attributes={"p1": {}, "p2": many})
    assert len(attrs(f, "p1")) == 32 and attrs(f, "p2") == {"rack": "r1"}


def test_a_daemon_whose_attributes_are_refused_keeps_heartbeating(real_fleet: Fleet) -> None:
    """Redis refusing a host's attributes (a device would end with more than 32 with an
    operator's) refuses no heartbeat: the daemon heartbeats without them, logged, for a
    while, then tries them again."""
    from deviceq.host.device_config import DeviceConfig
    from deviceq.host.runners import RunnerSpec
    from deviceq.host.settings import WorkerSettings
    from deviceq.host.state import HostState
    from deviceq.host.upkeep import Upkeep

    f = real_fleet
    many = tuple((f"a{i}", i) for i in range(32))
    devices = [DeviceConfig("p1", "android", attributes=many), DeviceConfig("p2", "android")]
    settings = WorkerSettings(host_id="h1", devices=devices, goal_runner=RunnerSpec("sim"))
    h = f.add_host("h1", ("p1", "android", ()), ("p2", "android", ()))
    f.admin.set_attributes("p1", {"rack": "r1"})
    state = HostState(settings)
    upkeep = Upkeep(state, h, h)
    hb = upkeep.beat_with_attributes(state.snapshot())
    assert hb.devices == 2 and upkeep.attrs_paused_until > 0
    assert attrs(f, "p1") == {"rack": "r1"}
    f.admin.unset_attributes("p1", ["rack"])
    upkeep.attrs_paused_until = 0.0  # (the pause is over)
    upkeep.beat_with_attributes(state.snapshot())
    assert len(attrs(f, "p1")) == 32
