"""Runners: the command runner (quoting, environment, output tail, process-group kill), the sim
runner, resolution by name / import path / entry point, the reference workflow runner, and
process isolation (a GIL-holding or cancel-ignoring Python runner). Real processes throughout.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import threading
import time
from pathlib import Path

import pytest

from deviceq.core.errors import ConfigError
from deviceq.core.models import WorkflowDefinition
from deviceq.host.runners import (
    CommandRunner,
    IsolatedRunner,
    Outcome,
    RunnerCrashed,
    RunnerSpec,
    SimRunner,
    Task,
    as_outcome,
    build_goal_runner,
    build_workflow_runner,
    load_runner,
    parse_duration,
    run_steps,
)
from runner_kinds import KINDS, command, sim

# -- runners used by the tests (importable as test_runners:NAME) -------------------------------


def echo_runner(task: Task) -> Outcome:
    return Outcome.success(f"{task.goal}@{task.device_id}#{task.attempt}")


def failing_runner(task: Task) -> Outcome:
    return Outcome.failure(f"cannot {task.goal}")


def raising_runner(task: Task) -> Outcome:
    raise ValueError(f"broken on {task.device_id}")


def pid_runner(task: Task) -> str:
    return str(os.getpid())


def gil_hog(task: Task) -> str:
    """Holds the GIL for float(goal) seconds: libc sleep called through PyDLL keeps it."""
    ctypes.PyDLL(None).sleep(int(float(task.goal)))
    return "hogged"


def stubborn(task: Task) -> str:
    """Ignores its cancellation signal."""
    while True:
        time.sleep(0.05)


class Greeter:
    def __init__(self, greeting: str = "hello") -> None:
        self.greeting = greeting

    def __call__(self, task: Task) -> str:
        return f"{self.greeting} {task.goal}"


def make_task(goal: str = "g", **kw: object) -> Task:
    base: dict[str, object] = {"task_id": "t1", "device_id": "d1", "driver_type": "android",
                               "tags": ("wifi", "cam"), "attempt": 2}  # fmt: skip
    base.update(kw)
    return Task(goal=goal, **base)  # type: ignore[arg-type]


def live_group_members(pgid: int) -> list[int]:
    """Pids of non-zombie processes in process group ``pgid`` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(entry.name))
    return out


# -- command runner --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_command_success_result_is_output_tail_and_env_is_set(kind: str, tmp_path: Path) -> None:
    r = command(
        kind,
        "sh -c 'echo $DEVICEQ_GOAL/$DEVICEQ_DEVICE_ID/$DEVICEQ_DRIVER_TYPE/"
        "$DEVICEQ_TAGS/$DEVICEQ_TASK_ID/$DEVICEQ_ATTEMPT; echo err >&2'",
    )
    out = r(make_task("open settings"))
    assert out.ok
    # stdout and stderr are read on pipes of their own: between them, arrival order decides
    assert sorted(out.text.splitlines(keepends=True)) == sorted(
        ["open settings/d1/android/wifi,cam/t1/2\n", "err\n"]
    )


@pytest.mark.parametrize("kind", KINDS)
def test_command_output_is_passed_on_whole_even_when_the_live_log_is_slow(kind: str) -> None:
    """A sink that takes longer than the quiet limit to take a piece (a loaded machine, a
    slow live log) still gets every piece, stderr's too, before the runner returns."""
    got: list[tuple[str, str]] = []

    def slow_sink(stream: str, text: str) -> None:
        time.sleep(1.5)  # four pieces: longer in all than the 2 s a silent pipe is waited for
        got.append((stream, text))

    task = make_task("x")
    task.log_sink = slow_sink
    out = command(kind, "sh -c 'for i in 1 2 3 4; do echo $i; sleep 0.2; done; echo e >&2'")(task)
    assert out.ok
    text = "".join(t for s, t in got if s == "stdout")
    assert text == "1\n2\n3\n4\n" and "e\n" in [t for s, t in got if s == "stderr"]


