"""`task retry` links the tasks: the new task's hash holds ``retry_of`` (written by submit.lua,
the id checked there), the old one's ``rerun_by``; `task show` and `--json` show both. On the
real Redis of the session, in process (click's CliRunner)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from deviceq.core.errors import InvalidInput, NotFound


def run_to(fleet: Any, tid: str, outcome: str) -> None:
    """Put ``tid`` on device d1 and end its attempt with ``outcome``."""
    if "h1" not in fleet.tokens:
        fleet.add_host("h1", ("d1", "android", ()))
    lease = fleet.store.commit([(tid, "d1")])[0]
    assert lease.startswith("ok:"), lease
    h = fleet.host("h1")
    h.claim(1)
    kind = "runner_failed" if outcome == "failed" else None
    assert h.report(tid, lease[3:], outcome, kind, "out").startswith("ok")


def show(cli: Any, tid: str) -> dict[str, Any]:
    res = cli("task", "show", tid, "--json")
    assert res.exit_code == 0, res.output
    data: dict[str, Any] = json.loads(res.stdout)
    return data


def test_a_rerun_of_a_done_task_is_linked_both_ways(cli: Any, real_fleet: Any) -> None:
    old = cli("submit", "g", "--driver-type", "android", "--priority", "4").stdout.strip()
    run_to(real_fleet, old, "done")
    res = cli("task", "retry", "--rerun", old, "--json")
    assert res.exit_code == 0, res.output
    new = json.loads(res.stdout)["id"]
    assert new != old and json.loads(res.stdout)["task"]["retry_of"] == old
    shown = show(cli, new)
    assert (shown["retry_of"], shown["rerun_by"], shown["priority"]) == (old, None, 4)
    assert real_fleet.r.hget(real_fleet.admin.keys.task(new), "retry_of") == old
    before = show(cli, old)
    assert before["rerun_by"] == new and before["retry_of"] is None
    assert before["status"] == "done" and before["result"] == "out"  # otherwise unchanged
    text = cli("task", "show", new)
    assert text.exit_code == 0
    assert any(ln.split()[:2] == ["retry_of", old] for ln in text.stdout.splitlines())
    text = cli("task", "show", old)
    assert any(ln.split()[:2] == ["rerun_by", new] for ln in text.stdout.splitlines())
    # a second rerun: the old task names the latest; the first rerun keeps its link
    again = json.loads(cli("task", "retry", "--rerun", old, "--json").stdout)["id"]
    assert show(cli, old)["rerun_by"] == again and show(cli, again)["retry_of"] == old
    assert show(cli, new)["retry_of"] == old


def test_a_retry_of_a_failed_task_is_linked_too(cli: Any, real_fleet: Any) -> None:
    old = cli("submit", "g", "--driver-type", "android", "--max-attempts", "1").stdout.strip()
    run_to(real_fleet, old, "failed")
    new = cli("task", "retry", old).stdout.split()[0]
    assert show(cli, new)["retry_of"] == old and show(cli, old)["rerun_by"] == new
    plain = cli("submit", "g").stdout.strip()  # a task submitted as such has no links
    assert (show(cli, plain)["retry_of"], show(cli, plain)["rerun_by"]) == (None, None)


def test_retry_of_must_be_an_existing_task_id(real_fleet: Any) -> None:
    f = real_fleet
    with pytest.raises(InvalidInput):
        f.client.submit_many([{"goal": "g", "retry_of": "bad:id"}])
    with pytest.raises(NotFound, match="nosuchtask"):
        f.client.submit_many([{"goal": "g", "retry_of": "nosuchtask"}])
    assert f.client.list() == []  # nothing was written
    assert list(f.r.scan_iter(match=f.admin.keys.task("nosuchtask") + "*")) == []


def test_submit_lua_checks_retry_of_itself(real_fleet: Any) -> None:
    """The script refuses a malformed id (a caller that skips the Python checks)."""
    from deviceq.producer.submission import items_args, spec_from, task_items

    f = real_fleet
    items = task_items([spec_from({"goal": "g", "retry_of": "x"})])
    items[0]["retry_of"] = "bad:id"
    with pytest.raises(InvalidInput, match="retry_of"):
        f.client._run("submit", items_args(items))
    assert f.client.list() == []


def test_who_retried_is_recorded_on_the_new_task_and_its_event(real_fleet: Any) -> None:
    f = real_fleet
    old = f.client.submit("g", max_attempts=1)
    f.client.cancel(old)
    new = f.client.retry(old, by="alice")
    t = f.client.get(new)
    assert (t.submitted_by, t.retry_of) == ("alice", old)
    sub = [e for e in f.client.events(task=new) if e.type == "submitted"]
    assert [e.fields.get("by") for e in sub] == ["alice"]
    assert f.client.get(old).submitted_by is None  # a plain submission records nobody
    with pytest.raises(InvalidInput, match="submitter"):
        f.client.retry(old, by="not an id")
    assert f.client.get(old).rerun_by == new  # the refused retry wrote nothing


def test_submit_lua_checks_the_submitter_itself(real_fleet: Any) -> None:
    from deviceq.producer.submission import items_args, spec_from, task_items

    f = real_fleet
    items = task_items([spec_from({"goal": "g", "by": "bob"})])
    assert items[0]["by"] == "bob"
    items[0]["by"] = "bad:id"
    with pytest.raises(InvalidInput, match="submitter"):
        f.client._run("submit", items_args(items))
    assert f.client.list() == []
