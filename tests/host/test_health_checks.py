"""Device health checks: a host declares a check per driver type
(``host run --health-check DRIVER=TEMPLATE``); it runs when a device joins, every N tasks,
every S seconds and after an infrastructure failure. A failing device leaves service (no task
goes to it) and returns when a check passes; a check goes through the same reservation as a
task (``lua/device_health.lua``), so it never overlaps a task on the device. Real Redis
throughout; the end-to-end tests run real scheduler and host daemons."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from deviceq import PoolAdmin, TaskScheduler, TaskStatus
from deviceq.core.errors import Busy, DeviceOwned, InvalidInput, NotFound
from deviceq.host.health import JOINING, HealthChecker
from deviceq.host.link import HEALTH_OUTPUT_BYTES
from deviceq.host.redis_link import HostClient
from deviceq.host.runners import RunnerSpec
from deviceq.host.settings import WorkerSettings
from deviceq.host.state import HostState
from deviceq.ops.explain import explain
from deviceq.ops.verify import verify
from harness import Deployment, deviceq, wait_for


def idle(admin: PoolAdmin) -> set[str]:
    return set(admin.redis.zrange(admin.keys.idle, 0, -1))  # type: ignore[arg-type]


def event_types(admin: PoolAdmin) -> list[str]:
    got = admin.redis.xrange(admin.keys.events, count=10_000)
    return [f["type"] for _, f in got]  # type: ignore[union-attr]


def health(admin: PoolAdmin, did: str) -> str | None:
    """The device's health (None: never checked, or not registered yet)."""
    h = admin.redis.hget(admin.keys.device(did), "health")
    return str(h) if h else None


# -- the script: begin / end / clear -------------------------------------------------------------
def test_a_check_takes_the_device_out_of_the_candidates_until_a_healthy_result(
    real_fleet: Any,
) -> None:
    f = real_fleet
    h = f.add_host("h1", ("d1", "x", ()), ("d2", "x", ()))
    assert idle(f.admin) == {"d1", "d2"}
    assert h.health_begin("d1") is True
    assert health(f.admin, "d1") == "checking" and idle(f.admin) == {"d2"}
    # a stale snapshot cannot give it a task: assign refuses a checking device
    tid = f.client.submit("t", driver_type="x")
    assert f.store.commit([(tid, "d1")]) == ["err:device_checking"]
    # a heartbeat saying "idle" does not bring it back while it is checked
    f.beat("h1")
    assert idle(f.admin) == {"d2"}
    assert h.health_end("d1", False, "adb: device offline\n", "exit code 1") == "unhealthy"
    d = f.admin.device("d1")
    assert (d.health, d.health_reason, d.health_output) == (
        "unhealthy",
        "exit code 1",
        "adb: device offline\n",
    )
    assert d.health_checked_at and abs(d.health_checked_at - f.admin.server_time_ms()) < 5000
    f.beat("h1")
    assert idle(f.admin) == {"d2"}
    assert f.store.commit([(tid, "d1")]) == ["err:device_unhealthy"]
    # an operator's quarantine round trip does not put an unhealthy device back either
    f.admin.quarantine("d1", True)
    f.admin.quarantine("d1", False)
    assert idle(f.admin) == {"d2"}
    assert verify(f.admin).ok
    # a passing check returns it to service
    assert h.health_begin("d1") is True
    assert h.health_end("d1", True, "ok") == "healthy"
    d = f.admin.device("d1")
    assert (d.health, d.health_reason, d.health_output) == ("healthy", None, "ok")
    assert idle(f.admin) == {"d1", "d2"}
    assert f.store.commit([(tid, "d1")])[0].startswith("ok:")
    types = event_types(f.admin)
    assert types.count("health_check_started") == 2
    assert "device_unhealthy" in types and "device_healthy" in types


