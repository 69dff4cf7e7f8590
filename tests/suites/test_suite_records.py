"""Suites on a real Redis, the scheduler and hosts played in-process: shards are tasks, each
ended shard's JUnit file becomes per-test results (suite_shard.lua, once), failed tests are
retried as a new shard elsewhere, the suite ends done or failed, cancel ends every shard."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from deviceq import InvalidInput, NotFound, QueueFull
from deviceq.services.suite_watch import SuiteWatcher
from deviceq.suites import store
from deviceq.suites.model import MAX_SHARDS, SUITES_KEPT
from deviceq.suites.sharding import Unsatisfiable

TESTS = [f"com.ex.T#t{i}" for i in range(12)]


def junit_xml(results: dict[str, tuple[str, float]]) -> bytes:
    cases = []
    for test, (status, secs) in results.items():
        cls, name = test.split("#")
        body = {"failed": '<failure message="boom"/>', "error": "<error/>",
                "skipped": "<skipped/>"}.get(status, "")  # fmt: skip
        cases.append(f'<testcase classname="{cls}" name="{name}" time="{secs}">{body}</testcase>')
    return f'<testsuite name="s">{"".join(cases)}</testsuite>'.encode()


def event_types(lab: Lab) -> list[str]:
    return [f["type"] for _, f in lab.client.redis.xrange(lab.client.keys.events)]


class Lab:
    """A pool with one host of three phones, a file:// artifact store, and a watcher."""

    def __init__(self, fleet: Any, tmp: Path) -> None:
        self.fleet = fleet
        self.root = tmp / "store"
        fleet.admin.set_config("artifact_store", f"file://{self.root}")
        self.host = fleet.add_host("lab", *[(f"p{i}", "android", ()) for i in range(3)])
        self.client = fleet.client
        self.watcher = SuiteWatcher(self.client, lambda: None)

    def run_shard(self, task_id: str, device: str, results: dict[str, tuple[str, float]] | None,
                  outcome: str = "done") -> None:  # fmt: skip
        """Assign the shard's task to ``device``, claim, report, and record its JUnit file."""
        (ok,) = self.fleet.store.commit([(task_id, device)])
        assert ok.startswith("ok:"), ok
        (a,) = self.host.claim(5)
        if outcome == "done":
            self.host.report(task_id, a.lease_id, "done", payload="ok")
        else:
            self.host.report(task_id, a.lease_id, "failed", "runner_failed", "tests failed")
        if results is not None:
            data = junit_xml(results)
            path = self.root / self.fleet.pool / task_id / str(a.attempt) / "junit.xml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            sha = hashlib.sha256(data).hexdigest()
            self.host.record_artifacts(task_id, a.attempt, [("junit.xml", len(data), sha)])

    def look(self, suite_id: str) -> int:
        return self.watcher.look(suite_id, None)


@pytest.fixture
def lab(real_fleet: Any, tmp_path: Path) -> Lab:
    return Lab(real_fleet, tmp_path)


def test_a_suite_is_sharded_recorded_and_ends_done_with_its_durations_kept(lab: Lab) -> None:
    s = lab.client.submit_suite("smoke", TESTS, command="run-tests {tests}",
                                driver_type="android", shards=3)  # fmt: skip
    assert s.status == "running" and len(s.shards) == 3 and s.tests == 12
    assert sorted(t for sh in s.shards for t in sh.tests) == sorted(TESTS)
    assert s.eta_at_submit_s is not None and s.eta_at_submit_s > 0
    goal = lab.client.get(s.shards[0].task_id).goal
    assert goal == "run-tests " + " ".join(f"'{t}'" for t in s.shards[0].tests)
    events = event_types(lab)
    assert "suite_submitted" in events
    for i, sh in enumerate(s.shards):
        lab.run_shard(sh.task_id, f"p{i}", {t: ("passed", 2.0 + j) for j, t in enumerate(sh.tests)})
    assert lab.look(s.id) == 3
    assert lab.look(s.id) == 0  # recorded once
    done = lab.client.suite(s.id)
    assert done.status == "done" and done.counts["passed"] == 12 and done.counts["pending"] == 0
    assert not done.failed and done.eta_s is None
    assert {sh.device_id for sh in done.shards} == {"p0", "p1", "p2"}
    events = event_types(lab)
    assert events.count("suite_done") == 1
    # the durations are kept per suite name: the next split is balanced on them
    hist = store.read_history(lab.client, "smoke", TESTS)
    assert len(hist) == 12 and all(v >= 2.0 for v in hist.values())
    again = lab.client.plan_suite("smoke", TESTS, command="x {tests}", shards=3)
    loads = sorted(again.estimates)
    assert loads[-1] - loads[0] <= max(hist.values())