@pytest.mark.parametrize("kind", KINDS)
def test_the_two_streams_meet_between_lines_never_inside_one(kind: str) -> None:
    """stdout and stderr are read on pipes of their own: stderr's line written while stdout's
    line is unfinished comes before that line, not inside it (the live log, log.txt and the
    tail all read the same pieces)."""
    got: list[tuple[str, str]] = []
    task = make_task("x")
    task.log_sink = lambda stream, text: got.append((stream, text))
    script = "printf abc; sleep 0.3; echo err >&2; sleep 0.3; echo def"
    out = command(kind, f"sh -c '{script}'")(task)
    assert out.ok and "".join(t for _, t in got) == "err\nabcdef\n", got
    assert out.text == "err\nabcdef\n"


@pytest.mark.parametrize("kind", KINDS)
def test_an_unfinished_line_is_passed_on_after_a_second_without_more(kind: str) -> None:
    """A prompt without a newline shows in the live log while the command waits."""
    seen: dict[str, float] = {}
    task = make_task("x")
    task.log_sink = lambda stream, text: seen.setdefault(text, time.monotonic())
    start = time.monotonic()
    out = command(kind, "sh -c 'printf \"go? \"; sleep 2.5; echo yes'")(task)
    assert out.ok and out.text == "go? yes\n"
    assert seen["go? "] - start < 2.0 and seen["yes\n"] - start >= 2.5


def test_output_left_in_the_pipe_is_waited_for_however_long_its_reader_is_kept_waiting() -> None:
    """The command has exited and its last output waits in the pipe, but the reader thread
    has not run for longer than the quiet limit (a loaded machine): that output is still
    read and passed on before the runner goes on, not lost from the task's log."""
    from deviceq.host.runners.command_output import CommandOutput

    got: list[str] = []
    task = make_task("x")
    task.log_sink = lambda stream, text: got.append(text)
    out = CommandOutput(1024, task)
    r, w = os.pipe()
    os.write(w, b"the last line\n")
    os.close(w)
    late = threading.Event()

    class Pipe:
        def fileno(self) -> int:
            return r

    # the reader starts reading only after 3 quiet limits
    real_read = out._read
    out._read = lambda fd, stream: (late.wait(0.9), real_read(fd, stream))  # type: ignore[method-assign]
    reader = out.reader(Pipe(), "stdout")
    out.finish([reader], quiet=0.3)
    try:
        assert not reader.is_alive() and "".join(got) == "the last line\n"
    finally:
        reader.join(5)
        os.close(r)


@pytest.mark.parametrize("kind", KINDS)
def test_command_placeholders_are_shell_quoted_and_goal_is_not_run_by_a_shell(
    kind: str,
    tmp_path: Path,
) -> None:
    marker = tmp_path / "pwned"
    goal = f"x; touch {marker}; echo $HOME"
    out = command(kind, "echo {goal} {device_id} {task_id} {attempt} {driver_type}")(
        make_task(goal)
    )
    assert out.ok and out.text == f"{goal} d1 t1 2 android\n"
    assert not marker.exists()
    # the template may choose a shell explicitly
    out = command(kind, "sh -c {goal}")(make_task(f"touch {marker} && echo made"))
    assert out.ok and out.text == "made\n" and marker.exists()


@pytest.mark.parametrize("goal", ["$(id)", "`id`", "'; id; '", '"; id; "', "a b\nid", "$HOME"])
def test_a_goal_inside_a_shell_script_cannot_inject(goal: str, tmp_path: Path) -> None:
    """Shell injection: `sh -c 'echo {goal}'` used to run `id` for the goal `$(id)` (the
    value was quoted, then the whole line re-split). Splicing {goal} into a script is refused
    at start; {goal:shell} quotes it as one word for that shell."""
    with pytest.raises(ConfigError, match="whole argument"):
        CommandRunner("sh -c 'echo {goal}'")
    with pytest.raises(ConfigError, match="whole argument"):
        CommandRunner("sh -c \"echo '{goal}'\"")
    out = CommandRunner("sh -c 'printf %s {goal:shell}'")(make_task(goal))
    assert out.ok and out.text == goal
    # as a whole argument the goal is exactly one argument, whatever it holds
    out = CommandRunner("printf [%s] {goal}")(make_task(goal))
    assert out.ok and out.text == f"[{goal}]"