def test_begin_is_refused_for_a_reserved_or_booked_device_and_changes_nothing(
    real_fleet: Any,
) -> None:
    f = real_fleet
    h = f.add_host("h1", ("d1", "x", ()), ("d2", "x", ()))
    tid = f.client.submit("t", driver_type="x")
    assert f.store.commit([(tid, "d1")])[0].startswith("ok:")
    f.admin.reserve("d2", 60_000, "alice")
    before = {d: f.r.hgetall(f.admin.keys.device(d)) for d in ("d1", "d2")}
    n_events = f.r.xlen(f.admin.keys.events)
    assert h.health_begin("d1") is False  # a task's lease holds it
    assert h.health_begin("d2") is False  # a person's reservation holds it
    assert {d: f.r.hgetall(f.admin.keys.device(d)) for d in ("d1", "d2")} == before
    assert f.r.xlen(f.admin.keys.events) == n_events
    # once the task is done, the check may begin; a booking cannot be taken while it runs
    (a,) = h.claim(1)
    h.report(tid, a.lease_id, "done")
    f.admin.release("d2")
    assert h.health_begin("d1") is True
    with pytest.raises(Exception, match="health check"):
        f.admin.reserve("d1", 60_000, "bob")


def test_next_marks_a_leased_device_for_a_check_after_its_task(real_fleet: Any) -> None:
    """``next`` (sent before the report of a run whose device is due a check) is accepted
    while the lease holds the device: when the task ends the device stays out of the idle
    candidates (no task can take it first), and ``begin`` then takes it."""
    f = real_fleet
    h = f.add_host("h1", ("d1", "x", ()))
    tid = f.client.submit("t", driver_type="x")
    assert f.store.commit([(tid, "d1")])[0].startswith("ok:")
    (a,) = h.claim(1)
    assert h.health_next("d1") is True
    assert health(f.admin, "d1") == "checking"
    assert f.admin.device("d1").reserved_by == tid  # the task keeps running
    with pytest.raises(Busy):  # no result while the task holds it: no check can have run
        h.health_end("d1", True, "")
    assert h.health_begin("d1") is False
    h.report(tid, a.lease_id, "done")
    f.beat("h1")
    assert idle(f.admin) == set()
    t2 = f.client.submit("t2", driver_type="x")
    assert f.store.commit([(t2, "d1")]) == ["err:device_checking"]
    assert h.health_begin("d1") is True
    h.health_end("d1", True, "ok")
    assert idle(f.admin) == {"d1"} and health(f.admin, "d1") == "healthy"
    assert "health_check_due" in event_types(f.admin)


def test_bad_calls_are_refused(real_fleet: Any) -> None:
    f = real_fleet
    h1 = f.add_host("h1", ("d1", "x", ()))
    h2 = f.add_host("h2", ("d2", "x", ()))
    with pytest.raises(DeviceOwned):
        h2.health_begin("d1")
    with pytest.raises(NotFound):
        h1.health_begin("nope")
    with pytest.raises(NotFound, match="no health check in progress"):
        h1.health_end("d1", True, "")
    with pytest.raises(InvalidInput):
        h1._run("device_health", [*h1._auth(), "end", "d1", "maybe", "", ""])
    with pytest.raises(InvalidInput):
        h1._run("device_health", [*h1._auth(), "begin", "d1", "extra"])
    assert health(f.admin, "d1") is None and idle(f.admin) == {"d1", "d2"}


def test_the_output_tail_is_bounded_and_never_holds_the_token(real_fleet: Any) -> None:
    f = real_fleet
    h = f.add_host("h1", ("d1", "x", ()))
    token = f.tokens["h1"]
    out = "start\n" + "x" * 5000 + f"\nleaked {token}\nthe end\n"
    assert h.health_begin("d1")
    h.health_end("d1", False, out, f"bad {token}")
    d = f.admin.device("d1")
    assert d.health_output is not None and d.health_reason is not None
    assert len(d.health_output.encode()) <= HEALTH_OUTPUT_BYTES
    assert d.health_output.endswith("the end\n") and "start" not in d.health_output
    assert token not in d.health_output and token not in d.health_reason
    assert "[host token]" in d.health_output


def test_clear_forgets_the_health_and_returns_the_device(real_fleet: Any) -> None:
    f = real_fleet
    h = f.add_host("h1", ("d1", "x", ()))
    assert h.health_begin("d1")
    h.health_end("d1", False, "", "broken")
    assert idle(f.admin) == set()
    assert h.health_clear("d1") == "unhealthy"
    assert health(f.admin, "d1") is None and idle(f.admin) == {"d1"}


