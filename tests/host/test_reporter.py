"""The host's `Reporter` on a real server: reports handed over return at once and are answered
by the reporter thread, which runs each report's ``then`` after its answer; the runs that end
together while the host has others going share one call (the linger), a lone run's report goes
at once, and a failing ``then`` does not stop the reports after it."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from deviceq.host.link import Report
from deviceq.host.redis_link import HostClient
from deviceq.host.reporter import Pending, Reporter
from deviceq.host.runners import RunnerSpec
from deviceq.host.settings import WorkerSettings
from deviceq.host.state import HostState


def _claimed(fleet: Any, n: int) -> tuple[HostClient, list[Report]]:
    """A host of ``n`` devices, each running a claimed task; their ``done`` reports."""
    devices = [(f"d{i}", "android", ()) for i in range(n)]
    h = fleet.add_host("h1", *devices)
    h.start_session("s1")
    tids = [fleet.client.submit("g", driver_type="android") for _ in range(n)]
    assert all(
        a.startswith("ok:")
        for a in fleet.store.commit(list(zip(tids, [d for d, _, _ in devices], strict=True)))
    )
    claimed = h.claim(n)
    assert sorted(a.task.id for a in claimed) == sorted(tids)
    return h, [Report(a.task.id, a.lease_id, "done", None, "fine") for a in claimed]


def _state(runs: list[str]) -> HostState:
    st = HostState(WorkerSettings("h1", ["d0:android"], goal_runner=RunnerSpec("sim")))
    st.runs.update({tid: object() for tid in runs})  # type: ignore[misc]  # (only counted)
    return st


def test_runs_ending_together_share_one_call_and_then_runs_after_the_answer(
    real_fleet: Any,
) -> None:
    h, reports = _claimed(real_fleet, 10)
    reporter = Reporter(_state([r.task_id for r in reports]), h, linger=30.0)
    seen: list[tuple[str, str | None, str]] = []

    def then(p: Pending) -> None:
        seen.append((p.report.task_id, p.answer, threading.current_thread().name))

    pending = []
    for r in reports:
        pending.append(reporter.post(r, {"task": r.task_id}, then))
        # handed over: answered later, by the reporter thread (it waits for the other runs)
        assert not pending[-1].done.is_set() or len(pending) == len(reports)
    for p in pending:
        assert p.done.wait(10), "not answered"
    assert reporter.calls == 1 and reporter.sent == 10  # every run had ended: no longer wait
    assert [p.answer for p in pending] == ["ok:done"] * 10
    deadline = time.monotonic() + 5
    while len(seen) < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(seen) == sorted((r.task_id, "ok:done", "reporter") for r in reports)
    assert all(real_fleet.client.get(r.task_id).status.value == "done" for r in reports)


def test_a_lone_run_is_reported_at_once(real_fleet: Any) -> None:
    h, reports = _claimed(real_fleet, 1)
    reporter = Reporter(_state([reports[0].task_id]), h, linger=30.0)
    t0 = time.monotonic()
    p = reporter.send(reports[0], {})
    assert time.monotonic() - t0 < 10  # not held for the 30 s linger: no other run goes
    assert p.answer == "ok:done" and reporter.calls == 1


def test_a_failing_then_does_not_stop_the_reports_after_it(real_fleet: Any) -> None:
    h, reports = _claimed(real_fleet, 2)
    reporter = Reporter(_state([]), h)

    def boom(p: Pending) -> None:
        raise RuntimeError("bookkeeping bug")

    first = reporter.post(reports[0], {"task": reports[0].task_id}, boom)
    assert first.done.wait(10) and first.answer == "ok:done"
    second = reporter.send(reports[1], {})
    assert second.answer == "ok:done"
    # a report the script refuses is answered, not raised (its lease is no longer current)
    again = reporter.send(reports[1], {})
    assert again.answer is not None and again.answer.startswith(("dup:", "rejected:"))


def test_the_linger_setting_is_checked() -> None:
    from click.testing import CliRunner

    from deviceq.cli import main
    from deviceq.core.errors import ConfigError

    spec = RunnerSpec("sim")
    assert WorkerSettings("h1", ["d0:x"], goal_runner=spec).report_linger == 0.005
    assert WorkerSettings("h1", ["d0:x"], goal_runner=spec, report_linger=0).report_linger == 0
    for bad in (-0.1, 1.5):
        with pytest.raises(ConfigError, match="report_linger"):
            WorkerSettings("h1", ["d0:x"], goal_runner=spec, report_linger=bad)
    out = CliRunner().invoke(main, ["host", "run", "--host-id", "h1", "--device", "d0:x",
                                    "--command", "true", "--report-linger", "2"])  # fmt: skip
    assert out.exit_code == 2 and "--report-linger" in out.output
