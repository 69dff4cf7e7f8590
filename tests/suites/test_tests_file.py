"""A shard's list of tests reaches its run as a file, ``$DEVICEQ_TESTS_FILE`` (one test id a
line), whatever the runner: stored with the task by submit.lua, returned with the claim,
written by the host beside the run's folder before it starts. Real daemons on a real Redis:
a command runner (thread and async) and a Python runner (in the daemon, in a child process,
async) read it; a suite's command reads its tests from it alone; bad or oversized lists are
refused with nothing written."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from deviceq import InvalidInput, TaskStatus
from deviceq.core.bounds import MAX_TESTS_LIST_BYTES
from deviceq.core.script_args import SUBMIT
from harness import Deployment, wait_for
from runner_kinds import KINDS, host_flags

TESTS = ["com.lab.Login#t1", "com.lab.Camera#t 2 with blanks", "Läuft#ü"]


def read_tests_file(task: Any) -> str:
    """A Python goal runner (run by the daemons): answers what its tests file holds."""
    assert task.env()["DEVICEQ_TESTS_FILE"] == str(task.tests_file)
    return "tests:" + task.tests_file.read_text(encoding="utf-8")


async def read_tests_file_async(task: Any) -> str:
    return read_tests_file(task)


def read_no_tests_file(task: Any) -> str:
    return f"file {task.tests_file} env {'DEVICEQ_TESTS_FILE' in task.env()}"


@pytest.mark.parametrize("kind", KINDS)
def test_the_command_runner_finds_the_tests_in_deviceq_tests_file(
    deploy: Deployment, tmp_path: Path, kind: str
) -> None:
    d = deploy
    d.scheduler()
    state = str(tmp_path / "state")
    d.host("h1", "d1:x", extra=("--goal-runner", "command", "--command", "sh -c {goal}",
                                "--state-dir", state, *host_flags(kind)))  # fmt: skip
    (tid,) = d.client.submit_many(
        [
            {
                "goal": 'printf "[%s]" "$DEVICEQ_TESTS_FILE"; cat "$DEVICEQ_TESTS_FILE"',
                "driver_type": "x",
                "tests": TESTS,
            }
        ]  # fmt: skip
    )
    plain = d.client.submit('echo "[${DEVICEQ_TESTS_FILE-unset}]"', driver_type="x")
    t = d.client.wait(tid, timeout=60)
    assert t.status == TaskStatus.done, t.error
    path, _, body = (t.result or "").partition("]")
    assert path.startswith("[") and path.endswith(f"/{tid}/1.tests")
    assert body == "".join(f"{x}\n" for x in TESTS)
    wait_for(lambda: not Path(path[1:]).exists(), 30, "the tests file removed after the run")
    p = d.client.wait(plain, timeout=60)
    assert (p.status, (p.result or "").strip()) == (TaskStatus.done, "[unset]")


@pytest.mark.parametrize(
    ("runner", "isolation"),
    [
        ("read_tests_file", "thread"),
        ("read_tests_file", "process"),
        ("read_tests_file_async", "thread"),
    ],  # fmt: skip
)
def test_a_python_runner_finds_the_tests_file_on_its_task(
    deploy: Deployment, tmp_path: Path, runner: str, isolation: str
) -> None:
    d = deploy
    d.scheduler()
    d.host("h1", "d1:x", extra=("--goal-runner", f"test_tests_file:{runner}", "--isolation",
                                isolation, "--state-dir", str(tmp_path / "state")))  # fmt: skip
    (tid,) = d.client.submit_many([{"goal": "run them", "driver_type": "x", "tests": TESTS}])
    t = d.client.wait(tid, timeout=60)
    assert (t.status, t.result) == (TaskStatus.done, "tests:" + "".join(f"{x}\n" for x in TESTS))


def test_a_task_without_tests_gets_no_tests_file(deploy: Deployment, tmp_path: Path) -> None:
    d = deploy
    d.scheduler()
    d.host("h1", "d1:x", extra=("--goal-runner", "test_tests_file:read_no_tests_file",
                                "--state-dir", str(tmp_path / "state")))  # fmt: skip
    t = d.client.wait(d.client.submit("plain", driver_type="x"), timeout=60)
    assert (t.status, t.result) == (TaskStatus.done, "file None env False")


SHARD = """\
import os, pathlib, sys
tests = pathlib.Path(os.environ["DEVICEQ_TESTS_FILE"]).read_text().splitlines()
assert tests == sys.argv[1:], (tests, sys.argv[1:])  # {tests} still says the same
cases = "".join(f'<testcase classname="k" name="{t.split("#")[1]}" time="0.1"/>' for t in tests)
out = pathlib.Path(os.environ["DEVICEQ_ARTIFACTS_DIR"]) / "junit.xml"
out.write_text(f"<testsuite>{cases}</testsuite>")
"""


def test_a_suite_shard_command_reads_its_tests_from_the_file(
    deploy: Deployment, tmp_path: Path
) -> None:
    d = deploy
    d.admin.set_config("artifact_store", f"file://{tmp_path / 'store'}")
    shard = tmp_path / "shard.py"
    shard.write_text(SHARD)
    d.scheduler()
    d.command_host("h1", "p1:android", "p2:android")
    tests = [f"k#t{i}" for i in range(7)]
    s = d.client.submit_suite("from-file", tests, command=f"{sys.executable} {shard} {{tests}}",
                              driver_type="android", shards=2, max_attempts=1)  # fmt: skip
    end = d.client.wait_suite(s.id, timeout=90)
    assert end.status == "done", end.to_dict()
    assert end.counts["passed"] == 7
    assert sorted(t for sh in end.shards for t in sh.tests) == sorted(tests)
    # a goal template's shards carry their lists too
    g = d.client.submit_suite("goal-form", tests, goal="run {tests}", shards=3)
    for sh in g.shards:
        assert d.r.get(d.client.keys.task_tests(sh.task_id)) == "\n".join(sh.tests)
    d.client.cancel_suite(g.id)


def test_bad_lists_of_tests_are_refused_and_nothing_is_written(real_fleet: Any) -> None:
    f = real_fleet
    for tests, msg in [
        ([], "at least one"),
        (["a\nb"], "control characters"),
        ([" a"], "surrounding blanks"),
        (["x" * 301], "1-300 bytes"),
        ("a,b", "list of test ids"),
        ([f"t{i:07d}-" + "x" * 290 for i in range(3700)], "split the tests over more shards"),
    ]:
        with pytest.raises(InvalidInput, match=msg):
            f.client.submit_many([{"goal": "x", "tests": tests}])
    # what the script refuses itself, given around the Python checks
    base = {"id": "t1", "kind": "goal", "goal": "x", "workflow": "", "driver_type": "",
            "tags": "", "priority": 0}  # fmt: skip
    for text in ["", "\na", "a\n", "a\n\nb", "a\tb", " a", "x" * 301,
                 "y\n" * (MAX_TESTS_LIST_BYTES // 2) + "y"]:  # fmt: skip
        with pytest.raises(InvalidInput):
            f.client._run("submit", [1, SUBMIT.pack([{**base, "tests": text}])])
    assert f.client.list() == []
    assert f.r.keys(f.client.keys.task_tests("*")) == []


def test_a_suite_whose_shard_lists_are_too_big_is_refused_on_one_line(real_fleet: Any) -> None:
    f = real_fleet
    f.add_host("h1", ("p1", "android", ()))
    tests = [f"com.lab.Big#t{i:05d}-" + "x" * 200 for i in range(6000)]  # ~1.3 MB
    with pytest.raises(InvalidInput, match=r"shard 0's list of tests is \d+ bytes, more than "
                       r"1048576 .*give more --shards"):  # fmt: skip
        f.client.submit_suite("big", tests, command="./run", shards=1)
    with pytest.raises(InvalidInput, match="with --each-device every device's task lists"):
        f.client.submit_suite("big", tests, command="./run", driver_type="android",
                              each_device=True)  # fmt: skip
    # {tests} in the template: a shard's goal is bounded too (16 KiB), and said so
    with pytest.raises(InvalidInput, match=r"leave \{tests\} out of the template and read"):
        f.client.submit_suite("big", tests, command="./run {tests}", shards=2)
    assert f.client.suites() == [] and f.client.list() == []
    s = f.client.submit_suite("big", tests, command="./run", shards=2)
    assert [len(sh.tests) for sh in s.shards] == [3000, 3000]
    assert {f.client.get(sh.task_id).goal for sh in s.shards} == {"./run"}


def test_the_claim_returns_the_tasks_list_of_tests(real_fleet: Any) -> None:
    f = real_fleet
    h = f.add_host("h1", ("p1", "android", ()))
    (tid,) = f.client.submit_many([{"goal": "x", "driver_type": "android", "tests": TESTS}])
    assert f.store.commit([(tid, "p1")])[0].startswith("ok:")
    (a,) = h.claim(1)
    assert (a.task.id, a.tests) == (tid, TESTS)
    assert f.r.hget(f.client.keys.task(tid), "tests") == "3"
    h.report(tid, a.lease_id, "done", payload="ok")
    assert f.r.pttl(f.client.keys.task_tests(tid)) > 0  # expires with the finished task
