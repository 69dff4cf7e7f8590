"""``--each-device --include-joining``: a device that registers within the window after the
submit gets its pinned shard from the leading scheduler's suite watcher (played in-process
here, on a real Redis), once per device however often a watcher looks or is replaced half-way;
a device registered before the submit, outside the window or not matching gets none; the suite
stays running until the window has closed, and ``suite show`` lists every device's outcome
with the window's end."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from deviceq import InvalidInput
from deviceq.cli.suite_cmds import suite_lines
from deviceq.services.suite_watch import SuiteWatcher
from deviceq.suites.model import MAX_SHARDS
from deviceq.suites.submission import joined_shard
from harness import wait_for

TESTS = ["c#a", "c#b"]


def phones(*ids: str) -> list[tuple[str, str, tuple[str, ...]]]:
    return [(d, "android", ()) for d in ids]


@pytest.fixture
def fleet_store(real_fleet: Any, tmp_path: Path) -> Any:
    """The fleet with a file:// artifact store (where run_all puts the shards' JUnit files)."""
    real_fleet.store_root = tmp_path / "store"
    real_fleet.admin.set_config("artifact_store", f"file://{real_fleet.store_root}")
    return real_fleet


def run_all(f: Any, watcher: SuiteWatcher, suite_id: str) -> None:
    """Run every open shard of the suite on its pinned device (every test passing, its JUnit
    file kept as the host would) and let the watcher record them."""
    for sh in f.client.suite(suite_id).shards:
        if sh.done:
            continue
        assert f.store.commit([(sh.task_id, sh.pin)])[0].startswith("ok:")
        h = f.host(f.r.hget(f.client.keys.device(sh.pin), "host_id"))
        (a,) = [x for x in h.claim(5) if x.task.id == sh.task_id]
        h.report(sh.task_id, a.lease_id, "done", payload="ok")
        cases = "".join(f'<testcase classname="c" name="{t[2:]}" time="0.1"/>' for t in sh.tests)
        data = f"<testsuite>{cases}</testsuite>".encode()
        path = f.store_root / f.pool / sh.task_id / str(a.attempt) / "junit.xml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        sha = hashlib.sha256(data).hexdigest()
        h.record_artifacts(sh.task_id, a.attempt, [("junit.xml", len(data), sha)])
    watcher.look(suite_id, None)


def test_a_device_registering_in_the_window_gets_its_pinned_shard_once(fleet_store: Any) -> None:
    f = fleet_store
    f.add_host("h1", *phones("p1"))
    s = f.client.submit_suite("flash", TESTS, command="check {tests}", driver_type="android",
                              each_device=True, include_joining=600)  # fmt: skip
    assert s.join_until is not None and s.join_until >= s.submitted_at + 600_000
    watcher = SuiteWatcher(f.client, lambda: None)
    assert watcher.join(s.id, None) == 0  # nobody joined yet
    f.add_host("h2", *phones("p2"), ("w1", "web", ()))  # a phone and a browser join
    # a watcher killed after submitting p2's task, before recording it: the next one
    # submits the same task (its idempotency key) and records it once
    (early,) = f.client.submit_many([joined_shard(s.spec, TESTS, s.id, "p2")])
    assert watcher.join(s.id, None) == 1
    assert SuiteWatcher(f.client, lambda: None).join(s.id, None) == 0  # a new leader: known
    f.beat()  # (devgen unchanged or not, nothing more)
    assert watcher.join(s.id, None) == 0
    got = f.client.suite(s.id)
    assert [(sh.pin, sh.joined, sh.tests) for sh in got.shards] == [
        ("p1", False, TESTS), ("p2", True, TESTS)]  # fmt: skip
    assert got.shards[1].task_id == early
    assert f.client.get(early).goal == "check 'c#a' 'c#b'"
    assert f.r.get(f.client.keys.task_tests(early)) == "c#a\nc#b"
    assert len(f.client.list()) == 2  # no second task for p2, none for the browser
    joined = [e for _, e in f.r.xrange(f.client.keys.events) if e.get("type") == "suite_joined"]
    assert [(e["suite"], e["device"]) for e in joined] == [(s.id, "p2")]
    # every shard done, the window still open: the suite waits for devices still to join
    run_all(f, watcher, s.id)
    assert f.client.suite(s.id).status == "running"
    text = "\n".join(suite_lines(f.client.suite(s.id)))
    assert "joining window open until " in text and "1 device(s) joined" in text
    assert "on p2 (pinned, joined)" in text and "on p1 (pinned)," in text
    assert f.client.suite(s.id).to_dict()["include_joining_until"] == s.join_until


def test_after_the_window_no_device_joins_and_the_suite_ends(fleet_store: Any) -> None:
    f = fleet_store
    f.add_host("h1", *phones("p1"))
    s = f.client.submit_suite("flash", TESTS, command="check {tests}", driver_type="android",
                              each_device=True, include_joining=0.5)  # fmt: skip
    watcher = SuiteWatcher(f.client, lambda: None)
    run_all(f, watcher, s.id)
    assert f.client.suite(s.id).status == "running"  # its window is open still
    assert s.join_until is not None
    until = s.join_until
    wait_for(lambda: f.client.server_time_ms() >= until, 30, "the window passed")
    f.add_host("h2", *phones("p2"))  # registers after the window
    assert watcher.join(s.id, None) == 0
    end = f.client.suite(s.id)
    assert (end.status, end.join_closed, len(end.shards)) == ("done", True, 1)
    assert len(f.client.list()) == 1  # no task for p2
    assert "joining window closed until" in "\n".join(suite_lines(end))


def test_a_suite_still_running_shards_ends_at_its_last_shard_after_the_window(
    fleet_store: Any,
) -> None:
    f = fleet_store
    f.add_host("h1", *phones("p1"))
    s = f.client.submit_suite("flash", TESTS, command="check {tests}", driver_type="android",
                              each_device=True, include_joining=0.5)  # fmt: skip
    watcher = SuiteWatcher(f.client, lambda: None)
    until = s.join_until or 0
    wait_for(lambda: f.client.server_time_ms() >= until, 30, "the window passed")
    watcher.join(s.id, None)  # closes the window; the shard still runs
    assert f.client.suite(s.id).status == "running"
    run_all(f, watcher, s.id)
    assert f.client.suite(s.id).status == "done"


def test_bad_joining_input_is_refused(real_fleet: Any, cli: Any, tmp_path: Path) -> None:
    f = real_fleet
    f.add_host("h1", *phones("p1"))
    for kwargs, msg in [
        ({"shards": 1, "include_joining": 60}, "goes with --each-device"),
        ({"each_device": True, "include_joining": 0}, "more than 0"),
        ({"each_device": True, "include_joining": "10m"}, "more than 0"),
        ({"each_device": True, "include_joining": 8 * 86400}, "at most 7 days"),
    ]:
        with pytest.raises(InvalidInput, match=msg):
            f.client.submit_suite("bad", TESTS, command="c {tests}", **kwargs)
    tests = tmp_path / "t.txt"
    tests.write_text("c#a\n")
    res = cli("suite", "submit", "x", "--tests", str(tests), "--command", "c {tests}",
              "--each-device", "--include-joining", "10m", "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["include_joining_s"] == 600
    assert f.client.suite(json.loads(res.stdout)["id"]).join_until is not None
    assert f.client.suites()[0]["status"] == "running"
    assert len(f.client.suites()) == 1


def test_the_joined_devices_bound_is_the_scripts() -> None:
    text = (Path(__file__).resolve().parents[2] / "lua" / "suite_join.lua").read_text()
    assert f"local MAX_DEVICES = {MAX_SHARDS} " in text
