"""Next-task hints end to end on a real server: a pass of ``TaskScheduler(plan_ahead=True)`` writes
the next task of each device it made busy (``plan_ahead.lua``), the host's report that frees the
device assigns that task in the same call and its claim part hands it over, and the next pass
hints the device again (``ahead:want``). A hint reserves nothing: idle devices are served
first, and a hint whose task was cancelled or placed elsewhere is not used. With plan-ahead off a
pass neither reads ``ahead:want`` nor writes a hint."""

from __future__ import annotations

import secrets
import shlex
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from deviceq import Client, DeviceReport, PoolAdmin, Report, SchedulerClient
from deviceq.cli import main
from deviceq.host.redis_link import HostClient
from deviceq.scheduler import TaskScheduler
from deviceq.scheduler.placement.rows import IdleDevice
from deviceq.scheduler.plan_ahead import UNHINTED_MAX, AheadHints


def _host(fleet: Any, *devices: str) -> HostClient:
    """Host h1 with ``devices`` (driver type ``x``), in a live session."""
    h = fleet.add_host("h1", *[(d, "x", ()) for d in devices])
    h.start_session("s1")
    h.heartbeat(fleet.snapshots["h1"])
    return h


def _submit(fleet: Any, n: int) -> list[str]:
    return [fleet.client.submit(f"g{i}", driver_type="x") for i in range(n)]


def _hint(fleet: Any, device: str) -> str | None:
    """The task of the device's next-task hint, or None."""
    raw = fleet.r.hget(fleet.admin.keys.device(device), "next_task")
    return None if raw is None else str(raw).partition("|")[2]


def _done(h: HostClient, a: Any) -> tuple[list[str], list[Any]]:
    """Report assignment ``a`` done, claiming up to 4 more in the same call."""
    return h.report_and_claim([Report(a.task.id, a.lease_id, "done", None, "ok")], 4)


@pytest.fixture
def leader(real_fleet: Any) -> TaskScheduler:
    """A leading scheduler with next-task hints on (its hints carry its epoch)."""
    sched = TaskScheduler(real_fleet.admin, plan_ahead=True, owner="s-ahead")
    assert sched.try_lead()
    return sched


def test_the_report_starts_the_hinted_task_and_the_next_pass_hints_again(
    real_fleet: Any, leader: TaskScheduler
) -> None:
    fleet = real_fleet
    h = _host(fleet, "d1")
    t1, t2, t3 = _submit(fleet, 3)
    res = leader.assign()
    assert [a[:2] for a in res.assignments] == [(t1, "d1")]
    # the device just made busy carries the next oldest matching task, fenced by the epoch
    assert (res.hinted, res.hints, res.hint_wanted) == (1, [(t2, "d1")], 0)
    raw = fleet.r.hget(fleet.admin.keys.device("d1"), "next_task")
    assert raw == f"{leader.epoch}|{t2}"
    assert fleet.client.get(t2).status.value == "queued"  # a hint reserves nothing
    assert res.log_fields()["hinted"] == 1
    (a,) = h.claim(1)
    answers, claimed = _done(h, a)
    # the same call assigned the hint and its claim handed it over
    assert answers == ["ok:done"]
    assert [(c.task.id, c.device_id) for c in claimed] == [(t2, "d1")]
    assert fleet.client.get(t2).status.value == "dispatched"
    assert _hint(fleet, "d1") is None
    assert fleet.r.smembers(fleet.admin.keys.ahead_want) == {"d1"}
    # the next pass pops the device from ahead:want and hints it again
    res = leader.assign()
    assert (res.assigned, res.hint_wanted, res.hints) == (0, 1, [(t3, "d1")])
    assert _hint(fleet, "d1") == t3 and not fleet.r.exists(fleet.admin.keys.ahead_want)
    answers, claimed = _done(h, claimed[0])
    assert [c.task.id for c in claimed] == [t3]
    # nothing left to hint: the device is remembered and tried again, nothing is written
    res = leader.assign()
    assert (res.hint_wanted, res.hinted) == (1, 0) and _hint(fleet, "d1") is None
    _done(h, claimed[0])
    assert [fleet.client.get(t).status.value for t in (t1, t2, t3)] == ["done"] * 3


def test_busy_devices_are_hinted_different_tasks(real_fleet: Any, leader: TaskScheduler) -> None:
    fleet = real_fleet
    h = _host(fleet, "d1", "d2")
    t = _submit(fleet, 5)
    res = leader.assign()
    assert {a[0] for a in res.assignments} == set(t[:2])
    assert len(res.hints) == 2 and {d for _, d in res.hints} == {"d1", "d2"}
    assert {task for task, _ in res.hints} == set(t[2:4])  # one task a device, oldest first
    first = h.claim(2)
    _, claimed = _done(h, first[0])
    assert [c.task.id for c in claimed] == [_hint_of(res, first[0].device_id)]
    # the next pass hints that device again: not with the task the other device holds
    res2 = leader.assign()
    assert res2.hints == [(t[4], first[0].device_id)]


def _hint_of(res: Any, device: str) -> str:
    return next(task for task, d in res.hints if d == device)


