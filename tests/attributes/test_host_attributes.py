"""Attributes a host reports: from its devices file, `--discover adb` (a fake adb on PATH whose
battery changes), `--discover command:CMD` lines and a health check's JSON line; sent as
changes only, with the heartbeats (tests/attributes/test_heartbeat_attributes.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from deviceq.core.attributes import Version
from deviceq.core.errors import ConfigError, InvalidInput
from deviceq.host.attribute_sync import AttributeSync, attributes_in_output
from deviceq.host.device_config import DeviceConfig
from deviceq.host.device_lists import parse_adb_probe, parse_devices_text, parse_json_lines
from harness import Deployment, wait_for

PROBE = """34
Pixel 8
14.1.2
Current Battery Service state:
  AC powered: false
  USB powered: true
  status: 2
  level: 57
  scale: 100
  temperature: 312
"""


def test_adb_probe_output_gives_sdk_model_release_battery_and_temperature() -> None:
    assert parse_adb_probe(PROBE) == {"sdk": 34, "model": "Pixel 8",
                                      "release": Version((14, 1, 2)), "battery": 57,
                                      "temperature": 31.2}  # fmt: skip
    assert parse_adb_probe("\n\n\n") == {}
    assert parse_adb_probe('33\nweird"model\n13\n') == {"sdk": 33, "release": 13}


def test_devices_file_and_discovery_lines_carry_attributes() -> None:
    (dev,) = parse_devices_text(
        '[{"id": "p1", "driver_type": "android", "attributes": {"sdk": 34, "model": "P 8"}}]',
        "d.json",
    )
    assert dict(dev.attributes) == {"sdk": 34, "model": "P 8"}
    with pytest.raises(ConfigError, match="attribute"):
        parse_devices_text('[{"id": "p1", "driver_type": "a", "attributes": {"B": 1}}]', "d.json")
    devices, warnings = parse_json_lines(
        '{"id": "c1", "driver_type": "web", "attributes": {"browser": "chrome"}}\n'
        '{"id": "c2", "driver_type": "web", "attributes": {"x": [1]}}\n'
    )
    assert [dict(d.attributes) for d in devices] == [{"browser": "chrome"}]
    assert len(warnings) == 1 and "c2" in warnings[0]


def test_health_check_json_line() -> None:
    out = 'checking\n{"attributes": {"storage_gb": 12, "wear": "low"}}\nok\n'
    assert attributes_in_output(out) == {"storage_gb": 12, "wear": "low"}
    assert attributes_in_output("no json here\n{not json\n") is None
    with pytest.raises(InvalidInput):
        attributes_in_output('{"attributes": {"Bad": 1}}')


def test_reported_attributes_merge_the_check_and_are_encoded_once() -> None:
    sync = AttributeSync()
    devices = [DeviceConfig(f"p{i}", "android", attributes=(("battery", 50), ("sdk", 34)))
               for i in range(3)] + [DeviceConfig("bare", "android")]  # fmt: skip
    got = sync.reported(devices)
    assert got == {f"p{i}": {"battery": "n:50", "sdk": "n:34"} for i in range(3)}
    assert sync.reported(devices)["p0"] is got["p0"]  # (unchanged: not encoded again)
    sync.from_check("p1", {"battery": 12, "wear": "low"})  # a check's values win
    assert sync.reported(devices)["p1"] == {"battery": "n:12", "sdk": "n:34", "wear": "s:low"}
    devices[2] = devices[2].with_attributes({"battery": 49})
    assert sync.reported(devices)["p2"]["battery"] == "n:49"


FAKE_ADB = """#!/bin/sh
if [ "$1 $2" = "devices -l" ]; then cat "$FAKE_ADB_DIR/devices"; exit 0; fi
# adb -s SERIAL shell PROBE: the serial's own file
[ "$1" = "-s" ] && [ "$3" = "shell" ] || exit 64
cat "$FAKE_ADB_DIR/$2"
"""


def probe(sdk: int, model: str, battery: int) -> str:
    return f"{sdk}\n{model}\n14\nCurrent Battery Service state:\n  level: {battery}\n" \
           "  temperature: 300\n"  # fmt: skip


def test_a_host_daemon_reports_adb_attributes_and_follows_the_battery(
    deploy: Deployment, tmp_path: Path
) -> None:
    d = deploy
    fake = tmp_path / "adb-dir"
    bindir = tmp_path / "bin"
    fake.mkdir()
    bindir.mkdir()
    (bindir / "adb").write_text(FAKE_ADB)
    (bindir / "adb").chmod(0o755)
    (fake / "devices").write_text("List of devices attached\nS1 device model:Pixel_8\n"
                                  "S2 device model:Pixel_6\n")  # fmt: skip
    (fake / "S1").write_text(probe(34, "Pixel 8", 90))
    (fake / "S2").write_text(probe(31, "Pixel 6", 40))
    check = tmp_path / "check.sh"
    check.write_text('#!/bin/sh\necho \'{"attributes": {"wear": "low"}}\'\n')
    check.chmod(0o755)
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "FAKE_ADB_DIR": str(fake)}
    d.host("h1", env=env, extra=("--discover", "adb", "--discover-every", "0.3", "--command",
                                 "true", "--health-check", f"android={check}"))  # fmt: skip

    def attrs(did: str) -> dict[str, Any]:
        return d.admin.attributes([did])[did][0]

    wait_for(lambda: attrs("S1").get("battery") == 90 and "wear" in attrs("S1"), 20, "S1 read")
    assert attrs("S1") == {"sdk": 34, "model": "Pixel 8", "release": 14, "battery": 90,
                           "temperature": 30, "wear": "low"}  # fmt: skip
    assert attrs("S2")["sdk"] == 31
    (fake / "S2").write_text(probe(31, "Pixel 6", 12))
    wait_for(lambda: attrs("S2").get("battery") == 12, 20, "the new battery level")
    # an operator's attribute stays: the host only changes what it reports
    d.admin.set_attributes("S1", {"rack": "r2"})
    (fake / "S1").write_text(probe(34, "Pixel 8", 88))
    wait_for(lambda: attrs("S1").get("battery") == 88, 20, "S1's new level")
    assert attrs("S1")["rack"] == "r2"
    # an operator's value of an attribute the host reports wins until it is unset
    d.admin.set_attributes("S1", {"battery": 5})
    (fake / "S1").write_text(probe(34, "Pixel 8", 87))
    wait_for(lambda: d.r.hget(d.admin.keys.device_attrs_host("S1"), "battery") == "n:87", 20,
             "the host's value kept apart")  # fmt: skip
    assert attrs("S1")["battery"] == 5
    d.admin.unset_attributes("S1", ["battery"])
    assert attrs("S1")["battery"] == 87