def test_failed_tests_are_retried_as_a_new_shard_and_flaky_ones_marked(lab: Lab) -> None:
    s = lab.client.submit_suite("retry", TESTS[:4], goal="run {tests}", shards=1,
                                retry_failed=1)  # fmt: skip
    (sh,) = s.shards
    res = {t: ("passed", 1.0) for t in TESTS[:4]}
    res[TESTS[1]] = ("failed", 1.0)
    del res[TESTS[2]]  # reported nothing: missing, retried too
    lab.run_shard(sh.task_id, "p0", res, outcome="failed")
    assert lab.look(s.id) == 1
    mid = lab.client.suite(s.id)
    assert mid.status == "running" and len(mid.shards) == 2
    assert (mid.counts["passed"], mid.counts["pending"], mid.failed) == (2, 2, [])  # retrying
    retry = mid.shards[1]
    assert retry.round == 1 and sorted(retry.tests) == sorted([TESTS[1], TESTS[2]])
    assert lab.client.get(retry.task_id).goal == f"run {' '.join(retry.tests)}"
    # the retry was submitted once, even when the watcher submits it again (a crash between)
    again = lab.watcher.retry_shard(s.id, mid.shards[0], mid.spec,
                                    [[TESTS[1], "failed", "", ""]], "p0")  # fmt: skip
    assert again is not None and again["task"] == retry.task_id
    lab.run_shard(retry.task_id, "p1", {TESTS[1]: ("passed", 1.0), TESTS[2]: ("failed", 1.0)},
                  outcome="failed")  # fmt: skip
    assert lab.look(s.id) == 1
    end = lab.client.suite(s.id)
    assert end.status == "failed"  # TESTS[2] failed on every try (no round left)
    assert [r.test for r in end.flaky] == [TESTS[1]]
    assert [r.test for r in end.failed] == [TESTS[2]]
    assert end.failed[0].devices == ["p0", "p1"]
    assert end.counts == {"passed": 2, "flaky": 1, "failed": 1, "skipped": 0, "pending": 0}


def test_a_deadline_picks_the_fewest_shards_or_is_refused_with_nothing_submitted(lab: Lab) -> None:
    lab.client.redis.hset(lab.client.keys.suite_durations("dl"),
                          mapping={t: 60_000 for t in TESTS})  # fmt: skip
    p = lab.client.plan_suite("dl", TESTS, goal="g {tests}", deadline=300, max_devices=3)
    assert len(p.shards) == 3  # 720 s of tests: 3 devices at 240 s (+ overhead)
    before = lab.client.redis.zcard(lab.client.keys.status("queued"))
    with pytest.raises(Unsatisfiable, match=r"^unsatisfiable: needs 6 devices, 3 match$"):
        lab.client.submit_suite("dl", TESTS, goal="g {tests}", deadline=150, max_devices=10)
    assert lab.client.redis.zcard(lab.client.keys.status("queued")) == before
    assert lab.client.suites() == []


def test_cancel_ends_the_suite_and_every_shard(lab: Lab) -> None:
    s = lab.client.submit_suite("c", TESTS, goal="g {tests}", shards=2)
    answers = lab.client.cancel_suite(s.id)
    assert sorted(answers.values()) == ["cancelled", "cancelled"]
    end = lab.client.suite(s.id)
    assert end.status == "cancelled" and all(sh.status == "cancelled" for sh in end.shards)
    assert lab.look(s.id) == 0
    assert lab.client.cancel_suite(s.id) == {sh.task_id: "already:cancelled" for sh in end.shards}
    with pytest.raises(NotFound):
        lab.client.suite("nosuch")


def test_hostile_or_oversized_junit_is_refused_and_its_tests_count_missing(lab: Lab) -> None:
    s = lab.client.submit_suite("x", TESTS[:2], goal="g {tests}", shards=1)
    (sh,) = s.shards
    (ok,) = lab.fleet.store.commit([(sh.task_id, "p0")])
    (a,) = lab.host.claim(5)
    lab.host.report(sh.task_id, a.lease_id, "done", payload="ok")
    bomb = (b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 '
            b'"&lol;&lol;&lol;">]><testsuite><testcase name="&lol2;"/></testsuite>')  # fmt: skip
    path = lab.root / lab.fleet.pool / sh.task_id / "1" / "junit.xml"
    path.parent.mkdir(parents=True)
    path.write_bytes(bomb)
    lab.host.record_artifacts(sh.task_id, 1, [("junit.xml", len(bomb),
                                               hashlib.sha256(bomb).hexdigest())])  # fmt: skip
    assert lab.look(s.id) == 1
    end = lab.client.suite(s.id)
    assert end.status == "failed" and end.counts["failed"] == 2
    raw = json.loads(lab.client.redis.hget(lab.client.keys.suite_results(s.id), TESTS[0]))
    assert raw["tries"][0][0] == "missing" and "refused" in raw["m"]


