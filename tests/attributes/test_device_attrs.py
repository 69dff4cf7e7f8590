"""Device attributes in Redis: set and unset by an operator (API and CLI) and by the owning
host, checked before anything is written, listed, filtered and shown."""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import Fleet
from deviceq import HostClient
from deviceq.core.attributes import Version
from deviceq.core.errors import DeviceOwned, InvalidInput, NotFound


@pytest.fixture
def phones(real_fleet: Fleet) -> Fleet:
    real_fleet.add_host("h1", ("p1", "android", ("wifi",)), ("p2", "android", ()))
    real_fleet.add_host("h2", ("p3", "android", ()))
    return real_fleet


def attrs(fleet: Fleet, device: str) -> dict[str, Any]:
    return fleet.admin.attributes([device])[device][0]


def test_operator_sets_typed_attributes_and_unsets_them(phones: Fleet) -> None:
    a = phones.admin
    assert a.set_attributes("p1", {"sdk": 34, "model": "Pixel 8", "release": "14.1.2"})
    assert attrs(phones, "p1") == {"sdk": 34, "model": "Pixel 8", "release": Version((14, 1, 2))}
    assert not a.set_attributes("p1", {"sdk": 34})  # same value: no change
    assert phones.r.hget(a.keys.device_attrs("p1"), "release") == "v:14.1.2"
    _, times = a.attributes(["p1"], with_times=True)["p1"]
    assert set(times) == {"sdk", "model", "release"} and min(times.values()) > 1.6e12
    assert a.unset_attributes("p1", ["model", "nosuch"])
    assert not a.unset_attributes("p1", ["nosuch"])
    assert attrs(phones, "p1") == {"sdk": 34, "release": Version((14, 1, 2))}


def test_bad_attributes_change_nothing(phones: Fleet) -> None:
    a = phones.admin
    a.set_attributes("p1", {f"k{i}": i for i in range(30)})
    before = attrs(phones, "p1")
    with pytest.raises(InvalidInput, match="more than 32"):
        a.set_attributes("p1", {"x1": 1, "x2": 2, "x3": 3})
    with pytest.raises(NotFound):
        a.set_attributes("ghost", {"x": 1})
    with pytest.raises(InvalidInput):
        a.set_attributes("p1", {"Bad": 1})
    assert attrs(phones, "p1") == before
    # the script refuses what Python would have refused, before writing anything
    for bad in (["p1", "1", "0", "k1", "n:nan"], ["p1", "1", "0", "k1", "s:a\nb"],
                ["p1", "1", "0", "k1", "v:1..2"], ["p1", "1", "0", "K", "n:1"],
                ["p1", "2", "0", "k1", "n:1"], ["p1", "1", "0", "k1", 'n:1', "p9"]):  # fmt: skip
        with pytest.raises(InvalidInput):
            a._run("device_attrs", ["op", "", *bad])
    assert attrs(phones, "p1") == before


def test_a_host_sets_only_its_own_devices(phones: Fleet) -> None:
    h1 = phones.host("h1")
    assert h1.send_attributes({"p1": ({"battery": 80}, ()), "p2": ({"battery": 15}, ())}) == 2
    assert attrs(phones, "p2") == {"battery": 15}
    with pytest.raises(DeviceOwned):
        h1.send_attributes({"p1": ({"battery": 1}, ()), "p3": ({"battery": 1}, ())})
    assert attrs(phones, "p1") == {"battery": 80}  # nothing of the refused call was written
    wrong = HostClient(phones.r, phones.pool, "h1", "x" * 32)
    with pytest.raises(Exception, match="token"):
        wrong.send_attributes({"p1": ({"battery": 1}, ())})


def test_cli_set_list_where_and_show(phones: Fleet, cli: Any) -> None:
    assert cli("device", "set-attr", "p1", "sdk=34", 'model="Pixel 8"', "battery=80").exit_code == 0
    assert cli("device", "set-attr", "p2", "sdk=33", "battery=15").exit_code == 0
    assert cli("device", "set-attr", "p3", "sdk=30").exit_code == 0
    out = cli("device", "list", "--where", "sdk>=33", "--json")
    assert out.exit_code == 0, out.output
    rows = json.loads(out.stdout)
    assert sorted(r["device_id"] for r in rows) == ["p1", "p2"]
    assert rows[0]["attributes"] == {"battery": 80, "model": "Pixel 8", "sdk": 34}
    both = cli("device", "list", "--where", "sdk>=33", "--where", "battery>=50", "--json")
    assert [r["device_id"] for r in json.loads(both.stdout)] == ["p1"]
    table = cli("device", "list", "--attr", "battery,sdk")
    assert table.exit_code == 0 and "battery" in table.stdout and "80" in table.stdout
    show = cli("device", "show", "p1")
    assert "model" in show.stdout and "Pixel 8" in show.stdout
    assert "set by operator" in show.stdout  # (set-attr: an operator's)
    shown = json.loads(cli("device", "show", "p1", "--json").stdout)
    assert shown["attributes"]["sdk"] == 34 and shown["attributes_at"]["sdk"] > 1.6e12
    assert shown["attributes_by"]["sdk"] == "operator"
    typo = cli("device", "list", "--where", "sdkk>=3")
    assert "no device has attribute 'sdkk'" in typo.stderr
    assert cli("device", "unset-attr", "p1", "model").exit_code == 0
    assert "model" not in attrs(phones, "p1")


@pytest.mark.parametrize(
    "args",
    [("device", "set-attr", "p1", "sdk"), ("device", "set-attr", "p1", "Bad=1"),
     ("device", "set-attr", "p1", 'x=a"b'), ("device", "unset-attr", "p1", "B-d"),
     ("device", "list", "--where", "sdk >"), ("device", "list", "--attr", "Bat")],
)  # fmt: skip
def test_cli_bad_input_is_one_line_exit_2(phones: Fleet, cli: Any, args: tuple[str, ...]) -> None:
    res = cli(*args)
    assert res.exit_code == 2, res.output
    assert len(res.stderr.strip().splitlines()) == 1
    assert attrs(phones, "p1") == {}
