"""``deviceq reserve --where``: a person's reservation takes only a device whose attributes
satisfy the expressions, checked again atomically by ``device_reserve.lua`` (a device whose
attributes changed meanwhile is refused, the next one tried); a malformed expression is one
line, exit 2, nothing reserved; an attribute no device has warns."""

from __future__ import annotations

import json
from typing import Any

import pytest

from conftest import Fleet
from deviceq.core.errors import Busy, InvalidInput


@pytest.fixture
def lab(real_fleet: Fleet) -> Fleet:
    f = real_fleet
    f.add_host("h1", ("old", "android", ()), ("new", "android", ()))
    f.admin.set_attributes("old", {"sdk": 30})
    f.admin.set_attributes("new", {"sdk": 34})
    return f


def test_reserve_matching_where(lab: Fleet) -> None:
    f = lab
    r = f.admin.reserve_matching("android", (), 60_000, "alice", ["sdk>=33"])
    assert r.device_id == "new"
    with pytest.raises(Busy, match="sdk>=33"):
        f.admin.reserve_matching("android", (), 60_000, "bob", ["sdk>=33"])
    with pytest.raises(InvalidInput):
        f.admin.reserve_matching("android", (), 60_000, "bob", ["sdk >"])
    assert f.admin.reservation("old") is None


def test_the_script_checks_where_again(lab: Fleet) -> None:
    f = lab
    with pytest.raises(Busy, match="does not satisfy --where"):
        f.admin.reserve("old", 60_000, "alice", ["sdk>=33"])
    assert f.admin.reservation("old") is None
    assert f.admin.reserve("old", 60_000, "alice", ["sdk<33"]).device_id == "old"
    # the script refuses a malformed compiled form, and a where on extend/release
    with pytest.raises(InvalidInput):
        f.admin._run("device_reserve", ["reserve", "new", "60000", "x", "sdk\t>=\tn:abc"])
    with pytest.raises(InvalidInput):
        f.admin._run("device_reserve", ["extend", "old", "60000", "x", "sdk\t>=\tn:3"])
    assert f.admin.reservation("new") is None


def test_cli_reserve_where(lab: Fleet, cli: Any) -> None:
    out = cli("reserve", "--driver-type", "android", "--where", "sdk>=34", "--for", "1h",
              "--note", "carol", "--json")  # fmt: skip
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["device_id"] == "new"
    bad = cli("reserve", "--where", "sdk>>33", "--for", "1h", "--note", "x")
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.output
    typo = cli("reserve", "--where", "sdkk>1", "--for", "1h", "--note", "x")
    assert "no device has attribute 'sdkk'" in typo.stderr and typo.exit_code != 0
    assert lab.admin.reservation("old") is None
    mine = cli("reserve", "old", "--where", "sdk>=33", "--for", "1h", "--note", "x")
    assert mine.exit_code != 0 and "does not satisfy" in mine.output
