"""``--each-device --include-joining`` through real daemons: a scheduler, a host with one phone,
then a second host whose phone registers within the suite's window: it gets its pinned shard,
which runs there (its command reading its tests from ``$DEVICEQ_TESTS_FILE``); a phone
registering after another suite's window has closed gets none, and that suite ends."""

from __future__ import annotations

import sys
from pathlib import Path

from deviceq import verify
from harness import Deployment, wait_for

SHARD = """\
import os, pathlib
tests = pathlib.Path(os.environ["DEVICEQ_TESTS_FILE"]).read_text().splitlines()
cases = "".join(f'<testcase classname="k" name="{t.split("#")[1]}" time="0.1"/>' for t in tests)
out = pathlib.Path(os.environ["DEVICEQ_ARTIFACTS_DIR"]) / "junit.xml"
out.write_text(f"<testsuite>{cases}</testsuite>")
"""


def test_a_phone_joining_in_the_window_gets_its_shard_and_one_after_it_none(
    deploy: Deployment, tmp_path: Path
) -> None:
    d = deploy
    d.configure(lease_ttl=30, claim_ttl=30)
    d.admin.set_config("artifact_store", f"file://{tmp_path / 'store'}")
    shard = tmp_path / "shard.py"
    shard.write_text(SHARD)
    command = f"{sys.executable} {shard}"  # (no {tests}: the file is the list)
    d.scheduler()
    d.command_host("h1", "p1:android")
    wait_for(lambda: len(d.admin.devices()) == 1, 30, "p1 registered")
    tests = ["k#a", "k#b", "k#c"]
    s = d.client.submit_suite("flash", tests, command=command, driver_type="android",
                              each_device=True, include_joining=600)  # fmt: skip
    assert [sh.pin for sh in s.shards] == ["p1"]
    d.command_host("h2", "p2:android")  # joins within the window

    def both_recorded() -> bool:
        shards = d.client.suite(s.id).shards
        return len(shards) == 2 and all(sh.done for sh in shards)

    wait_for(both_recorded, 90, "p2's shard added, and both shards run and recorded")
    got = d.client.suite(s.id)
    assert [(sh.pin, sh.device_id, sh.joined, sh.counts) for sh in got.shards] == [
        ("p1", "p1", False, {"passed": 3}), ("p2", "p2", True, {"passed": 3})]  # fmt: skip
    assert got.status == "running" and got.join_until is not None  # its window is open
    d.client.cancel_suite(s.id)

    late = d.client.submit_suite("smoke", tests, command=command, driver_type="android",
                                 each_device=True, include_joining=1)  # fmt: skip
    end = d.client.wait_suite(late.id, timeout=90)  # its shards run, its window closes
    assert (end.status, end.join_closed) == ("done", True)
    assert sorted(sh.pin or "" for sh in end.shards) == ["p1", "p2"]
    d.command_host("h3", "p3:android")  # registers after the window
    wait_for(lambda: len(d.admin.devices()) == 3, 30, "p3 registered")
    assert len(d.client.suite(late.id).shards) == 2
    pinned_to_p3 = [t for t in d.client.list(limit=1000) if d.r.hget(d.client.keys.task(t.id),
                                                                       "pin") == "p3"]  # fmt: skip
    assert pinned_to_p3 == []
    assert verify(d.admin).ok
