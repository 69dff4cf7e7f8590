"""Devices that change while a host daemon runs: ``host run --devices-file FILE`` (re-read on
SIGHUP and when it changes) and discovery (``--discover adb``, ``--discover command:CMD``).
The parsers are tested on recorded outputs; the end-to-end tests run real host and scheduler
daemons on real Redis, with a fake ``adb`` on PATH printing what the test wrote."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from deviceq import PoolAdmin, TaskStatus
from deviceq.core.errors import ConfigError
from deviceq.host.device_config import DeviceConfig
from deviceq.host.device_lists import (
    device_id_for_serial,
    parse_adb_devices,
    parse_devices_text,
    parse_json_lines,
)
from deviceq.host.device_sources import DeviceSources, DiscoverySpec
from deviceq.ops.verify import verify
from harness import Deployment, deviceq, live_group_members, wait_for

ADB_OUTPUT = """\
* daemon not running; starting now at tcp:5037
* daemon started successfully
List of devices attached
emulator-5554          device product:sdk_gphone64_x86_64 model:sdk_gphone64_x86_64 device:emu64xa transport_id:1
192.168.1.5:5555       device product:panther model:Pixel_7 device:panther transport_id:3
R5CT1234ABC            unauthorized usb:1-1 transport_id:4
0123456789ABCDEF       offline transport_id:5
adb-R5CT.._adb-tls-connect._tcp device product:x model:odd(model)name device:y transport_id:6
"""  # noqa: E501


# -- parsers -------------------------------------------------------------------------------------
def test_adb_output_gives_one_android_device_per_serial_in_state_device() -> None:
    devices, warnings = parse_adb_devices(ADB_OUTPUT)
    got = {d.device_id: (d.driver_type, d.tags, d.serial) for d in devices}
    assert got == {
        "emulator-5554": ("android", ("device=emu64xa", "model=sdk_gphone64_x86_64",
                                      "product=sdk_gphone64_x86_64"), "emulator-5554"),
        "192.168.1.5-5555": ("android", ("device=panther", "model=Pixel_7", "product=panther"),
                             "192.168.1.5:5555"),
        "adb-R5CT.._adb-tls-connect._tcp": (
            "android", ("device=y", "model=odd_model_name", "product=x"),
            "adb-R5CT.._adb-tls-connect._tcp"),
    }  # fmt: skip
    assert warnings == []  # unauthorized and offline devices: not usable (listed offline below)
    spec = DiscoverySpec.parse("adb")
    listed, _ = spec.parse_output(ADB_OUTPUT)
    offline = {d.device_id: (d.state.value, d.reason) for d in listed if d.state.value != "idle"}
    until = "not usable until adb lists it as device"
    assert offline == {
        "R5CT1234ABC": ("offline", f"adb state unauthorized: {until}"),
        "0123456789ABCDEF": ("offline", f"adb state offline: {until}"),
    }


def test_adb_serials_that_are_no_id_map_to_one_deterministically_and_bad_ones_are_named() -> None:
    assert device_id_for_serial("192.168.1.5:5555") == "192.168.1.5-5555"
    assert device_id_for_serial("emulator-5554") == "emulator-5554"
    assert device_id_for_serial("usb:1-1") == "usb-1-1"
    long = "a:" + "x" * 200
    first = device_id_for_serial(long)
    assert first == device_id_for_serial(long) and len(first) == 128
    assert first != device_id_for_serial("a:" + "x" * 199 + "y")
    devices, warnings = parse_adb_devices(
        "List of devices attached\nbad$(rm) device model:m\n1.2.3.4:5 device\n1.2.3.4-5 device\n"
        "lonely\n"
    )
    assert [(d.device_id, d.serial) for d in devices] == [("1.2.3.4-5", "1.2.3.4:5")]
    assert len(warnings) == 3
    assert "bad$(rm)" in warnings[0] and "invalid serial" in warnings[0]
    assert "map to the same id 1.2.3.4-5" in warnings[1]
    assert "unexpected line 'lonely'" in warnings[2]


def test_json_lines_skip_each_bad_line_with_a_warning_naming_it() -> None:
    text = "\n".join([
        '{"id": "d1", "driver_type": "x", "tags": ["b", "a"]}',
        "not json",
        '{"id": "b@d", "driver_type": "x"}',
        '["d2", "x"]',
        '{"id": "d3", "driver_type": "x", "colour": "red"}',
        '{"id": "d4", "driver_type": "x", "serial": "10.0.0.1:5555"}',
        '{"id": "d1", "driver_type": "y"}',
        "",
    ])  # fmt: skip
    devices, warnings = parse_json_lines(text, "--discover command:x")
    assert [(d.device_id, d.tags, d.serial) for d in devices] == [
        ("d1", ("a", "b"), ""), ("d4", (), "10.0.0.1:5555")]  # fmt: skip
    assert [w.split(" skipped")[0].split(": ", 1)[1][:7] for w in warnings[:4]] == [
        "line 2 ", "line 3 ", "line 4 ", "line 5 "]  # fmt: skip
    assert "invalid device id 'b@d'" in warnings[1] and "colour" in warnings[3]
    assert "line 7: device d1 is listed twice" in warnings[4]
    assert all(w.startswith("--discover command:x: ") for w in warnings)


def test_a_devices_file_holds_texts_or_mappings_and_a_bad_one_is_one_clear_error() -> None:
    devs = parse_devices_text("- d1:x:a,b\n- {id: d2, driver_type: y, tags: [c]}\n", "f.yaml")
    assert [(d.device_id, d.driver_type, d.tags) for d in devs] == [
        ("d1", "x", ("a", "b")), ("d2", "y", ("c",))]  # fmt: skip
    assert parse_devices_text('[{"id": "d1", "driver_type": "x"}]', "f.json")[0].device_id == "d1"
    assert parse_devices_text("", "f.yaml") == []
    for text, msg in [
        ("{a: 1}", "must hold a list"),
        ("- d1\n", "device 1: bad device"),
        ("- d1:x\n- d1:y\n", "device d1 is listed twice"),
        ("- {id: d1, driver_type: x, tags: ['b ad']}\n", "invalid tag"),
        ("- [unclosed\n", "not valid YAML/JSON"),
        ("- {id: d1, driver_type: x, serial: 'a b'}\n", "invalid serial"),
    ]:
        with pytest.raises(ConfigError) as exc:
            parse_devices_text(text, "f.yaml")
        assert msg in str(exc.value) and "\n" not in str(exc.value), (text, exc.value)


def test_sources_keep_the_last_good_file_and_log_why(tmp_path: Path) -> None:
    f = tmp_path / "devices.yaml"
    f.write_text("- d1:x\n")
    logged: list[str] = []
    src = DeviceSources([DeviceConfig("s1", "x")], str(f), log=lambda lvl, msg: logged.append(msg))
    assert [d.device_id for d in src.poll()] == ["s1", "d1"]
    f.write_text("- d1:x\n- d2:x:t\n")
    assert [d.device_id for d in src.poll()] == ["s1", "d1", "d2"]
    f.write_text("- d1:x\n- b@d:x\n")
    assert [d.device_id for d in src.poll()] == ["s1", "d1", "d2"]
    assert len(logged) == 1 and "invalid device id 'b@d'" in logged[0]
    assert "keeping the last good device list" in logged[0]
    f.write_text("- s1:x\n")  # a duplicate of a --device: the whole file is refused
    assert [d.device_id for d in src.poll()] == ["s1", "d1", "d2"]
    assert "device s1 is also given by --device" in logged[-1]
    f.unlink()
    assert [d.device_id for d in src.poll()] == ["s1", "d1", "d2"]
    assert "cannot read devices file" in logged[-1]
    f.write_text("[]")
    assert [d.device_id for d in src.poll()] == ["s1"]
    with pytest.raises(ConfigError, match="given by --device and in the devices file"):
        f.write_text("- s1:x\n")
        DeviceSources([DeviceConfig("s1", "x")], str(f))


def test_a_failing_discovery_keeps_its_last_good_list(tmp_path: Path) -> None:
    out = tmp_path / "out"
    script = tmp_path / "disc"
    script.write_text(f"#!/bin/sh\ncat {out} || exit 3\n")
    script.chmod(0o755)
    logged: list[str] = []
    t = [0.0]
    src = DeviceSources([], None, [DiscoverySpec.parse(f"command:{script}")], 5.0,
                        log=lambda lvl, msg: logged.append(msg), clock=lambda: t[0])  # fmt: skip
    out.write_text('{"id": "d1", "driver_type": "x"}\n')
    assert [d.device_id for d in src.poll()] == ["d1"]
    out.unlink()
    t[0] = 5.0
    assert [d.device_id for d in src.poll()] == ["d1"]
    assert len(logged) == 1 and "exit code 3" in logged[0] and "last good" in logged[0]
    t[0] = 10.0
    src.poll()
    assert len(logged) == 1, "the same failure is logged once, not at every poll"
    out.write_text('{"id": "d2", "driver_type": "x"}\n')
    t[0] = 12.0
    assert [d.device_id for d in src.poll()] == ["d1"], "not due yet"
    src.request_reload()
    assert [d.device_id for d in src.poll()] == ["d2"]
    for bad in ("nope", "command:", "command:'x"):
        with pytest.raises(ConfigError, match="bad --discover"):
            DiscoverySpec.parse(bad)


def test_bad_device_sources_at_start_exit_2_in_one_line_and_register_nothing(
    redis_url: str, pool: str, tmp_path: Path
) -> None:
    f = tmp_path / "devices.yaml"
    base = ["host", "run", "--host-id", "h1", "--token", "t" * 32, "--command", "true"]
    for content, extra, msg in [
        ("- b@d:x\n", (), "invalid device id 'b@d'"),
        ("- d1:x\n", ("--device", "d1:x"), "given by --device and in the devices file"),
        ("{a: 1}", (), "must hold a list"),
        (None, (), "cannot read devices file"),
    ]:
        if content is None:
            f.unlink(missing_ok=True)
        else:
            f.write_text(content)
        out = deviceq(redis_url, pool, *base, "--devices-file", str(f), *extra)
        assert out.returncode == 2, (content, out.stderr)
        assert msg in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    out = deviceq(redis_url, pool, *base, "--discover", "nope")
    assert out.returncode == 2 and "use adb or command:CMD" in out.stderr
    r = PoolAdmin(redis_url, pool).redis
    assert not list(r.scan_iter(match=f"dq:{{{pool}}}:*"))


# -- end to end ----------------------------------------------------------------------------------
def device(admin: PoolAdmin, did: str) -> dict[str, Any]:
    return dict(admin.redis.hgetall(admin.keys.device(did)))  # type: ignore[arg-type]


def served(admin: PoolAdmin, did: str) -> bool:
    return device(admin, did).get("state") == "idle"


def rewrite(path: Path, text: str, *, keep_stamp: bool = False) -> None:
    """Write ``text``; with ``keep_stamp`` the file keeps its size and mtime (only a SIGHUP
    makes the daemon read it again)."""
    st = path.stat() if keep_stamp else None
    if st is not None:
        assert len(text.encode()) == st.st_size
    path.write_text(text)
    if st is not None:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_devices_file_add_retag_and_remove_while_running(
    deploy: Deployment, cli: Any, tmp_path: Path
) -> None:
    d = deploy
    d.configure(lease_ttl=30, claim_ttl=30)  # a hand-back must be a release, not an expiry
    f = tmp_path / "devices.yaml"
    f.write_text("- d1:x\n")
    d.scheduler()
    h = d.command_host("h1", extra=("--devices-file", str(f), "--stop-grace", "1"))
    wait_for(lambda: served(d.admin, "d1"), 20, "d1 served")
    # added: it appears idle and takes a task (only it has the tag)
    rewrite(f, "- d1:x\n- d2:x:camera\n")
    wait_for(lambda: served(d.admin, "d2"), 20, "d2 served")
    tid = d.client.submit("echo on $DEVICEQ_DEVICE_ID", driver_type="x", tags=["camera"])
    t = d.client.wait(tid, timeout=30)
    assert (t.status, t.device_id, t.result) == (TaskStatus.done, "d2", "on d2\n")
    # retagged: device show has the new tags
    rewrite(f, "- d1:x\n- d2:x:wifi,lab\n")
    wait_for(lambda: json.loads(cli("device", "show", "d2", "--json").stdout)["tags"]
             == ["lab", "wifi"], 20, "d2 retagged")  # fmt: skip
    # removed while it runs a long task: the run is stopped, the task handed back
    pidfile = tmp_path / "pid"
    goal = f"[ -e {pidfile} ] && {{ echo again; exit 0; }}; echo $$ > {pidfile}; exec sleep 60"
    tid = d.client.submit(goal, driver_type="x", tags=["wifi"])
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 20, "task running on d2")
    pgid = int(pidfile.read_text())
    assert d.client.get(tid).device_id == "d2"
    rewrite(f, "- d1:x:aaaa\n")
    wait_for(lambda: d.client.get(tid).status is TaskStatus.queued, 20, "task handed back")
    t = d.client.get(tid)
    assert [(a.device_id, a.outcome) for a in t.attempts] == [("d2", "released")]
    assert t.attempt == 1, "a hand-back spends no attempt"
    wait_for(lambda: live_group_members(pgid) == [], 10, "runner gone")
    wait_for(lambda: device(d.admin, "d2").get("state") == "offline", 20, "d2 offline")
    assert not device(d.admin, "d2").get("reserved_by")
    assert "device removed: stopping its run, handing the task back" in d.log("h1")
    wait_for(lambda: device(d.admin, "d1").get("tags") == "aaaa", 20, "d1 retagged")
    # SIGHUP: a change the poller cannot see (same size and mtime) is read; the task runs on d1
    rewrite(f, "- d1:x:wifi\n", keep_stamp=True)
    assert device(d.admin, "d1").get("tags") == "aaaa"
    h.send_signal(signal.SIGHUP)
    t = d.client.wait(tid, timeout=30)
    assert (t.status, t.device_id, t.result) == (TaskStatus.done, "d1", "again\n")
    assert [(a.device_id, a.outcome) for a in t.attempts] == [("d2", "released"), ("d1", "done")]
    assert "SIGHUP: reading the device sources again" in d.log("h1")
    assert h.poll() is None, "SIGHUP must not end the daemon"
    # a file that becomes invalid: one warning, the last good list stays
    f.write_text("- d1:x:wifi\n- b@d:x\n")
    wait_for(lambda: "invalid device id 'b@d'" in d.log("h1"), 20, "warning logged")
    assert d.log("h1").count("invalid device id 'b@d'") == 1
    assert served(d.admin, "d1") and device(d.admin, "d1")["tags"] == "wifi"
    assert verify(d.admin).ok


def test_a_removed_device_is_not_given_new_work_and_comes_back_when_listed_again(
    deploy: Deployment, tmp_path: Path
) -> None:
    d = deploy
    f = tmp_path / "devices.json"
    f.write_text('["d1:x", "d2:y"]')
    d.scheduler()
    d.command_host("h1", extra=("--devices-file", str(f)))
    wait_for(lambda: served(d.admin, "d1") and served(d.admin, "d2"), 20, "devices served")
    f.write_text('["d1:x"]')
    wait_for(lambda: device(d.admin, "d2").get("state") == "offline", 20, "d2 offline")
    tid = d.client.submit("echo hi", driver_type="y")
    assert d.client.get(tid).status is TaskStatus.queued
    f.write_text('["d1:x", {"id": "d2", "driver_type": "y"}]')
    t = d.client.wait(tid, timeout=30)
    assert (t.status, t.device_id) == (TaskStatus.done, "d2")
    assert verify(d.admin).ok


FAKE_ADB = """#!/bin/sh
[ "$1 $2" = "devices -l" ] || exit 64
cat "$FAKE_ADB_OUT"
"""


def test_adb_discovery_devices_appear_and_disappear_and_runners_see_the_serial(
    deploy: Deployment, tmp_path: Path
) -> None:
    d = deploy
    d.configure(lease_ttl=30, claim_ttl=30)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "adb").write_text(FAKE_ADB)
    (bindir / "adb").chmod(0o755)
    out = tmp_path / "adb-out"
    out.write_text("List of devices attached\n"
                   "192.168.1.5:5555 device product:panther model:Pixel_7 device:panther\n"
                   "emulator-5554 offline\n")  # fmt: skip
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "FAKE_ADB_OUT": str(out)}
    d.scheduler()
    d.host("h1", env=env, extra=(
        "--discover", "adb", "--discover-every", "0.3", "--stop-grace", "1",
        "--command", "sh -c 'echo serial={serial} env=$ANDROID_SERIAL id={device_id}'",
    ))  # fmt: skip
    wait_for(lambda: served(d.admin, "192.168.1.5-5555"), 20, "discovered device served")
    dev = device(d.admin, "192.168.1.5-5555")
    assert dev["driver_type"] == "android"
    assert dev["tags"] == "device=panther,model=Pixel_7,product=panther"
    # an offline serial is listed, offline, with its adb state (never dropped without a word)
    wait_for(lambda: device(d.admin, "emulator-5554"), 20, "the offline serial listed")
    off = device(d.admin, "emulator-5554")
    assert off["state"] == "offline" and "adb state offline" in off["reason"], off
    listed = deviceq(d.url, d.pool, "device", "list", "--state", "offline")
    assert "emulator-5554" in listed.stdout and "adb state" in " ".join(listed.stdout.split())
    tid = d.client.submit("x", driver_type="android")
    t = d.client.wait(tid, timeout=30)
    assert t.status is TaskStatus.done
    assert t.result == "serial=192.168.1.5:5555 env=192.168.1.5:5555 id=192.168.1.5-5555\n"
    # the emulator comes up; the phone disappears
    out.write_text("List of devices attached\nemulator-5554 device model:sdk device:emu\n")
    wait_for(lambda: served(d.admin, "emulator-5554"), 20, "emulator served")
    wait_for(lambda: device(d.admin, "192.168.1.5-5555")["state"] == "offline", 20, "gone")
    # adb failing: logged, the last list stays
    (bindir / "adb").write_text("#!/bin/sh\necho adb broke >&2\nexit 1\n")
    wait_for(lambda: "exit code 1: adb broke" in d.log("h1"), 20, "failure logged")
    assert served(d.admin, "emulator-5554")
    assert verify(d.admin).ok


def test_command_discovery_follows_the_output_and_hands_back_a_vanished_devices_task(
    deploy: Deployment, tmp_path: Path
) -> None:
    d = deploy
    d.configure(lease_ttl=30, claim_ttl=30)
    out = tmp_path / "found"
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {out}\n")
    script.chmod(0o755)
    out.write_text('{"id": "c1", "driver_type": "x", "tags": ["t"], "serial": "usb:1-1"}\n'
                   "garbage line\n")  # fmt: skip
    d.scheduler()
    d.command_host(
        "h1",
        "s1:y",
        extra=("--discover", f"command:{script}", "--discover-every", "0.3", "--stop-grace", "1"),
    )
    wait_for(lambda: served(d.admin, "c1"), 20, "discovered device served")
    assert device(d.admin, "c1")["tags"] == "t" and served(d.admin, "s1")
    assert "line 2 'garbage line' skipped" in d.log("h1")
    pidfile = tmp_path / "pid"
    tid = d.client.submit(f"echo $ANDROID_SERIAL > {pidfile}.serial; echo $$ > {pidfile}; "
                          "exec sleep 60", driver_type="x")  # fmt: skip
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 20, "task running")
    assert Path(f"{pidfile}.serial").read_text() == "usb:1-1\n"
    pgid = int(pidfile.read_text())
    out.write_text("")
    wait_for(lambda: d.client.get(tid).status is TaskStatus.queued, 20, "task handed back")
    assert [a.outcome for a in d.client.get(tid).attempts] == ["released"]
    wait_for(lambda: live_group_members(pgid) == [], 10, "runner gone")
    wait_for(lambda: device(d.admin, "c1")["state"] == "offline", 20, "c1 offline")
    assert served(d.admin, "s1"), "the --device device stays"
    d.client.cancel(tid)
    assert verify(d.admin).ok


def test_a_discovered_device_joins_after_its_health_check(
    deploy: Deployment, tmp_path: Path
) -> None:
    d = deploy
    out = tmp_path / "found"
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {out}\n")
    script.chmod(0o755)
    out.write_text("")
    gate = tmp_path / "gate"
    check = f"x=sh -c 'test -e {gate}'"
    d.scheduler()
    d.command_host("h1", extra=(
        "--discover", f"command:{script}", "--discover-every", "0.3",
        "--health-check", check, "--health-every-seconds", "0.5",
    ))  # fmt: skip
    out.write_text('{"id": "c1", "driver_type": "x"}\n')
    wait_for(lambda: device(d.admin, "c1").get("health") == "unhealthy", 20, "c1 checked")
    assert not served(d.admin, "c1") or device(d.admin, "c1")["health"] != "healthy"
    idle = set(d.admin.redis.zrange(d.admin.keys.idle, 0, -1))  # type: ignore[arg-type]
    assert "c1" not in idle, "an unchecked device is no idle candidate"
    gate.touch()
    wait_for(lambda: device(d.admin, "c1").get("health") == "healthy", 20, "c1 healthy")
    tid = d.client.submit("echo ok", driver_type="x")
    assert d.client.wait(tid, timeout=30).status is TaskStatus.done
    assert verify(d.admin).ok


def test_a_listed_device_another_host_owns_is_left_out_and_the_host_keeps_beating(
    deploy: Deployment, tmp_path: Path
) -> None:
    d = deploy
    f = tmp_path / "devices.yaml"
    f.write_text("- d1:x\n")
    d.command_host("h2", "o1:x")
    wait_for(lambda: served(d.admin, "o1"), 20, "o1 served by h2")
    d.command_host("h1", extra=("--devices-file", str(f)))
    wait_for(lambda: served(d.admin, "d1"), 20, "d1 served")
    f.write_text("- d1:x\n- o1:x\n- d2:x\n")
    wait_for(lambda: served(d.admin, "d2"), 20, "d2 served")
    assert device(d.admin, "o1")["host_id"] == "h2" and served(d.admin, "o1")
    assert "device o1 left out: it belongs to another host" in d.log("h1")
    assert d.alive("h1") and d.alive("h2")
    assert verify(d.admin).ok
