"""A suite through real daemons while its scheduler is SIGKILLed: the next scheduler to lead
records every shard once (the suite's counts add up, one suite_done event) and the pool's
invariants hold."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from deviceq import verify
from harness import Deployment, wait_for

RUNNER = """\
import os, pathlib, sys, time
time.sleep(1.5)
cases = "".join(f'<testcase classname="k" name="{t.split("#")[1]}" time="1.5"/>'
                for t in sys.argv[1:])
out = pathlib.Path(os.environ["DEVICEQ_ARTIFACTS_DIR"]) / "junit.xml"
out.write_text(f"<testsuite>{cases}</testsuite>")
"""


def test_a_scheduler_killed_mid_suite_leaves_it_to_the_next_one(
    deploy: Deployment, tmp_path: Path
) -> None:
    d = deploy
    d.configure(lease_ttl=30, claim_ttl=30)
    d.admin.set_config("artifact_store", f"file://{tmp_path / 'store'}")
    runner = tmp_path / "runner.py"
    runner.write_text(RUNNER)
    first = d.scheduler()
    d.command_host("h1", "p1:android", "p2:android", "p3:android")
    wait_for(lambda: len(d.admin.devices()) == 3, 30, "the phones registered")
    tests = [f"k#t{i}" for i in range(9)]
    s = d.client.submit_suite("kill", tests, command=f"{sys.executable} {runner} {{tests}}",
                              driver_type="android", shards=3, max_attempts=1)  # fmt: skip
    wait_for(lambda: any(str(d.status(sh.task_id)) == "dispatched" for sh in s.shards), 30,
             "a shard running")  # fmt: skip
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    d.spawn("scheduler2", "scheduler", "run", "--tick", "0.2")
    end = d.client.wait_suite(s.id, timeout=90)
    assert end.status == "done", end.to_dict()
    assert end.counts["passed"] == 9 and end.counts["pending"] == 0
    assert all(sh.done and sh.counts == {"passed": 3} for sh in end.shards)
    done_events = [f for _, f in d.r.xrange(d.client.keys.events) if f.get("type") == "suite_done"]
    assert [(f["suite"], f["status"]) for f in done_events] == [(s.id, "done")]
    assert verify(d.admin).ok
