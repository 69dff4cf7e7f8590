"""``deviceq task show`` reads a task without the models (`deviceq.core.task_record`): its JSON
is the same as the models' (`ScheduledTask.model_dump`) for tasks in every state, and its text
is plain columns. On the real Redis of the session."""

from __future__ import annotations

import json
import time
from typing import Any

from deviceq.cli.render import task_json
from deviceq.core.task_record import read_task
from deviceq.core.task_record import task_json as stored_json


def run_to(fleet: Any, tid: str, device: str, outcome: str, kind: str | None, out: str) -> None:
    lease = fleet.store.commit([(tid, device)])[0]
    assert lease.startswith("ok:"), lease
    h = fleet.host("h1")
    h.claim(1)
    assert h.report(tid, lease[3:], outcome, kind, out).startswith("ok")


def same_json(fleet: Any, tid: str) -> dict[str, Any]:
    found = read_task(fleet.r, fleet.client.keys, tid)
    assert found is not None
    plain = stored_json(*found)
    assert plain is not None
    assert json.dumps(plain) == json.dumps(task_json(fleet.client.get(tid)))  # order too
    return plain


def test_the_plain_reading_is_the_models_json_in_every_state(real_fleet: Any) -> None:
    f = real_fleet
    f.add_host("h1", ("d1", "android", ("wifi",)), ("d2", "android", ("wifi",)))
    c = f.client
    queued = c.submit("x" * 100, driver_type="android", tags=["wifi"], priority=4,
                      tenant="team-a", timeout=12.5, idempotency_key="k1",
                      retry_on=["runner_failed"], retry_backoff="fixed:5")  # fmt: skip
    later = c.submit("later", not_before=time.time() + 3600)
    done = c.submit("echo ok", driver_type="android")
    run_to(f, done, "d1", "done", None, "line\n" * 30)
    failed = c.submit("exit 3", driver_type="android", max_attempts=1)
    run_to(f, failed, "d2", "failed", "runner_failed", "exit code 3")
    again = c.submit("flaky", driver_type="android", max_attempts=2)
    run_to(f, again, "d1", "failed", "runner_failed", "once")  # requeued: one attempt kept
    running = c.submit("long", driver_type="android")
    assert f.store.commit([(running, "d2")])[0].startswith("ok:")  # assigned, not claimed
    rerun = c.retry(done, rerun=True, by="alice")
    c.cancel(later)
    f.r.hset(f.client.keys.task(queued), "stray_field", "ignored by both")
    for tid in (queued, later, done, failed, again, running, rerun):
        same_json(f, tid)
    assert same_json(f, queued)["goal"] == "x" * 100  # the long goal, from its own key
    assert same_json(f, again)["attempts"][0]["outcome"] == "failed"
    assert same_json(f, rerun)["submitted_by"] == "alice"


def test_a_multi_device_task_is_left_to_the_models(real_fleet: Any, cli: Any) -> None:
    gang = real_fleet.client.submit(
        "pair", roles={"caller": {"driver_type": "android"}, "callee": {"driver_type": "ios"}}
    )
    found = read_task(real_fleet.r, real_fleet.client.keys, gang)
    assert found is not None and stored_json(*found) is None
    res = cli("task", "show", gang, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == task_json(real_fleet.client.get(gang))
    text = cli("task", "show", gang).stdout
    assert "roles" in text.splitlines() and "caller (leader)" in text


def test_the_text_is_plain_columns_with_the_attempts_table(real_fleet: Any, cli: Any) -> None:
    f = real_fleet
    f.add_host("h1", ("d1", "android", ()))
    tid = f.client.submit("echo", driver_type="android", max_attempts=1)
    run_to(f, tid, "d1", "failed", "runner_failed", "\n".join(f"out {i}" for i in range(25)))
    res = cli("task", "show", tid)
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    whole = f"the whole output: deviceq task logs {tid}"
    fields = lines[: lines.index(whole)]  # the fields, then where the whole output is
    assert lines[lines.index(whole) + 1] == ""  # then the tables, each after a blank line
    rows = {ln.split()[0]: ln for ln in fields if not ln.startswith(" ")}
    assert rows["status"].split() == ["status", "failed"]
    assert rows["failure_kind"].split() == ["failure_kind", "runner_failed"]
    assert rows["tenant"].split() == ["tenant", "-"]
    col = rows["status"].index("failed")  # every value starts in one column
    assert all(r[:col].rstrip() == name and r[col] != " " for name, r in rows.items())
    err = lines.index(next(ln for ln in lines if ln.startswith("error ")))
    assert "(5 earlier lines not shown)" in lines[err]  # the last 20 lines of 25
    assert lines[err + 1].strip() == "out 5" and lines[err + 1].index("out 5") == col
    head = lines.index("attempts") + 1
    assert lines[head].split() == ["#", "lease", "host", "device", "assigned", "ended",
                                   "outcome", "kind"]  # fmt: skip
    assert lines[head + 1].split()[0] == "1" and lines[head + 1].split()[-2:] == [
        "failed", "runner_failed"
    ]  # fmt: skip