def test_bad_health_check_options_exit_2_and_touch_nothing(redis_url: str, pool: str) -> None:
    base = ["host", "run", "--host-id", "h1", "--token", "t" * 32, "--device", "d1:x",
            "--command", "true"]  # fmt: skip
    for bad, msg in [
        (["--health-check", "x"], "use DRIVER=TEMPLATE"),
        (["--health-check", "x="], "use DRIVER=TEMPLATE"),
        (["--health-check", "b@d=true"], "driver type"),
        (["--health-check", "x=check {goal}"], "unknown placeholder {goal}"),
        (["--health-check", "x=true", "--health-check", "x=false"], "given twice"),
        (["--health-check", "x='unclosed"], "bad command template"),
    ]:
        out = deviceq(redis_url, pool, *base, *bad)
        assert out.returncode == 2, (bad, out.stdout, out.stderr)
        assert msg in out.stderr and "--health-check" in out.stderr, (bad, out.stderr)
    out = deviceq(redis_url, pool, *base, "--health-every-tasks", "3")
    assert out.returncode != 0 and "need a --health-check" in out.stderr, out.stderr
    r = PoolAdmin(redis_url, pool).redis
    assert not list(r.scan_iter(match=f"dq:{{{pool}}}:*"))


# -- end to end: real daemons --------------------------------------------------------------------
def check_template(tmp: Path) -> str:
    """A check that records each run and fails while ``broken-DEVICE`` exists."""
    return (
        # (both lines on stderr: stdout and stderr are read apart, so between the two
        # streams arrival order decides which line is the output's last)
        f"x=sh -c 'echo probing {{device_id}} >&2; echo {{device_id}} >> {tmp}/checks; "
        f"if test -e {tmp}/broken-{{device_id}}; then echo no usb >&2; exit 1; fi'"
    )


def test_a_failing_device_leaves_service_and_returns_when_its_check_passes(
    deploy: Deployment, cli: Any, tmp_path: Path
) -> None:
    d = deploy
    (tmp_path / "broken-d1").touch()
    d.scheduler()
    d.command_host("h1", "d1:x", "d2:x", extra=(
        "--health-check", check_template(tmp_path), "--health-every-seconds", "1"))  # fmt: skip
    wait_for(lambda: health(d.admin, "d1") == "unhealthy", 20, "d1 unhealthy")
    wait_for(lambda: health(d.admin, "d2") == "healthy", 20, "d2 healthy")
    show = json.loads(cli("device", "show", "d1", "--json").stdout)
    assert show["health"] == "unhealthy" and show["effective_state"] == "unhealthy"
    assert show["health_reason"] == "exit code 1: no usb"
    assert "probing d1" in show["health_output"] and "no usb" in show["health_output"]
    assert show["health_checked_at"] > 0
    assert "unhealthy" in cli("device", "list").stdout
    listed = json.loads(cli("device", "list", "--state", "unhealthy", "--json").stdout)
    assert [(x["device_id"], x["why"]) for x in listed] == [("d1", "exit code 1: no usb")]
    # while d1 is unhealthy every task runs on d2 (d1 is re-checked every second meanwhile)
    ids = d.client.submit_many([{"goal": "sleep 0.2", "driver_type": "x"}] * 6)
    done = d.wait_all(ids, 60)
    assert [t.status for t in done] == [TaskStatus.done] * 6
    assert {t.device_id for t in done} == {"d2"}
    checks_d1 = (tmp_path / "checks").read_text().split().count("d1")
    assert checks_d1 >= 2, "the unhealthy device was not re-checked"
    # fixed: the next check passes, the device is back in service and gets work again
    (tmp_path / "broken-d1").unlink()
    wait_for(lambda: health(d.admin, "d1") == "healthy", 20, "d1 healthy again")
    assert "d1" in idle(d.admin) or d.admin.device("d1").reserved_by
    show = json.loads(cli("device", "show", "d1", "--json").stdout)
    assert show["health_reason"] is None and "no usb" not in show["health_output"]
    d.admin.quarantine("d2", True)
    tid = d.client.submit("true", driver_type="x")
    t = d.client.wait(tid, timeout=30)
    assert t.status == TaskStatus.done and t.device_id == "d1"
    assert verify(d.admin).ok


def intervals(path: Path) -> dict[str, list[tuple[float, float, str]]]:
    """Per device, the (start, end, what) of every task run and check, from their log (one
    still running when it is read ends at infinity)."""
    opened: dict[tuple[str, str], float] = {}
    out: dict[str, list[tuple[float, float, str]]] = {}
    for line in path.read_text().splitlines():
        what, edge, dev, ts = line.split()
        if edge == "start":
            opened[(what, dev)] = float(ts)
        else:
            out.setdefault(dev, []).append((opened.pop((what, dev)), float(ts), what))
    for (what, dev), start in opened.items():
        out.setdefault(dev, []).append((start, float("inf"), what))
    return out