def test_plan_ahead_off_reads_no_want_and_writes_no_hint(real_fleet: Any) -> None:
    fleet = real_fleet
    h = _host(fleet, "d1")
    t1, t2 = _submit(fleet, 2)
    sched = TaskScheduler(fleet.admin)
    assert sched.hints is None and not sched.reader.plan_ahead
    # a device waiting in ahead:want stays there: the passes never read it
    fleet.r.sadd(fleet.admin.keys.ahead_want, "d9")
    res = sched.assign()
    assert [a[:2] for a in res.assignments] == [(t1, "d1")]
    assert (res.hinted, res.hint_wanted, res.hints) == (0, 0, [])
    assert "hinted" not in res.log_fields()
    assert _hint(fleet, "d1") is None
    (a,) = h.claim(1)
    answers, claimed = _done(h, a)
    assert answers == ["ok:done"] and claimed == []  # the device goes idle; t2 waits a pass
    assert fleet.client.get(t2).status.value == "queued"
    res = sched.assign()
    assert [x[:2] for x in res.assignments] == [(t2, "d1")]
    assert fleet.r.smembers(fleet.admin.keys.ahead_want) == {"d9"}  # never read
    assert _hint(fleet, "d1") is None


def test_a_hint_whose_task_was_cancelled_is_not_used(
    real_fleet: Any, leader: TaskScheduler
) -> None:
    fleet = real_fleet
    h = _host(fleet, "d1")
    t1, t2, t3 = _submit(fleet, 3)
    res = leader.assign()
    assert res.hints == [(t2, "d1")]
    fleet.client.cancel(t2)
    (a,) = h.claim(1)
    answers, claimed = _done(h, a)
    assert answers == ["ok:done"] and claimed == []  # the device just goes idle
    assert fleet.client.get(t2).status.value == "cancelled"
    assert _hint(fleet, "d1") is None
    assert not fleet.r.sismember(fleet.admin.keys.ahead_want, "d1")
    assert fleet.admin.device("d1").reserved_by is None
    res = leader.assign()  # the idle device gets the next task the usual way
    assert [x[:2] for x in res.assignments] == [(t3, "d1")]


def test_idle_devices_are_served_before_a_hint_and_a_hint_placed_elsewhere_is_not_used(
    real_fleet: Any, leader: TaskScheduler
) -> None:
    fleet = real_fleet
    h = _host(fleet, "d1")
    t1, t2, t3 = _submit(fleet, 3)
    res = leader.assign()
    assert res.hints == [(t2, "d1")]
    (a,) = h.claim(1)
    # a device joins, idle: the pass gives it the oldest queued task, d1's hint
    fleet.snapshots["h1"].append(DeviceReport("d2", "x"))
    h.heartbeat(fleet.snapshots["h1"])
    res = leader.assign()
    assert [x[:2] for x in res.assignments] == [(t2, "d2")]
    # the next task is hinted to one of the two busy devices (d1's hint is dead)
    assert [task for task, _ in res.hints] == [t3]
    (b,) = h.claim(1)
    assert b.task.id == t2
    _, claimed = _done(h, a if res.hints[0][1] == "d1" else b)
    assert [c.task.id for c in claimed] == [t3]


def test_a_stale_hint_is_refused_when_used(real_fleet: Any, leader: TaskScheduler) -> None:
    fleet = real_fleet
    h = _host(fleet, "d1", "d2")
    t1, t2, t3 = _submit(fleet, 3)
    res = leader.assign()
    assert {x[0] for x in res.assignments} == {t1, t2} and res.hints
    (task, device) = res.hints[0]
    other = "d2" if device == "d1" else "d1"
    running = {x.device_id: x for x in h.claim(2)}
    # the other device's run ends first: no hint for it, it goes idle and a pass places the
    # task hinted to ``device`` on it (idle devices first)
    _, claimed = _done(h, running[other])
    assert claimed == []
    res = leader.assign()
    assert [x[:2] for x in res.assignments] == [(task, other)]
    assert _hint(fleet, device) == task  # (nothing else to hint: the old hint stays)
    h.claim(1)
    # the hinted device's report finds its task taken: the device just goes idle
    answers, claimed = _done(h, running[device])
    assert answers == ["ok:done"] and claimed == []
    assert _hint(fleet, device) is None
    assert fleet.client.get(task).status.value == "dispatched"
    assert fleet.client.get(task).device_id == other


def test_cli_run_once_with_plan_ahead_writes_the_hint(real_fleet: Any, redis_url: str) -> None:
    fleet = real_fleet
    _host(fleet, "d1")
    t1, t2 = _submit(fleet, 2)
    args = ["--redis-url", redis_url, "--pool", fleet.pool, "--log-format", "json"]
    res = CliRunner().invoke(main, [*args, "scheduler", "run", "--once", "--plan-ahead"])
    assert res.exit_code == 0, res.output
    assert fleet.client.get(t1).status.value == "assigned"
    assert _hint(fleet, "d1") == t2
    assert '"msg": "pass"' in res.output and '"hinted": 1' in res.output


