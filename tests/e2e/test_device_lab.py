"""The lab session of docs/how-to/device-attributes.md, replayed against real daemons: three
phones discovered through a fake ``adb`` on PATH, their battery falling; a gate holds the low
phone and lets it go after charging; ``--where 'sdk>=33'`` tasks land only on the right
phones; ``prefer max:battery`` gives a task the fullest phone."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from deviceq import TaskStatus
from deviceq.ops.verify import verify
from harness import Deployment, deviceq, wait_for

FAKE_ADB = """#!/bin/sh
# adb devices -l: the phones; adb -s SERIAL shell ...: that phone's getprop and dumpsys lines
if [ "$1 $2" = "devices -l" ]; then cat "$FAKE_ADB_DIR/devices"; exit 0; fi
[ "$1" = "-s" ] && [ "$3" = "shell" ] || exit 64
cat "$FAKE_ADB_DIR/$2"
"""


def phone(sdk: int, model: str, battery: int) -> str:
    return (f"{sdk}\n{model}\n{sdk - 20}\nCurrent Battery Service state:\n"
            f"  level: {battery}\n  temperature: 310\n")  # fmt: skip


def test_the_lab_session(deploy: Deployment, tmp_path: Path) -> None:
    d = deploy
    fake, bindir = tmp_path / "adb", tmp_path / "bin"
    fake.mkdir()
    bindir.mkdir()
    (bindir / "adb").write_text(FAKE_ADB)
    (bindir / "adb").chmod(0o755)
    (fake / "devices").write_text("List of devices attached\n"
                                  "P8 device model:Pixel_8\nP7 device model:Pixel_7\n"
                                  "P4 device model:Pixel_4\n")  # fmt: skip
    (fake / "P8").write_text(phone(34, "Pixel 8", 90))
    (fake / "P7").write_text(phone(33, "Pixel 7", 60))
    (fake / "P4").write_text(phone(30, "Pixel 4", 30))
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "FAKE_ADB_DIR": str(fake)}
    cli = lambda *a: deviceq(d.url, d.pool, *a)  # noqa: E731

    def attrs(did: str) -> dict[str, Any]:
        return d.admin.attributes([did])[did][0]

    def row(did: str) -> dict[str, Any]:
        out = cli("device", "list", "--json")
        return {r["device_id"]: r for r in json.loads(out.stdout)}[did]

    # the gate first: a phone under 20 % takes no new work until it is back at 80 %
    out = cli("gate", "add", "low-battery", "--when", "battery<20", "--until", "battery>=80")
    assert out.returncode == 0, out.stderr
    d.scheduler()
    d.host("h1", env=env, extra=("--discover", "adb", "--discover-every", "0.3",
                                 "--command", "sh -c 'echo ran on {device_id}'"))  # fmt: skip
    wait_for(lambda: all(attrs(p).get("battery") for p in ("P8", "P7", "P4")), 30, "read")
    listed = cli("device", "list", "--attr", "battery,sdk")
    assert "battery" in listed.stdout and "90" in listed.stdout
    # P4's battery falls: the gate holds it
    (fake / "P4").write_text(phone(30, "Pixel 4", 15))
    wait_for(lambda: row("P4")["effective_state"] == "gated", 30, "P4 gated")
    assert "low-battery: battery 15" in row("P4")["why"]
    # --where: only the SDK 33+ phones run these
    ids = [d.client.submit(f"t{i}", where=["sdk>=33"]) for i in range(4)]
    for t in ids:
        assert d.client.wait(t, timeout=30).status is TaskStatus.done
    assert {d.client.get(t).device_id for t in ids} <= {"P8", "P7"}
    # prefer max:battery: a task gets the fullest phone
    assert cli("config", "set", "prefer", "max:battery").returncode == 0
    (fake / "P7").write_text(phone(33, "Pixel 7", 95))
    wait_for(lambda: attrs("P7")["battery"] == 95, 30, "P7 charged")
    t = d.client.submit("fullest first", driver_type="android")
    assert d.client.wait(t, timeout=30).device_id == "P7"
    # P4 charges: still held at 50 %, let go at 85 %
    (fake / "P4").write_text(phone(30, "Pixel 4", 50))
    wait_for(lambda: "battery 50" in (row("P4")["why"] or ""), 30, "P4 charging")
    assert row("P4")["effective_state"] == "gated"
    (fake / "P4").write_text(phone(30, "Pixel 4", 85))
    wait_for(lambda: row("P4")["effective_state"] == "idle", 30, "P4 back")
    types = [e.get("type") for _, e in d.r.xrange(d.admin.keys.events)]
    assert types.count("device_gated") == 1 and types.count("device_ungated") == 1
    p4 = d.admin.device("P4")
    assert not p4.quarantined and p4.consecutive_failures == 0
    assert verify(d.admin).ok
