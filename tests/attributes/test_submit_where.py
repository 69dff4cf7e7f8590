"""``submit --where``: tasks land only on devices whose attributes satisfy every clause (the
scheduler's where permit), the commit checks again in Lua (``where_mismatch``), buckets keep
tasks with different clauses apart, and bad expressions are refused before anything is
written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import Fleet
from deviceq import TaskScheduler
from deviceq.core.errors import InvalidInput


@pytest.fixture
def lab(real_fleet: Fleet) -> Fleet:
    f = real_fleet
    f.add_host("h1", ("old", "android", ()), ("new", "android", ()), ("newest", "android", ()))
    f.admin.set_attributes("old", {"sdk": 30, "model": "Pixel 4", "release": "11.0.1"})
    f.admin.set_attributes("new", {"sdk": 33, "model": "Pixel 7", "release": "13.1.2"})
    f.admin.set_attributes("newest", {"sdk": 34, "model": "Pixel 8", "release": "14.1.2"})
    return f


def place(f: Fleet) -> dict[str, str]:
    res = TaskScheduler(f.admin).assign()
    assert not res.rejected, res.rejected  # (the scheduler proposed no pair the commit refuses)
    return {t.id: t.device_id or "" for t in f.client.list("assigned")}


def test_tasks_land_only_where_their_clauses_hold(lab: Fleet) -> None:
    f = lab
    t33 = f.client.submit(
        "a", driver_type="android", where=["sdk>=33", "model in (Pixel 7, Pixel 9)"]
    )
    t14 = f.client.submit("b", where="release>=14")
    none = f.client.submit("c", where=["sdk>=35"])
    got = place(f)
    assert got == {t33: "new", t14: "newest"}
    assert f.client.get(none).status.value == "queued"
    assert f.client.get(t33).where == ("model in (Pixel 7, Pixel 9)", "sdk>=33")
    # tasks with different clauses wait in different buckets; equal clauses share one
    sigs = {f.r.hget(f.admin.keys.task(t), "sig") for t in (t33, t14, none)}
    assert len(sigs) == 3
    again = f.client.submit("d", where=["sdk >= 35"])
    assert f.r.hget(f.admin.keys.task(again), "sig") == f.r.hget(f.admin.keys.task(none), "sig")
    # once a device says it qualifies, the waiting tasks get it
    f.admin.set_attributes("old", {"sdk": 35})
    got = place(f)
    assert got[none] == "old" or got.get(again) == "old"


def test_the_commit_checks_the_clauses_again(lab: Fleet) -> None:
    f = lab
    tid = f.client.submit("a", where=["sdk>=34"])
    assert f.store.commit([(tid, "new")]) == ["err:where_mismatch"]
    # a device whose attribute changed after the snapshot: refused, not booked
    f.admin.set_attributes("newest", {"sdk": 20})
    assert f.store.commit([(tid, "newest")]) == ["err:where_mismatch"]
    f.admin.set_attributes("newest", {"sdk": 34})
    (ok,) = f.store.commit([(tid, "newest")])
    assert ok.startswith("ok:")


def test_bad_where_is_refused_and_nothing_is_written(lab: Fleet) -> None:
    f = lab
    before = f.r.zcard(f.admin.keys.status("queued"))
    for bad in (["sdk >"], ["has(x y)"], [f"k{i}>1" for i in range(9)]):
        with pytest.raises(InvalidInput):
            f.client.submit("x", where=bad)
    with pytest.raises(InvalidInput, match="roles"):
        f.client.submit("x", roles={"a": "android"}, where=["sdk>1"])
    assert f.r.zcard(f.admin.keys.status("queued")) == before
    # the script refuses a malformed compiled form on its own
    from deviceq.core.script_args import SUBMIT

    item = {"id": "t-raw", "kind": "goal", "goal": "g", "workflow": "", "driver_type": "",
            "tags": "", "priority": 0, "where": "sdk\t>=\tn:abc"}  # fmt: skip
    with pytest.raises(InvalidInput, match="where"):
        f.client._run("submit", [1, SUBMIT.pack([item])])
    assert not f.r.exists(f.admin.keys.task("t-raw"))


def test_cli_submit_where(lab: Fleet, cli: Any, tmp_path: Path) -> None:
    out = cli("submit", "camera test", "--where", "sdk>=33", "--where", "battery>=0", "--json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["where"] == ["battery>=0", "sdk>=33"]
    assert "no device has attribute 'battery'" in out.stderr
    bad = cli("submit", "x", "--where", "sdk >")
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "--where" in bad.stderr
    # submit --file: a bad line refuses the whole file; good lines carry where
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"goal": "f", "where": ["sdk>=34"]}\n{"goal": "g", "where": ["sdk>="]}\n')
    before = len(lab.client.list("queued"))
    refused = cli("submit", "--file", str(tasks))
    assert refused.exit_code != 0 and "line 2" in refused.stderr, refused.output
    assert len(lab.client.list("queued")) == before
    tasks.write_text('{"goal": "f", "where": ["sdk>=34"]}\n')
    res = cli("submit", "--file", str(tasks))
    assert res.exit_code == 0, res.output
    assert lab.client.get(res.stdout.split()[0]).where == ("sdk>=34",)


def test_explain_says_where_matching_stops(lab: Fleet, cli: Any) -> None:
    f = lab
    tid = f.client.submit("a", driver_type="android", where=["sdk>=33", "sdk>=35"])
    out = cli("explain", tid)
    assert out.exit_code == 0, out.output
    text = " ".join(out.stdout.split())
    assert "2 devices have driver type android and sdk>=33; none has sdk>=35 (highest: 34)" \
        in text, text  # fmt: skip
    other = f.client.submit("b", where=["has(gps)"])
    assert "none has attribute gps" in cli("explain", other).stdout
    # a task whose clauses some idle device meets explains as any other (its turn)
    ok = f.client.submit("c", where=["model=Pixel 8"])
    assert "none has" not in cli("explain", ok).stdout


def test_a_schedule_carries_where(lab: Fleet, cli: Any) -> None:
    out = cli("schedule", "add", "nightly", "soak", "--cron", "0 2 * * *", "--where", "sdk>=34",
              "--json")  # fmt: skip
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["spec"]["where"] == ["sdk>=34"]
    bad = cli("schedule", "add", "other", "soak", "--cron", "0 2 * * *", "--where", "sdk >")
    assert bad.exit_code == 2


def test_a_match_far_down_the_idle_order_is_found(real_fleet: Fleet) -> None:
    """100 idle devices fail the clause and idled first; the one that satisfies it idled
    last: the pass reads deeper for the bucket (not just the first devices of the class)."""
    f = real_fleet
    f.add_host("h1", *((f"x{i:03}", "android", ()) for i in range(100)))
    f.admin.set_attributes("x099", {"sdk": 35})
    f.r.zadd(f.admin.keys.idle, {"x099": 9_999_999_999_999})  # (idle last: read last)
    for key in f.r.scan_iter(f.admin.keys.idle + ":c:*"):
        f.r.zadd(key, {"x099": 9_999_999_999_999})
    tid = f.client.submit("rare", where=["sdk>=35"])
    res = TaskScheduler(f.admin).assign()
    assert f.client.get(tid).device_id == "x099" and not res.rejected
