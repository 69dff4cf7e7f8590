"""TaskDispatcher: outcome mapping (done, runner_failed, runner_error, timeout, cancelled),
workflow tasks loaded from Redis, abandoned runners; each for thread and async runners alike.
Assignments are real ones: submitted, committed and claimed on the private Redis server."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from deviceq import Assignment, FailureKind
from deviceq.host.dispatcher import TaskDispatcher
from deviceq.host.runners import (
    AsyncCommandRunner,
    CommandRunner,
    LoopEvent,
    Outcome,
    Task,
    run_steps,
)
from runner_kinds import KINDS, dispatch, python


def command(kind: str, template: str, **options: object) -> CommandRunner | AsyncCommandRunner:
    return (AsyncCommandRunner if kind == "async" else CommandRunner)(template, **options)  # type: ignore[arg-type]


def claim_one(fleet, *, goal: str | None = None, workflow: str | None = None) -> Assignment:
    h = fleet.add_host("h1", ("d1", "android", ("wifi",)))
    tid = fleet.client.submit(goal, workflow=workflow, driver_type="android", max_attempts=2)
    assert fleet.store.commit([(tid, "d1")])[0].startswith("ok:")
    (a,) = h.claim(1)
    return a


@pytest.mark.parametrize("kind", KINDS)
def test_goal_done_with_runner_result_and_task_fields(real_fleet, kind: str) -> None:
    a = claim_one(real_fleet, goal="say hi")
    seen: list[Task] = []

    def runner(task: Task) -> Outcome:
        seen.append(task)
        return Outcome.success(f"said {task.goal}")

    deadline = time.monotonic() + 30
    d = TaskDispatcher(python(kind, runner))
    assert d.is_async(a) is (kind == "async")
    out = dispatch(d, a, threading.Event(), deadline)
    assert (out.status, out.failure_kind, out.payload) == ("done", None, "said say hi")
    (t,) = seen
    assert (t.task_id, t.device_id, t.driver_type, t.attempt, t.lease_id, t.host_id) == (
        a.task.id, "d1", "android", 1, a.lease_id, "h1")  # fmt: skip
    assert t.deadline == deadline and 29 < (t.time_left() or 0) <= 30
    assert t.logger.extra["task"] == a.task.id and t.logger.extra["lease"] == a.lease_id


@pytest.mark.parametrize("kind", KINDS)
def test_reported_failure_is_runner_failed_and_exception_is_runner_error(
    real_fleet, kind: str
) -> None:
    a = claim_one(real_fleet, goal="x")
    out = dispatch(TaskDispatcher(python(kind, lambda t: Outcome.failure("no wifi"))), a)
    assert (out.status, out.failure_kind, out.payload) == (
        "failed", FailureKind.runner_failed, "no wifi")  # fmt: skip

    def boom(task: Task) -> Outcome:
        raise KeyError("device vanished")

    out = dispatch(TaskDispatcher(python(kind, boom)), a)
    assert out.status == "failed" and out.failure_kind is FailureKind.runner_error
    assert out.payload.startswith("KeyError: 'device vanished'")


@pytest.mark.parametrize("kind", KINDS)
def test_deadline_stops_the_runner_and_fails_with_timeout(real_fleet, kind: str) -> None:
    a = claim_one(real_fleet, goal="sleep 30")
    started = time.monotonic()
    d = TaskDispatcher(command(kind, "sh -c {goal}", term_grace=1))
    out = dispatch(d, a, threading.Event(), time.monotonic() + 0.5)
    assert out.status == "failed" and out.failure_kind is FailureKind.timeout
    assert 0.4 < time.monotonic() - started < 5


@pytest.mark.parametrize("kind", KINDS)
def test_cancel_event_stops_the_runner_and_gives_cancelled(real_fleet, kind: str) -> None:
    a = claim_one(real_fleet, goal="sleep 30")
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.monotonic()
    out = dispatch(TaskDispatcher(command(kind, "sh -c {goal}")), a, cancel)
    assert out.status == "cancelled" and out.failure_kind is FailureKind.cancelled
    assert time.monotonic() - started < 5


async def waits_for_its_stop(task: Task) -> str:
    """An async runner that sleeps until told to stop (and says how long it waited)."""
    started = time.monotonic()
    told = await task.wait_cancel(30)
    return f"told={told} after {time.monotonic() - started:.1f}s"


def test_an_async_runner_waiting_on_its_stop_signal_wakes_at_once(real_fleet) -> None:
    a = claim_one(real_fleet, goal="x")
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.monotonic()
    out = dispatch(TaskDispatcher(waits_for_its_stop), a, cancel)
    assert time.monotonic() - started < 1.0  # (the watchdog looks every 0.1 s)
    assert out.status == "done" and out.payload.startswith("told=True")


@pytest.mark.parametrize("kind", KINDS)
def test_a_loop_event_cancel_wakes_the_watchdog_without_polling(
    real_fleet, monkeypatch, kind: str
) -> None:
    """A run's cancel event that is a LoopEvent (the host's runs) calls the watchdog back when
    set: with the plain-event poll pushed out to an hour, the runner is still told to stop."""
    import deviceq.host.dispatcher as dispatcher_module

    monkeypatch.setattr(dispatcher_module, "POLL_EVERY", 3600.0)
    a = claim_one(real_fleet, goal="x")
    cancel = LoopEvent()
    threading.Timer(0.2, cancel.set).start()

    async def waits_async(task: Task) -> str:
        return "told" if await task.wait_cancel(30) else "never told"

    def waits(task: Task) -> str:
        return "told" if task.cancel.wait(30) else "never told"

    out = dispatch(TaskDispatcher(waits_async if kind == "async" else waits), a, cancel)
    assert (out.status, out.payload) == ("done", "told")


def test_a_deadline_is_kept_without_polling(real_fleet, monkeypatch) -> None:
    """The watchdog sleeps until the nearest deadline, not until a poll: with the poll pushed
    out to an hour, a run past its deadline still fails with timeout."""
    import deviceq.host.dispatcher as dispatcher_module

    monkeypatch.setattr(dispatcher_module, "POLL_EVERY", 3600.0)
    a = claim_one(real_fleet, goal="x")

    def waits(task: Task) -> Outcome:
        return Outcome.failure("stopped" if task.cancel.wait(30) else "never told")

    out = dispatch(TaskDispatcher(waits), a, LoopEvent(), time.monotonic() + 0.3)
    assert (out.status, out.failure_kind) == ("failed", FailureKind.timeout)
    assert "stopped" in out.payload


def test_loop_event_on_set_calls_once_at_once_if_set_and_not_once_taken_back() -> None:
    e = LoopEvent()
    calls: list[str] = []
    e.on_set(lambda: calls.append("a"))
    undo = e.on_set(lambda: calls.append("b"))
    undo()
    e.set()
    e.set()
    e.on_set(lambda: calls.append("c"))  # already set: called here and now
    assert calls == ["a", "c"]


@pytest.mark.parametrize("kind", KINDS)
def test_runner_that_succeeds_despite_cancel_is_done(real_fleet, kind: str) -> None:
    a = claim_one(real_fleet, goal="x")
    cancel = threading.Event()
    cancel.set()
    out = dispatch(TaskDispatcher(python(kind, lambda t: "finished anyway")), a, cancel)
    assert out.status == "done"


@pytest.mark.parametrize("kind", KINDS)
def test_runner_ignoring_stop_is_abandoned_after_grace(real_fleet, kind: str) -> None:
    a = claim_one(real_fleet, goal="x")
    release = threading.Event()
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()

    async def ignores_its_stop(task: Task) -> str:
        await asyncio.sleep(3)  # (never looks at its stop signal)
        return "late"

    runner = ignores_its_stop if kind == "async" else (lambda t: release.wait(30))
    started = time.monotonic()
    out = dispatch(TaskDispatcher(runner, stop_grace=0.5), a, cancel)
    release.set()
    assert out.abandoned and out.status == "cancelled"
    assert out.runner_done is not None  # (set once the runner really ends)
    assert time.monotonic() - started < 2.5


@pytest.mark.parametrize("kind", KINDS)
def test_workflow_task_loads_definition_from_redis_and_runs_steps(
    real_fleet, tmp_path, kind: str
) -> None:
    log = tmp_path / "log"
    real_fleet.client.put_workflow({"name": "smoke", "steps": [
        {"name": "boot", "goal": f"echo boot-$DEVICEQ_DEVICE_ID >> {log}; echo booted"},
        {"goal": f"echo test >> {log}; echo tested"},
    ]})  # fmt: skip
    a = claim_one(real_fleet, workflow="smoke")
    d = TaskDispatcher(command(kind, "sh -c {goal}"), run_steps, real_fleet.client.get_workflow)
    assert d.is_async(a) is (kind == "async")
    out = dispatch(d, a)
    assert out.status == "done"
    assert out.payload == "step 1/2 (boot): booted\nstep 2/2: tested"
    assert log.read_text() == "boot-d1\ntest\n"


@pytest.mark.parametrize("kind", KINDS)
def test_workflow_first_failing_step_fails_the_task(real_fleet, tmp_path, kind: str) -> None:
    log = tmp_path / "log"
    real_fleet.client.put_workflow({"name": "bad", "steps": [
        {"goal": "exit 7"}, {"goal": f"touch {log}"}]})  # fmt: skip
    a = claim_one(real_fleet, workflow="bad")
    d = TaskDispatcher(command(kind, "sh -c {goal}"), run_steps, real_fleet.client.get_workflow)
    out = dispatch(d, a)
    assert out.status == "failed" and out.failure_kind is FailureKind.runner_failed
    assert out.payload.startswith("step 1/2 failed: exit code 7")
    assert not log.exists()


def test_a_thread_workflow_runner_runs_an_async_goal_runners_steps(real_fleet) -> None:
    """A workflow runner of the other kind gets the goal runner as its own kind."""
    real_fleet.client.put_workflow({"name": "two", "steps": [{"goal": "a"}, {"goal": "b"}]})
    a = claim_one(real_fleet, workflow="two")

    def my_steps(workflow, task, goal_runner):  # a plain (thread) workflow runner
        return " ".join(str(goal_runner(replace_goal(task, s.goal))) for s in workflow.steps)

    async def shout(task: Task) -> str:
        await asyncio.sleep(0)
        return task.goal.upper()

    d = TaskDispatcher(shout, my_steps, real_fleet.client.get_workflow)
    assert not d.is_async(a)
    out = dispatch(d, a)
    assert (out.status, out.payload) == ("done", "A B")


def replace_goal(task: Task, goal: str) -> Task:
    from dataclasses import replace

    return replace(task, goal=goal)


@pytest.mark.parametrize("kind", KINDS)
def test_missing_workflow_is_rejected_not_blamed_on_the_device(real_fleet, kind: str) -> None:
    real_fleet.client.put_workflow({"name": "gone", "steps": [{"goal": "x"}]})
    a = claim_one(real_fleet, workflow="gone")
    real_fleet.r.delete(real_fleet.client.keys.workflow("gone"))
    d = TaskDispatcher(python(kind, lambda t: "x"), run_steps, real_fleet.client.get_workflow)
    out = dispatch(d, a)
    assert out.status == "failed" and out.failure_kind is FailureKind.rejected
    assert "no workflow gone" in out.payload
    # a host without a workflow runner refuses workflow tasks the same way
    assert dispatch(TaskDispatcher(python(kind, lambda t: "x")), a).failure_kind is (
        FailureKind.rejected
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("outcome, kind_", [("done", None), ("failed", "runner_failed")])
def test_outcome_reported_through_host_client(
    real_fleet, outcome: str, kind_: str | None, kind: str
) -> None:
    a = claim_one(real_fleet, goal="exit 0" if outcome == "done" else "exit 1")
    out = dispatch(TaskDispatcher(command(kind, "sh -c {goal}")), a)
    h = real_fleet.host("h1")
    assert h.report(a.task.id, a.lease_id, out.status, out.failure_kind, out.payload) == (
        f"ok:{outcome}")  # fmt: skip
    t = real_fleet.client.get(a.task.id)
    assert t.status.value == outcome and (t.failure_kind or None) == kind_
