"""A multi-device task's roles carry --where clauses of their own (the Python API, the command
line's ``--role 'phone=android where sdk>=33'``, submit --file, schedules): the planner gives a
role only a device whose attributes satisfy them, ``gang_assign.lua`` checks them again
atomically (``where_mismatch@ROLE``), and the pool's ``prefer`` orders a role's devices as it
does a single task's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import Fleet
from deviceq import TaskScheduler
from deviceq.core.errors import InvalidInput
from deviceq.core.script_args import GANG_ASSIGN


@pytest.fixture
def lab(real_fleet: Fleet) -> Fleet:
    f = real_fleet
    f.add_host("h1", ("old", "android", ()), ("new", "android", ()), ("web", "browser", ()))
    f.add_host("h2", ("mid", "android", ()))
    f.admin.set_attributes("old", {"sdk": 30, "battery": 95})
    f.admin.set_attributes("mid", {"sdk": 33, "battery": 40})
    f.admin.set_attributes("new", {"sdk": 34, "battery": 60})
    return f


def parts(f: Fleet, tid: str) -> dict[str, str]:
    t = f.client.get(tid)
    return {n: r.device_id or "" for n, r in (t.roles or {}).items()}


def test_a_role_takes_only_a_device_its_where_allows(lab: Fleet) -> None:
    f = lab
    tid = f.client.submit(
        "pair", roles={"phone": {"driver_type": "android", "where": ["sdk>=34"]}, "web": "browser"}
    )
    assert f.client.get(tid).roles["phone"].where == ("sdk>=34",)  # type: ignore[index]
    TaskScheduler(f.admin).assign()
    assert parts(f, tid) == {"phone": "new", "web": "web"}
    # none satisfies it: the task waits, nothing is taken
    other = f.client.submit("x", roles={"a": "android where sdk>=40", "b": "browser"})
    assert f.client.get(other).roles["a"].where == ("sdk>=40",)  # type: ignore[index]
    TaskScheduler(f.admin).assign()
    assert f.client.get(other).status.value == "queued"


def test_the_commit_checks_a_roles_where_again(lab: Fleet) -> None:
    f = lab
    tid = f.client.submit("pair", roles={"phone": "android where sdk>=33", "web": "browser"})
    refused = f.store.commit_gang(tid, ["old", "web"], "")
    assert refused == "err:where_mismatch@phone"
    assert f.client.get(tid).status.value == "queued"
    assert f.store.commit_gang(tid, ["mid", "web"], "").startswith("ok:")


def test_bad_role_where_is_refused_and_nothing_is_written(lab: Fleet) -> None:
    f = lab
    before = f.r.zcard(f.admin.keys.gangs)
    for roles in ({"a": "android where sdk >"}, {"a": {"driver_type": "android", "where": 3}}):
        with pytest.raises(InvalidInput):
            f.client.submit("x", roles=roles)
    from deviceq.core.script_args import SUBMIT

    base = {"id": "t-raw", "kind": "goal", "goal": "g", "workflow": "", "driver_type": "",
            "tags": "", "priority": 0, "roles": "a=android:"}  # fmt: skip
    for bad in ('{"b":"sdk\\t>=\\tn:3"}', '{"a":"sdk\\t>=\\tn:abc"}', "[", '{"a":""}'):
        with pytest.raises(InvalidInput):
            f.client._run("submit", [1, SUBMIT.pack([{**base, "role_where": bad}])])
    with pytest.raises(InvalidInput, match="role_where"):
        f.client._run("submit", [1, SUBMIT.pack([{**base, "roles": None,
                                                   "role_where": '{"a":"x\\thas"}'}])])  # fmt: skip
    assert not f.r.exists(f.admin.keys.task("t-raw"))
    assert f.r.zcard(f.admin.keys.gangs) == before
    assert GANG_ASSIGN  # (the commit's schema is unchanged: one device per role)


@pytest.mark.parametrize("prefer,phone", [("max:battery", "old"), ("min:battery", "mid"),
                                          ("max:sdk", "new")])  # fmt: skip
def test_prefer_orders_a_roles_devices(lab: Fleet, prefer: str, phone: str) -> None:
    f = lab
    f.admin.set_config("prefer", prefer)
    tid = f.client.submit("pair", roles={"phone": "android", "web": "browser"})
    TaskScheduler(f.admin).assign()
    assert parts(f, tid) == {"phone": phone, "web": "web"}


def test_prefer_and_where_together_for_a_role(lab: Fleet) -> None:
    f = lab
    f.admin.set_config("prefer", "max:battery")
    tid = f.client.submit("pair", roles={"phone": "android where sdk>=33", "web": "browser"})
    TaskScheduler(f.admin).assign()
    assert parts(f, tid) == {"phone": "new", "web": "web"}  # old is fuller but sdk 30


def test_cli_file_and_schedule_roles_carry_where(lab: Fleet, cli: Any, tmp_path: Path) -> None:
    out = cli("submit", "pair", "--role", "phone=android where sdk>=34 where battry>1",
              "--role", "web=browser", "--json")  # fmt: skip
    assert out.exit_code == 0, out.output
    row = json.loads(out.stdout)
    assert row["roles"]["phone"]["where"] == ["battry>1", "sdk>=34"]
    assert "no device has attribute 'battry'" in out.stderr
    bad = cli("submit", "pair", "--role", "phone=android where sdk >", "--role", "web=browser")
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.output
    tasks = tmp_path / "t.jsonl"
    phone = {"driver_type": "android", "where": ["sdk>=33", "gpz=1"]}
    tasks.write_text(json.dumps({"goal": "g", "roles": {"phone": phone, "web": "browser"}}) + "\n")
    res = cli("submit", "--file", str(tasks))
    assert res.exit_code == 0, res.output
    assert "no device has attribute 'gpz'" in res.stderr
    t = lab.client.get(res.stdout.split()[0])
    assert t.roles["phone"].where == ("gpz=1", "sdk>=33")  # type: ignore[index]
    sch = cli("schedule", "add", "nightly", "pair", "--cron", "0 2 * * *", "--role",
              "phone=android where sdkk>=33", "--role", "web=browser", "--json")  # fmt: skip
    assert sch.exit_code == 0, sch.output
    assert "no device has attribute 'sdkk'" in sch.stderr
    assert json.loads(sch.stdout)["spec"]["roles"]["phone"] == "android where sdkk>=33"