def test_a_check_never_runs_while_a_task_holds_the_device(
    deploy: Deployment, tmp_path: Path
) -> None:
    """Tasks (0.6 s) and checks (0.2 s) on two devices both append their start and end (wall
    clock) to one log; with a check due after every task and every 0.2 s (so checks fall due
    in the middle of tasks), checks keep competing with the stream of tasks. No interval of
    one device overlaps another."""
    d = deploy
    log = tmp_path / "runs"

    def stamp(what: str, dev: str, secs: float) -> str:
        return (f"echo {what} start {dev} $(date +%s.%N) >> {log}; sleep {secs}; "
                f"echo {what} end {dev} $(date +%s.%N) >> {log}")  # fmt: skip

    d.scheduler()
    d.host("h1", "d1:x", "d2:x", extra=(
        "--command", f"sh -c '{stamp('task', '{device_id}', 0.6)}'",
        "--health-check", f"x=sh -c '{stamp('check', '{device_id}', 0.2)}'",
        "--health-every-tasks", "1", "--health-every-seconds", "0.2"))  # fmt: skip
    wait_for(lambda: health(d.admin, "d1") == health(d.admin, "d2") == "healthy", 20, "healthy")
    ids = d.client.submit_many([{"goal": "x", "driver_type": "x"}] * 12)
    done = d.wait_all(ids, 90)
    assert [t.status for t in done] == [TaskStatus.done] * 12

    def counted() -> tuple[int, int]:
        runs = intervals(log)
        return tuple(sum(1 for v in runs.values() for _, _, w in v if w == kind)  # type: ignore[return-value]
                     for kind in ("task", "check"))  # fmt: skip

    # 2 joining + 1 after each task (the one after the last task ends after its report)
    wait_for(lambda: counted()[1] >= 14, 30, "a check after every task")
    tasks, checks = counted()
    assert tasks == 12 and checks >= 14, (tasks, checks)
    runs = intervals(log)
    for dev, spans in runs.items():
        spans.sort()
        for (s1, e1, w1), (s2, e2, w2) in zip(spans, spans[1:], strict=False):
            assert s2 >= e1, f"{dev}: {w1} {s1:.3f}-{e1:.3f} overlaps {w2} {s2:.3f}-{e2:.3f}"
            # the check due after a task is marked before its report (`next`): the busy
            # scheduler never gets the device for another task first
            assert (w1, w2) != ("task", "task"), f"{dev}: two tasks in a row at {s2:.3f}"
    assert verify(d.admin).ok