def test_command_templates_are_checked_at_start() -> None:
    with pytest.raises(ConfigError, match=r"unknown placeholder \{nosuch\}"):
        CommandRunner("echo {nosuch}")
    with pytest.raises(ConfigError, match="hands its arguments to a shell"):
        CommandRunner("adb -s {device_id} shell am start -a {goal}")
    with pytest.raises(ConfigError, match="hands its arguments to a shell"):
        CommandRunner("ssh lab-7 run-test {goal}")
    with pytest.raises(ConfigError, match="lone"):
        CommandRunner("echo {goal")
    adb = CommandRunner("adb -s {device_id} shell am start -a android.intent.action.VIEW "
                        "-d {goal:shell}")  # fmt: skip
    assert adb.argv(make_task("x'; reboot; '"))[-1] == "'x'\"'\"'; reboot; '\"'\"''"
    ok = CommandRunner("run --serial={device_id} --tags={tags} {{literal}} ${HOME} {goal}")
    assert ok.argv(make_task("a b")) == ["run", "--serial=d1", "--tags=wifi,cam", "{literal}",
                                         "${HOME}", "a b"]  # fmt: skip


@pytest.mark.parametrize(
    "template",
    [
        "timeout 60 adb -s {device_id} shell {goal}",
        "sudo -u lab ssh rig1 {goal}",
        "/usr/bin/env ssh -p 2222 rig1 run {goal}",
        "su -c {goal}",
        "sudo runuser -u lab --command {goal}",
    ],
)
def test_a_remote_shell_anywhere_in_the_argv_is_refused_at_start(template: str) -> None:
    """The guard looks at the whole argument vector, not only its first word: a wrapper
    (timeout, sudo, env) in front of adb shell / ssh / su -c hands the goal to a shell too."""
    with pytest.raises(ConfigError, match="hands its arguments to a shell"):
        CommandRunner(template)
    CommandRunner(template.replace("{goal}", "{goal:shell}"))  # the quoted form is fine


def test_a_goal_that_looks_like_an_option_is_refused_unless_after_double_dash(
    tmp_path: Path,
) -> None:
    """`git clone {goal}` with the goal `--upload-pack=touch X` would run `touch X`: a goal
    starting with '-' in a whole-argument placeholder fails the task (runner_failed), and
    nothing runs, unless the template ends the options with `--` before it."""
    marker = tmp_path / "pwned"
    script = tmp_path / "opt.sh"  # runs its --run=CMD option, like git's --upload-pack
    script.write_text('#!/bin/sh\nfor a in "$@"; do case "$a" in --run=*) sh -c "${a#--run=}";; '
                      'esac; done; echo "args: $*"\n')  # fmt: skip
    script.chmod(0o755)
    goal = f"--run=touch {marker}"
    out = CommandRunner(f"{script} {{goal}}")(make_task(goal))
    assert not out.ok and not out.infra  # the task's failure (runner_failed)
    assert "starts with '-'" in out.text and "--" in out.text
    assert not marker.exists()
    out = CommandRunner(f"{script} -v {{goal}}")(make_task("-x"))
    assert not out.ok and not marker.exists()
    # after `--` the program takes it as an operand: the template said so
    out = CommandRunner("printf -- [%s] {goal}")(make_task(goal))
    assert out.ok and out.text == f"[{goal}]"
    # a goal that does not start with '-' runs as before
    out = CommandRunner(f"{script} {{goal}}")(make_task("plain"))
    assert out.ok and out.text == "args: plain\n" and not marker.exists()


@pytest.mark.parametrize("kind", KINDS)
def test_command_failure_gives_exit_code_and_bounded_tail(kind: str) -> None:
    r = command(
        kind, "sh -c 'head -c 200000 /dev/zero | tr \"\\0\" a; echo END; exit 3'", tail_bytes=1000
    )
    out = r(make_task())
    assert not out.ok
    assert out.text.startswith("exit code 3\n")
    assert out.text.endswith("aEND")
    assert len(out.text.encode()) <= 1000 + len("exit code 3\n")


@pytest.mark.parametrize("kind", KINDS)
def test_command_missing_binary_is_a_failure_not_a_crash(kind: str) -> None:
    out = command(kind, "/nonexistent/binary {goal}")(make_task())
    assert not out.ok and "cannot start" in out.text