def test_bad_input_is_refused_before_anything_is_written(lab: Lab) -> None:
    c = lab.client
    for kwargs, msg in [
        ({"goal": "  ", "shards": 2}, "must not be blank"),
        (
            {"goal": "g" * 16300 + " {tests}", "shards": 1},
            r"shard 0's goal .* more than 16384: give more",
        ),
        ({"goal": "g {tests}", "command": "c {tests}", "shards": 2}, "exactly one"),
        ({"goal": "g {tests}"}, "give one of"),
        ({"goal": "g {tests}", "shards": 2, "deadline": 10}, "give one of"),
        ({"goal": "g {tests}", "shards": 0}, "--shards must be"),
        ({"goal": "g {tests}", "shards": 2, "retry_failed": 9}, "--retry-failed"),
        ({"goal": "g {tests}", "shards": 2, "max_devices": 3}, "--max-devices goes with"),
    ]:
        with pytest.raises(InvalidInput, match=msg):
            c.submit_suite("bad", TESTS, **kwargs)
    assert c.suites() == [] and c.redis.zcard(c.keys.status("queued")) == 0


def test_the_kept_suites_bound_is_the_scripts() -> None:
    text = (Path(__file__).resolve().parents[2] / "lua" / "suite_submit.lua").read_text()
    assert f"local SUITES_KEPT = {SUITES_KEPT} " in text


def test_a_suite_refused_part_way_by_a_full_queue_leaves_nothing_queued(lab: Lab) -> None:
    c = lab.client
    lab.fleet.admin.set_config("max_queue_depth", 150)
    tests = [f"t{i}" for i in range(MAX_SHARDS)]
    with pytest.raises(QueueFull):  # a first call of shards goes in, a later one does not
        c.submit_suite("big", tests, goal="g {tests}", shards=MAX_SHARDS)
    assert c.redis.zcard(c.keys.status("queued")) == 0
    assert 0 < c.redis.zcard(c.keys.status("cancelled")) <= 150
    assert c.suites() == []


def test_the_suite_commands(lab: Lab, cli: Any, tmp_path: Path) -> None:
    tests_file = tmp_path / "tests.txt"
    tests_file.write_text("\n".join(TESTS[:4]) + "\n")
    res = cli("suite", "submit", "cmd", "--tests", str(tests_file), "--goal", "run {tests}",
              "--shards", "2", "--retry-failed", "1", "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    made = json.loads(res.stdout)
    sid = made["id"]
    assert [len(s["tests"]) for s in made["shards"]] == [2, 2] and made["eta_s"] > 0
    bad = cli("suite", "submit", "cmd", "--tests", str(tests_file), "--goal", " ", "--shards", "2")
    assert bad.exit_code == 2 and "must not be blank" in bad.output
    assert cli("suite", "wait", sid, "--timeout", "0.2").exit_code == 124
    for i, sh in enumerate(made["shards"]):
        results = {t: ("passed", 1.0) for t in sh["tests"]}
        lab.run_shard(sh["task_id"], f"p{i}", results)
    assert lab.look(sid) == 2
    res = cli("suite", "wait", sid)
    assert res.exit_code == 0 and res.output.strip() == f"suite {sid}: done"
    shown = json.loads(cli("suite", "show", sid, "--json").stdout)
    assert shown["status"] == "done" and shown["counts"]["passed"] == 4
    assert [s["device_id"] for s in shown["shards"]] == ["p0", "p1"]
    listed = json.loads(cli("suite", "list", "--json").stdout)
    assert [x["id"] for x in listed] == [sid]
    out = tmp_path / "out"
    res = cli("suite", "artifacts", sid, "--download", str(out))
    assert res.exit_code == 0, res.output
    merged = (out / "junit.xml").read_bytes()
    from deviceq.suites import junit

    assert sorted(c.test for c in junit.parse(merged)) == sorted(TESTS[:4])
    assert all(c.status == "passed" for c in junit.parse(merged))
    assert len(list(out.glob("*/junit.xml"))) == 2
    assert cli("suite", "show", "nosuch").exit_code != 0
    assert cli("suite", "show", "bad id").exit_code == 2