def test_checks_run_every_n_tasks_and_after_an_infrastructure_failure(
    deploy: Deployment, tmp_path: Path
) -> None:
    d = deploy
    d.scheduler()
    d.command_host("h1", "d1:x", extra=(
        "--health-check", check_template(tmp_path), "--health-every-tasks", "3",
        "--infra-exit-code", "75"))  # fmt: skip

    def checks() -> int:
        p = tmp_path / "checks"
        return len(p.read_text().split()) if p.exists() else 0

    wait_for(lambda: health(d.admin, "d1") == "healthy", 20, "joining check")
    assert checks() == 1
    seen = []
    for i in range(1, 7):
        t = d.client.wait(d.client.submit("true", driver_type="x"), timeout=30)
        assert t.status == TaskStatus.done
        if i % 3 == 0:
            wait_for(lambda i=i: checks() == 1 + i // 3, 10, f"the check after task {i}")
        else:
            time.sleep(0.8)  # time for a check that should not happen
        seen.append(checks())
    assert seen == [1, 1, 2, 2, 2, 3]
    # an infrastructure failure (exit 75) brings a check at once, whatever the count
    t = d.client.wait(d.client.submit("exit 75", driver_type="x", max_attempts=1), timeout=30)
    assert t.status == TaskStatus.failed and t.failure_kind == "infrastructure"
    wait_for(lambda: checks() == 4, 10, "the check after an infrastructure failure")
    # a task's own failure (runner_failed) does not
    t = d.client.wait(d.client.submit("exit 1", driver_type="x", max_attempts=1), timeout=30)
    assert t.failure_kind == "runner_failed"
    time.sleep(1.0)
    assert checks() == 4


def test_explain_says_when_the_only_matching_devices_are_unhealthy(real_fleet: Any) -> None:
    f = real_fleet
    h = f.add_host("h1", ("d1", "x", ()), ("d2", "y", ()))
    assert h.health_begin("d1")
    h.health_end("d1", False, "no usb", "exit code 1")
    tid = f.client.submit("t", driver_type="x")
    exp = explain(f.admin, tid)
    assert exp.counts["unhealthy"] == 1 and exp.counts["idle"] == 0
    assert [r.code for r in exp.reasons][:1] == ["unhealthy"]
    assert "health check failed" in exp.summary, exp.summary
    assert h.health_begin("d1")
    assert explain(f.admin, tid).counts["checking"] == 1


def test_a_check_past_its_timeout_is_killed_and_the_device_unhealthy(tmp_path: Path) -> None:
    settings = WorkerSettings(
        host_id="h1", devices=["d1:x"], goal_runner=RunnerSpec("sim"),
        health_check={"x": f"sh -c 'echo started; sleep 5; touch {tmp_path}/finished'"},
        health_check_timeout=0.5,
    )  # fmt: skip
    checker = HealthChecker(HostState(settings), host=None)  # type: ignore[arg-type]
    started = time.monotonic()
    healthy, output, reason = checker.run_check(settings.devices[0])
    assert time.monotonic() - started < 3.0
    assert (healthy, reason) == (False, "timed out after 0.5 s")
    assert "started" in output
    time.sleep(5.0)
    assert not (tmp_path / "finished").exists(), "the check's process outlived its timeout"


def test_a_new_device_is_never_an_idle_candidate_before_its_joining_check(
    real_fleet: Any, tmp_path: Path
) -> None:
    """The daemon's start, step by step on real Redis: d1 is registered already, d2 is new.
    The first heartbeat registers d2 as busy (joining), so neither is among the idle
    candidates before `prepare` takes both for their check; after the checks and the next
    heartbeat both are."""
    f = real_fleet
    f.add_host("h1", ("d1", "x", ()))
    settings = WorkerSettings(
        host_id="h1", devices=["d1:x", "d2:x"], goal_runner=RunnerSpec("sim"),
        health_check={"x": "true"},
    )  # fmt: skip
    state = HostState(settings)
    host = HostClient(f.r, f.pool, "h1", f.tokens["h1"])
    checker = HealthChecker(state, host)
    checker.prepare()  # d1 taken; d2 unknown yet
    assert health(f.admin, "d1") == "checking" and idle(f.admin) == set()
    first = checker.first_snapshot(state.snapshot())
    assert {r.device_id: (r.state.value, r.reason) for r in first} == {
        "d1": ("idle", ""), "d2": ("busy", JOINING)}  # fmt: skip
    host.heartbeat(first)
    assert idle(f.admin) == set(), "a device became a candidate before its joining check"
    tid = f.client.submit("g", driver_type="x")
    assert TaskScheduler(f.admin).assign().assigned == 0
    checker.prepare()  # now d2 is registered: taken too
    assert health(f.admin, "d2") == "checking"
    for did in ("d1", "d2"):
        assert checker.check(did, "joined") is True
    host.heartbeat(state.snapshot())
    assert idle(f.admin) == {"d1", "d2"}
    assert TaskScheduler(f.admin).assign().assigned == 1
    assert f.client.get(tid).status == TaskStatus.assigned


def test_a_failed_command_checks_reason_is_its_last_line_on_stderr() -> None:
    """stdout and stderr are read apart: a line printed on stdout after the error (or
    arriving after it) does not become the reason."""
    from deviceq.host.health_checks import build_check
    from deviceq.host.runners import Task

    check = build_check(
        "sh -c 'echo probing; echo no usb >&2; sleep 0.2; echo cleanup done; exit 3'",
        timeout=10,
        term_grace=1,
    )
    healthy, output, reason = check(Task(goal="", task_id="h", device_id="d1", driver_type="x"))
    assert not healthy
    assert reason == "exit code 3: no usb"
    assert "cleanup done" in output and "probing" in output
    # without stderr, the output's last line
    check = build_check("sh -c 'echo first; echo last words; exit 1'", timeout=10, term_grace=1)
    assert check(Task(goal="", task_id="h", device_id="d1", driver_type="x"))[2] == (
        "exit code 1: last words"
    )