def _wait_hint(fleet: Any, device: str, timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while (got := _hint(fleet, device)) is None:
        assert time.monotonic() < deadline, f"{device} was not hinted"
        time.sleep(0.01)
    return got


def test_the_daemon_hints_again_after_each_report(real_fleet: Any) -> None:
    fleet = real_fleet
    h = _host(fleet, "d1")
    tasks = _submit(fleet, 5)
    sched = TaskScheduler(fleet.admin, owner="daemon-ahead", plan_ahead=True)
    th = threading.Thread(target=sched.run, kwargs={"tick": 60.0}, daemon=True)
    th.start()
    try:
        deadline = time.monotonic() + 5
        while not (got := h.claim(1)):
            assert time.monotonic() < deadline, "nothing assigned"
            time.sleep(0.01)
        ran = [got[0].task.id]
        # each report starts the hinted task; woken by the report, the daemon hints again
        for _ in range(4):
            assert _wait_hint(fleet, "d1") == tasks[len(ran)]
            _, claimed = _done(h, got[0])
            assert [c.task.id for c in claimed] == [tasks[len(ran)]]
            got = claimed
            ran.append(got[0].task.id)
        _done(h, got[0])
    finally:
        sched.stop(wake=True)
        th.join(5)
    assert not th.is_alive()
    assert ran == tasks
    assert [fleet.client.get(t).status.value for t in tasks] == ["done"] * 5


def _row(device: str) -> IdleDevice:
    return IdleDevice(device, "h1", "x", frozenset())


def test_the_memory_of_hints_is_bounded_and_skips_what_it_cannot_hint() -> None:
    hints = AheadHints()
    hints.observe([_row("d1"), _row("d2"), _row("d3")])
    # a wanted device whose row is unknown is skipped; an idle one is not hinted
    got = hints.candidates([_row("d1")], ["d2", "d9", "d3"], {"d3"})
    assert [d.device_id for d in got] == ["d1", "d2"]
    hints.wrote([("t1", "d1")], got, {"t1": "s"})
    assert hints.hinted == {"d1": ("t1", "s")} and list(hints.unhinted) == ["d2"]
    # a hinted task is left out of the next plans (one more head read for it)
    tasks, extra = hints.excluded({"t5": "s"})
    assert tasks == {"t1", "t5"} and extra == {"s": 2}
    # d1's task placed on another device: d1 is hinted again, with d2 (left without)
    assert {d.device_id for d in hints.candidates([], [], set(), ["t1"])} == {"d1", "d2"}
    # a device seen idle holds no hint
    hints.observe([_row("d2")])
    assert not hints.unhinted
    many = [_row(f"e{i}") for i in range(UNHINTED_MAX + 10)]
    hints.observe(many)
    hints.wrote([], many, {})
    assert len(hints.unhinted) == UNHINTED_MAX and "e0" not in hints.unhinted


def _acl_user(r: Any, pool: str, role: str, tmp: Path, port: int, host: str = "") -> str:
    """A Redis URL of the ACL user ``deviceq acl`` prints for ``role`` (made on the server)."""
    password = secrets.token_hex(16)
    pw = tmp / f"{role}.pw"
    pw.write_text(password + "\n")
    args = ["acl", "--pool", pool, "--role", role, "--password-file", str(pw)]
    res = CliRunner().invoke(main, [*args, *(["--host-id", host] if host else [])])
    assert res.exit_code == 0, res.output
    (line,) = res.stdout.splitlines()
    r.execute_command(*shlex.split(line))
    return f"redis://{line.split()[2]}:{password}@127.0.0.1:{port}/0"


def test_plan_ahead_runs_under_the_scheduler_and_host_acl_users(
    real_r: Any, redis_server: Any, pool: str, tmp_path: Path
) -> None:
    port = redis_server.port
    urls = {
        role: _acl_user(real_r, pool, role, tmp_path, port, "h1" if role == "host" else "")
        for role in ("operator", "producer", "scheduler", "host")
    }
    users = [u.split("//")[1].split(":")[0] for u in urls.values()]
    try:
        real_r.execute_command("ACL", "LOG", "RESET")
        op, prod = PoolAdmin(urls["operator"], pool), Client(urls["producer"], pool)
        sched = TaskScheduler(SchedulerClient(urls["scheduler"], pool), plan_ahead=True, owner="s")
        assert sched.try_lead()
        h = HostClient(urls["host"], pool, "h1", op.add_host("h1"))
        h.start_session("s1")
        h.heartbeat([DeviceReport("d1", "x")])
        t1, t2, t3 = (prod.submit(f"g{i}", driver_type="x") for i in range(3))
        assert sched.assign().hints == [(t2, "d1")]
        (a,) = h.claim(1)
        _, claimed = _done(h, a)
        assert [c.task.id for c in claimed] == [t2]
        res = sched.assign()  # pops ahead:want, writes the next hint
        assert (res.hint_wanted, res.hints) == (1, [(t3, "d1")])
        denied = [e for e in real_r.acl_log(count=100) if dict(e).get("username") in users]
        assert denied == []
    finally:
        for user in users:
            real_r.execute_command("ACL", "DELUSER", user)