@pytest.mark.parametrize("kind", KINDS)
def test_command_does_not_leak_the_host_token(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEVICEQ_HOST_TOKEN", "s3cret-token")
    out = command(kind, "sh -c 'echo token=${DEVICEQ_HOST_TOKEN:-none}'")(make_task())
    assert out.text == "token=none\n"


@pytest.mark.parametrize("kind", KINDS)
def test_command_cancel_kills_the_whole_process_group(kind: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    # the group id (the command runs under its watchdog, which leads the group)
    script = f"cut -d' ' -f5 /proc/$$/stat > {pidfile}; sleep 60 & sleep 60; wait"
    task = make_task(script)
    runner = command(kind, "sh -c {goal}", term_grace=5.0)
    box: dict[str, Outcome] = {}
    t = threading.Thread(target=lambda: box.setdefault("out", runner(task)))
    t.start()
    deadline = time.monotonic() + 10
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    pgid = int(pidfile.read_text())
    time.sleep(0.1)
    assert len(live_group_members(pgid)) >= 3  # the watchdog, the shell, its background sleep
    started = time.monotonic()
    task.cancel.set()
    t.join(10)
    # (the command obeys SIGTERM: its stop does not wait out the 5 s grace)
    assert not t.is_alive() and time.monotonic() - started < 4
    assert not box["out"].ok and box["out"].text.startswith("stopped")
    deadline = time.monotonic() + 5
    while live_group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_group_members(pgid) == []


@pytest.mark.parametrize("kind", KINDS)
def test_command_leftovers_are_killed_when_it_exits(kind: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    out = command(kind, "sh -c {goal}")(make_task(f"echo $$ > {pidfile}; sleep 60 & echo bye"))
    assert out.ok and out.text == "bye\n"
    pgid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while live_group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_group_members(pgid) == []


def spawner(task: Task) -> str:
    """Leaves a background process behind in its own process group."""
    import subprocess

    proc = subprocess.Popen(["sleep", "60"])
    Path(task.goal).write_text(str(proc.pid))
    return "spawned"


def test_isolated_runner_leftovers_die_with_it(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    out = build_goal_runner(RunnerSpec("test_runners:spawner"))(make_task(str(pidfile)))
    assert out == Outcome.success("spawned")
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(pid)


def running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("kind", KINDS)
def test_command_that_ignores_sigterm_is_killed_after_grace(kind: str, tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    script = f"trap '' TERM; echo $$ > {pidfile}; while true; do sleep 0.05; done"
    task = make_task(script)
    runner = command(kind, "sh -c {goal}", term_grace=0.3)
    t = threading.Thread(target=runner, args=(task,))
    t.start()
    deadline = time.monotonic() + 10
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    task.cancel.set()
    t.join(5)
    assert not t.is_alive()
    pgid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while live_group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live_group_members(pgid) == []


def test_command_template_is_validated() -> None:
    with pytest.raises(ConfigError):
        CommandRunner("")
    with pytest.raises(ConfigError):
        CommandRunner("echo 'unterminated")


# -- sim -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_sim_runner_success_failure_error_and_cancel(kind: str) -> None:
    assert sim(kind, "0.01", seed=1)(make_task("x")).ok
    assert not sim(kind, "0", fail_rate=1.0)(make_task()).ok
    with pytest.raises(RuntimeError):
        sim(kind, "0", error_rate=1.0)(make_task())
    task = make_task()
    threading.Timer(0.1, task.cancel.set).start()
    started = time.monotonic()
    out = sim(kind, "30")(task)
    assert not out.ok and time.monotonic() - started < 5


def test_sim_duration_distributions() -> None:
    import random

    rng = random.Random(7)
    assert parse_duration("0.5")(rng) == 0.5
    assert all(0.1 <= parse_duration("uniform:0.1,0.2")(rng) <= 0.2 for _ in range(100))
    assert all(parse_duration("exp:0.1")(rng) >= 0 for _ in range(100))
    assert all(parse_duration("normal:0.1,1")(rng) >= 0 for _ in range(100))
    assert all(parse_duration("lognormal:0.2,0.1")(rng) > 0 for _ in range(100))
    for bad in ("x", "uniform:1", "exp:0", "-1"):
        with pytest.raises(ConfigError):
            parse_duration(bad)
    with pytest.raises(ConfigError):
        SimRunner("0.1", fail_rate=2)


# -- resolution ------------------------------------------------------------------------------


def test_load_runner_by_builtin_name_import_path_and_class_with_options() -> None:
    assert isinstance(load_runner(RunnerSpec("sim", {"duration": "0"})), SimRunner)
    assert load_runner(RunnerSpec("steps"), "workflow") is run_steps
    assert load_runner(RunnerSpec("test_runners:echo_runner")) is echo_runner
    greeter = load_runner(RunnerSpec("test_runners:Greeter", {"greeting": "hi"}))
    assert as_outcome(greeter(make_task("bob"))) == Outcome.success("hi bob")


@pytest.mark.parametrize(
    "spec, kind, message",
    [
        ("no_such_module_xyz:run", "goal", "cannot import"),
        ("test_runners:nope", "goal", "has no"),
        ("not-a-runner-anywhere", "goal", "unknown runner"),
        ("steps", "goal", "not a goal runner"),
        ("command", "workflow", "not a workflow runner"),
    ],
)
def test_load_runner_errors_name_the_problem(spec: str, kind: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_runner(RunnerSpec(spec), kind)


def test_load_runner_by_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib.metadata import EntryPoint

    from deviceq.host.runners import registry

    ep = EntryPoint("echo", "test_runners:echo_runner", registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [ep] if
                        group == registry.ENTRY_POINT_GROUP else [])  # fmt: skip
    assert load_runner(RunnerSpec("echo")) is echo_runner


def test_as_outcome_normalises_return_values() -> None:
    assert as_outcome(None) == Outcome(True, "")
    assert as_outcome("r") == Outcome(True, "r")
    assert as_outcome(False) == Outcome(False, "runner reported failure")
    assert as_outcome({"ok": False, "error": "e"}) == Outcome(False, "e")
    assert as_outcome({"success": True, "result": "r"}) == Outcome(True, "r")
    with pytest.raises(TypeError):
        as_outcome(42)


# -- reference workflow runner ---------------------------------------------------------------


def test_run_steps_runs_in_order_and_stops_at_first_failure(tmp_path: Path) -> None:
    log = tmp_path / "log"
    wf = WorkflowDefinition(name="wf", steps=[
        {"name": "one", "goal": f"echo one >> {log}"},
        {"goal": f"echo two >> {log}; exit 4"},
        {"name": "three", "goal": f"echo three >> {log}"},
    ])  # fmt: skip
    goal_runner = CommandRunner("sh -c {goal}")
    out = run_steps(wf, make_task(), goal_runner)
    assert not out.ok
    assert out.text.startswith("step 2/3 failed: exit code 4")
    assert log.read_text() == "one\ntwo\n"
    ok = WorkflowDefinition(name="ok", steps=[{"goal": "a"}, {"name": "b", "goal": "b"}])
    out = run_steps(ok, make_task(), echo_runner)
    assert out.ok and out.text == "step 1/2: a@d1#2\nstep 2/2 (b): b@d1#2"


def test_run_steps_gives_each_step_its_workflow_and_step_in_env() -> None:
    wf = WorkflowDefinition(name="flow", steps=[{"goal": "x"}, {"goal": "y"}])
    out = run_steps(wf, make_task(), CommandRunner("sh -c 'echo $DEVICEQ_WORKFLOW:$DEVICEQ_STEP'"))
    assert out.ok and out.text == "step 1/2: flow:1\nstep 2/2: flow:2"


# -- isolation -------------------------------------------------------------------------------


def test_isolated_runner_runs_in_another_process_and_maps_exceptions() -> None:
    runner = build_goal_runner(RunnerSpec("test_runners:pid_runner"))
    assert isinstance(runner, IsolatedRunner)
    out = runner(make_task())
    assert out.ok and int(out.text) != os.getpid()
    with pytest.raises(RunnerCrashed, match="ValueError: broken on d1"):
        build_goal_runner(RunnerSpec("test_runners:raising_runner"))(make_task())
    # built-ins stay in-process unless asked
    assert isinstance(build_goal_runner(RunnerSpec("sim")), SimRunner)
    assert isinstance(build_goal_runner(RunnerSpec("sim"), "process"), IsolatedRunner)
    assert build_goal_runner(RunnerSpec("test_runners:echo_runner"), "thread") is echo_runner
    with pytest.raises(ConfigError):
        build_goal_runner(RunnerSpec("sim"), "fibers")


def test_isolated_gil_holding_runner_does_not_starve_the_parent() -> None:
    ticks: list[float] = []
    stop = threading.Event()

    def ticker() -> None:
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.05)

    t = threading.Thread(target=ticker)
    t.start()
    try:
        out = build_goal_runner(RunnerSpec("test_runners:gil_hog"))(make_task("2"))
    finally:
        stop.set()
        t.join()
    assert out == Outcome.success("hogged")
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    assert len(ticks) > 20 and max(gaps) < 1.0


def test_isolated_runner_ignoring_cancel_is_killed() -> None:
    runner = IsolatedRunner(RunnerSpec("test_runners:stubborn"), kill_grace=0.5)
    task = make_task()
    threading.Timer(0.5, task.cancel.set).start()
    started = time.monotonic()
    out = runner(task)
    assert not out.ok and "killed" in out.text
    assert time.monotonic() - started < 6


def test_isolated_runner_is_killed_after_the_tasks_stop_grace_when_it_has_one() -> None:
    """A preempted run's class grace (Task.stop_grace, set before its stop signal) replaces
    the runner's own kill grace."""
    runner = IsolatedRunner(RunnerSpec("test_runners:stubborn"), kill_grace=60)
    task = make_task()

    def preempt() -> None:
        task.stop_grace = 0.3
        task.cancel.set()

    threading.Timer(0.5, preempt).start()
    out = runner(task)
    assert not out.ok and out.text == (
        "runner did not stop 0.3 s after cancel; process group killed"
    )


def test_isolated_workflow_runner_runs_steps_in_the_child() -> None:
    wf = WorkflowDefinition(name="w", steps=[{"goal": "a"}, {"goal": "b"}])
    runner = build_workflow_runner(RunnerSpec("test_runners:steps_in_child"),
                                   RunnerSpec("test_runners:pid_runner"))  # fmt: skip
    out = runner(wf, make_task(), echo_runner)
    pids = {line.split(": ")[1] for line in out.text.splitlines()}
    assert out.ok and len(pids) == 1 and str(os.getpid()) not in pids


def steps_in_child(workflow: WorkflowDefinition, task: Task, goal_runner: object) -> Outcome:
    return run_steps(workflow, task, goal_runner)  # type: ignore[arg-type]


def test_a_plain_function_returning_a_coroutine_is_a_clear_runner_error() -> None:
    async def work() -> str:
        return "never awaited"

    with pytest.raises(TypeError, match="must be an `async def`"):
        as_outcome(work())


def test_async_kinds_of_the_built_in_runners_and_their_option() -> None:
    from deviceq.host.runners import AsyncCommandRunner, AsyncSimRunner, is_async_runner

    assert isinstance(load_runner(RunnerSpec("command", {"template": "true", "async": True})),
                      AsyncCommandRunner)  # fmt: skip
    assert isinstance(load_runner(RunnerSpec("sim", {"async": "true"})), AsyncSimRunner)
    assert isinstance(load_runner(RunnerSpec("sim", {"async": "false"})), SimRunner)
    assert is_async_runner(AsyncSimRunner()) and not is_async_runner(SimRunner())
    with pytest.raises(ConfigError, match="--async applies to the built-in runners"):
        load_runner(RunnerSpec("test_runners:echo_runner", {"async": True}))
    with pytest.raises(ConfigError, match="must be true or false"):
        load_runner(RunnerSpec("sim", {"async": "maybe"}))
    # an async def stays in the daemon's process under isolation auto, and is isolated on ask
    assert is_async_runner(build_goal_runner(RunnerSpec("test_runners:echo_async")))
    isolated = build_goal_runner(RunnerSpec("test_runners:echo_async"), "process")
    assert isinstance(isolated, IsolatedRunner)
    assert isolated(make_task("hi")) == Outcome.success("hi@d1#2 awaited")


async def echo_async(task: Task) -> Outcome:
    await asyncio.sleep(0)
    return Outcome.success(f"{task.goal}@{task.device_id}#{task.attempt} awaited")
