"""Runners: the pluggable entry points that actually execute a task on a device.

A **goal runner** is a callable ``runner(task: Task) -> Outcome``. It gets a `Task` (the goal,
the device, the attempt, a deadline, a cancellation signal and a logger) and returns an
`Outcome` (success and a result text, or failure and an error text). Raising an exception means
the runner itself broke (``runner_error``). For convenience a runner may also return ``None``
(success, no text), a ``str`` (success with that result) or a ``bool``.

A **workflow runner** is a callable ``runner(workflow, task, goal_runner) -> Outcome`` that runs
a `WorkflowDefinition` for a workflow task; it gets the configured goal runner to run steps with.

Runners are named by a `RunnerSpec`:

- a built-in name: ``command`` and ``sim`` (goal runners), ``steps`` (the reference workflow
  runner: each step's goal in order through the goal runner, stopping at the first failure);
- an import path ``package.module:callable`` (a class is instantiated with the spec's options);
- an entry point name in the group ``deviceq.runners``.

Python runners that are not built in run, by default, in a child process of their own
(``isolation="auto"``), so a runner that holds the GIL or hangs can never starve the worker's
lease renewals, and a runner that ignores its cancellation signal can be killed with its whole
process group. The ``command`` runner always runs its command in a process group of its own.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import multiprocessing
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from importlib.metadata import entry_points
from typing import Any, Protocol, cast

from .errors import ConfigError
from .models import MAX_PAYLOAD_BYTES, WorkflowDefinition

ENTRY_POINT_GROUP = "deviceq.runners"
DEFAULT_TAIL_BYTES = 8192
_LOG = logging.getLogger("deviceq.runner")


# -- task and outcome ------------------------------------------------------------------------


class TaskLogger(logging.LoggerAdapter):
    """A logger whose every line carries the task's structured fields (task, lease, host,
    device, attempt) for ``deviceq.logs``; extra keyword fields may be given as ``fields=``."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        extra = dict(kwargs.pop("fields", None) or {})
        kwargs["extra"] = {"fields": {**(self.extra or {}), **extra}}
        return msg, kwargs


@dataclass
class Task:
    """What a runner gets for one attempt of one task.

    ``deadline`` is a ``time.monotonic()`` value (None: no limit); ``cancel`` is set when the
    runner must stop (cancel requested, deadline passed, lease lost or host draining): check it
    often, or wait on it instead of sleeping. ``workflow``/``step`` are set for the steps of a
    workflow task."""

    goal: str
    task_id: str
    device_id: str
    driver_type: str
    tags: tuple[str, ...] = ()
    attempt: int = 1
    deadline: float | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    logger: logging.LoggerAdapter = field(default_factory=lambda: TaskLogger(_LOG, {}))
    lease_id: str = ""
    host_id: str = ""
    workflow: str | None = None
    step: int | None = None
    lease: LeaseClock | None = None

    def time_left(self) -> float | None:
        """Seconds until the deadline (never negative), or None without a deadline."""
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    @property
    def cancelled(self) -> bool:
        return self.cancel.is_set()

    def env(self) -> dict[str, str]:
        """The ``DEVICEQ_*`` environment variables describing this task."""
        env = {
            "DEVICEQ_GOAL": self.goal,
            "DEVICEQ_DEVICE_ID": self.device_id,
            "DEVICEQ_DRIVER_TYPE": self.driver_type,
            "DEVICEQ_TAGS": ",".join(self.tags),
            "DEVICEQ_TASK_ID": self.task_id,
            "DEVICEQ_ATTEMPT": str(self.attempt),
            "DEVICEQ_LEASE_ID": self.lease_id,
            "DEVICEQ_HOST_ID": self.host_id,
        }
        if self.workflow:
            env["DEVICEQ_WORKFLOW"] = self.workflow
        if self.step is not None:
            env["DEVICEQ_STEP"] = str(self.step)
        return env

    def portable(self) -> dict[str, Any]:
        """The picklable part (everything but the event, the logger and the lease clock), for a
        child process."""
        return {
            "goal": self.goal, "task_id": self.task_id, "device_id": self.device_id,
            "driver_type": self.driver_type, "tags": tuple(self.tags), "attempt": self.attempt,
            "deadline_in": self.time_left(), "lease_id": self.lease_id, "host_id": self.host_id,
            "workflow": self.workflow, "step": self.step,
        }  # fmt: skip

    @classmethod
    def from_portable(cls, data: Mapping[str, Any], cancel: threading.Event) -> Task:
        d = dict(data)
        left = d.pop("deadline_in", None)
        deadline = None if left is None else time.monotonic() + float(left)
        task = cls(**d, deadline=deadline, cancel=cancel)
        task.logger = task_logger(task)
        return task


class LeaseClock:
    """A run's lease as the host sees it: ``until`` is the ``time.monotonic()`` by which the
    lease ends unless renewed (a safety margin before its expiry in Redis), or None when
    unknown. The worker moves it at every renewal; runners that run the task outside the
    worker's process (commands, isolated runners) forward it to a watchdog beside the run,
    which kills the run when it passes: a frozen (SIGSTOP) or dead (SIGKILL) daemon can never
    leave a run going after its lease ended and the task went to another device."""

    def __init__(self, until: float | None = None) -> None:
        self.until = until
        self.version = 0

    def extend(self, until: float) -> None:
        self.until = until
        self.version += 1

    def remaining(self) -> float | None:
        return None if self.until is None else self.until - time.monotonic()

    @property
    def expired(self) -> bool:
        left = self.remaining()
        return left is not None and left <= 0


def task_logger(task: Task, base: logging.Logger | None = None) -> TaskLogger:
    """A `TaskLogger` carrying ``task``'s fields."""
    fields: dict[str, Any] = {
        "task": task.task_id, "lease": task.lease_id or None, "host": task.host_id or None,
        "device": task.device_id, "attempt": task.attempt,
    }  # fmt: skip
    if task.step is not None:
        fields["step"] = task.step
    return TaskLogger(base or _LOG, fields)


@dataclass(frozen=True)
class Outcome:
    """What a runner reports: ``ok`` with a result text, or not ok with an error text.
    ``infra``: the failure is the device's or the rig's, not the task's (`infrastructure`);
    only such failures (and runner crashes and timeouts) count toward quarantining a device."""

    ok: bool
    text: str = ""
    infra: bool = False

    @classmethod
    def success(cls, result: str = "") -> Outcome:
        return cls(True, result)

    @classmethod
    def failure(cls, error: str) -> Outcome:
        """The task failed on its own (failure_kind ``runner_failed``)."""
        return cls(False, error)

    @classmethod
    def infrastructure(cls, error: str) -> Outcome:
        """The device or rig failed, not the task (failure_kind ``infrastructure``): counts
        toward ``quarantine_after``."""
        return cls(False, error, True)


def as_outcome(value: Any) -> Outcome:
    """Normalise what a runner returned: Outcome, None, str, bool, or a mapping with ``ok`` /
    ``success`` and ``result`` / ``error``."""
    if isinstance(value, Outcome):
        return value
    if value is None:
        return Outcome.success("")
    if isinstance(value, bool):
        return Outcome(value, "" if value else "runner reported failure")
    if isinstance(value, str):
        return Outcome.success(value)
    if isinstance(value, Mapping):
        ok = bool(value.get("ok", value.get("success", False)))
        text = value.get("result" if ok else "error") or value.get("text") or ""
        return Outcome(ok, str(text), not ok and bool(value.get("infrastructure", False)))
    ok_attr = getattr(value, "ok", getattr(value, "success", None))
    if isinstance(ok_attr, bool):
        text = getattr(value, "result" if ok_attr else "error", None) or ""
        return Outcome(ok_attr, str(text))
    raise TypeError(f"runner returned {type(value).__name__}; expected an Outcome")


def tail(text: str | bytes, limit: int = DEFAULT_TAIL_BYTES) -> str:
    """The last ``limit`` bytes of ``text`` as text (never more than the payload limit)."""
    data = text if isinstance(text, bytes) else text.encode()
    limit = max(1, min(limit, MAX_PAYLOAD_BYTES))
    if len(data) > limit:
        data = data[-limit:]
    return data.decode(errors="replace")


class GoalRunner(Protocol):
    def __call__(self, task: Task) -> Any: ...


class WorkflowRunner(Protocol):
    def __call__(
        self, workflow: WorkflowDefinition, task: Task, goal_runner: GoalRunner
    ) -> Any: ...


# -- built-in: command -----------------------------------------------------------------------

PLACEHOLDERS = ("goal", "device_id", "driver_type", "task_id", "attempt", "tags", "host_id")
SAFE_PLACEHOLDERS = frozenset(PLACEHOLDERS) - {"goal"}  # validated ids: safe anywhere
SECRET_ENV = ("DEVICEQ_HOST_TOKEN",)
_FIELD_RE = re.compile(r"\$\{[^{}]*\}|\{\{|\}\}|\{([^{}]*)\}|[{}]")


@dataclass(frozen=True)
class CommandTemplate:
    """A command template split into arguments ONCE, at start, like a shell would split it;
    then each argument's placeholders are substituted with the values as they are: a value is
    never split, globbed or re-parsed here, whatever it contains.

    Placeholders: ``{device_id}`` ``{driver_type}`` ``{task_id}`` ``{attempt}`` ``{tags}``
    ``{host_id}`` (validated ids: allowed anywhere in an argument, e.g. ``--serial={device_id}``)
    and ``{goal}``, free text, which must be a whole argument. Where the goal must travel through
    a shell — a script (``sh -c 'echo {goal:shell}'``) or a command that hands its arguments to
    a shell (``adb shell``, ``ssh``) — write ``{goal:shell}``: it is quoted as one word for that
    shell. ``sh -c {goal}`` runs the goal itself as a shell script, on purpose (producers then
    have code execution on the host). ``{{`` and ``}}`` are literal braces, and so is a shell's
    ``${VAR}`` (the task's values are also in the environment: ``"$DEVICEQ_GOAL"``). An unknown
    placeholder, or ``{goal}`` inside a larger argument, is a ConfigError at start."""

    template: str
    parts: tuple[tuple[tuple[str, str], ...], ...]  # per argument: (literal | name, kind)

    @classmethod
    def parse(cls, template: str, allowed: frozenset[str] | tuple[str, ...] = PLACEHOLDERS
              ) -> CommandTemplate:  # fmt: skip
        if not isinstance(template, str) or not template.strip():
            raise ConfigError("a command template must be a non-empty string")
        try:
            words = shlex.split(template)
        except ValueError as exc:
            raise ConfigError(f"bad command template {template!r}: {exc}") from None
        if not words:
            raise ConfigError(f"bad command template {template!r}: empty")
        allowed = frozenset(allowed)
        parts: list[tuple[tuple[str, str], ...]] = []
        for i, word in enumerate(words):
            pieces: list[tuple[str, str]] = []
            pos = 0
            for m in _FIELD_RE.finditer(word):
                if m.start() > pos:
                    pieces.append((word[pos : m.start()], "lit"))
                pos = m.end()
                tok = m.group(0)
                if tok in ("{{", "}}"):
                    pieces.append((tok[0], "lit"))
                    continue
                if tok.startswith("$"):  # a shell's ${VAR}: not a placeholder
                    pieces.append((tok, "lit"))
                    continue
                name = m.group(1)
                if name is None:
                    raise ConfigError(
                        f"bad command template {template!r}: a lone {tok!r} (write {tok * 2} "
                        "for a literal brace)"
                    )
                base, _, fmt = name.partition(":")
                if base not in allowed or fmt not in ("", "shell") or (fmt and base != "goal"):
                    known = ", ".join("{" + p + "}" for p in sorted(allowed))
                    raise ConfigError(
                        f"unknown placeholder {{{name}}} in command template {template!r}; "
                        f"known: {known} and {{goal:shell}}"
                    )
                pieces.append((base, "shell" if fmt else "value"))
            if pos < len(word):
                pieces.append((word[pos:], "lit"))
            whole = len(pieces) == 1
            for piece, kind in pieces:
                if piece == "goal" and kind == "value" and not whole:
                    raise ConfigError(
                        f"command template {template!r}: {{goal}} must be a whole argument "
                        f"(in {word!r} it would be spliced into other text); to hand the goal "
                        "to a shell script write {goal:shell} (quoted for that shell), or pass "
                        "it as its own argument"
                    )
                if piece == "goal" and kind == "value" and _to_remote_shell(words, i):
                    raise ConfigError(
                        f"command template {template!r}: {words[0]} hands its arguments to a "
                        "shell, which would parse the goal; write {goal:shell} so it arrives "
                        "as one quoted word"
                    )
            parts.append(tuple(pieces))
        return cls(template, tuple(parts))

    def render(self, values: Mapping[str, str]) -> list[str]:
        """The argument vector for ``values`` (every placeholder of the template given)."""
        argv: list[str] = []
        for pieces in self.parts:
            out = []
            for piece, kind in pieces:
                if kind == "lit":
                    out.append(piece)
                elif kind == "shell":
                    out.append(shlex.quote(values[piece]))
                else:
                    out.append(values[piece])
            argv.append("".join(out))
        return argv

    @property
    def names(self) -> frozenset[str]:
        return frozenset(p for pieces in self.parts for p, kind in pieces if kind != "lit")


def _to_remote_shell(words: list[str], i: int) -> bool:
    """True when argument ``i`` reaches a shell as command-line text: after ``adb ... shell``
    or ``ssh HOST`` (both join their arguments into one command line for a shell)."""
    prog = os.path.basename(words[0])
    if prog == "adb" and "shell" in words[1:i]:
        return True
    return prog == "ssh" and i >= 2


def render_argv(template: str, values: Mapping[str, str]) -> list[str]:
    """Split ``template`` once (like a shell), then substitute placeholders from ``values`` as
    whole values (see `CommandTemplate`). Raises ConfigError for an unknown placeholder."""
    return CommandTemplate.parse(template, tuple(values)).render(values)


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """Signal a whole process group; False if it no longer exists."""
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def exited(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for child ``pid`` to exit, without reaping it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
        except ChildProcessError:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(0.02, left))


# The watchdog a command runs under: a small Python process (no site, no deviceq import) that
# leads the command's process group, forks and execs the command, and kills the whole group
# when the host daemon is gone (its control pipe closes: SIGKILL) or the run's lease ends
# without a renewal (the daemon is frozen, SIGSTOP, or cut off from Redis). It ignores the
# group's SIGTERM (meant for the command) and exits with the command's status.
GUARD_CODE = r"""
import os, select, signal, sys, time
fd, left, argv = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
deadline = time.monotonic() + left if left > 0 else None
def kill(msg):
    try:
        os.write(2, ("\n[deviceq watchdog] " + msg + "\n").encode())
    except OSError:
        pass
    os.killpg(0, signal.SIGKILL)
    os._exit(137)
pid = os.fork()
if pid == 0:
    os.close(fd)
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        os.write(2, ("cannot start %r: %s\n" % (argv[0], e)).encode())
    os._exit(127)
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
try:
    pfd = os.pidfd_open(pid)
except (AttributeError, OSError):
    pfd = None
buf, status = b"", None
while status is None:
    timeout = 0.05 if pfd is None else None
    if deadline is not None:
        t = max(0.0, deadline - time.monotonic())
        timeout = t if timeout is None else min(timeout, t)
    try:
        ready = select.select([fd] + ([pfd] if pfd is not None else []), [], [], timeout)[0]
    except InterruptedError:
        continue
    if fd in ready:
        data = os.read(fd, 4096)
        if not data:
            kill("the host daemon is gone: run killed")
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.startswith(b"EXTEND "):
                deadline = time.monotonic() + float(line[7:])
    wpid, st = os.waitpid(pid, os.WNOHANG)
    if wpid:
        status = st
    elif deadline is not None and time.monotonic() >= deadline:
        kill("lease ended without a renewal (host daemon frozen or cut off): run killed")
code = os.waitstatus_to_exitcode(status)
if code < 0:
    signal.signal(-code, signal.SIG_DFL)
    os.kill(os.getpid(), -code)
    time.sleep(1)
    os._exit(128 - code)
os._exit(code)
"""
WATCHDOG_MARK = b"[deviceq watchdog]"


class CommandRunner:
    """Runs a command per task. ``template`` is split into arguments once, at start (see
    `CommandTemplate` for the placeholders and how ``{goal}`` may be used), and executed
    directly, never through a shell unless the template names one. The same values are in
    the environment (``DEVICEQ_GOAL`` ...). Exit 0 is success; an exit code listed in
    ``infra_exit_codes`` is an `infrastructure` failure (the device's, not the task's); the
    tail of the combined stdout/stderr is the result or error.

    The command runs in a process group of its own, under a watchdog (``GUARD_CODE``) that
    kills the group when the host daemon dies or the task's lease (``Task.lease``) ends
    without a renewal; on cancel the group gets SIGTERM, then SIGKILL after ``term_grace``
    seconds; when the command exits, leftovers of its group are killed."""

    def __init__(
        self,
        template: str | None = None,
        *,
        command: str | None = None,
        tail_bytes: int = DEFAULT_TAIL_BYTES,
        term_grace: float = 3.0,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        infra_exit_codes: Any = (),
    ) -> None:
        template = template or command
        if not template or not str(template).strip():
            raise ConfigError("the command runner needs a template (--command 'TEMPLATE')")
        self.parsed = CommandTemplate.parse(str(template))
        self.template = str(template)
        self.tail_bytes = int(tail_bytes)
        self.term_grace = float(term_grace)
        self.cwd = cwd
        self.extra_env = dict(env or {})
        codes = [infra_exit_codes] if isinstance(infra_exit_codes, int | str) else infra_exit_codes
        try:
            self.infra_exit_codes = frozenset(int(c) for c in codes or ())
        except (TypeError, ValueError):
            raise ConfigError(
                f"infra exit codes must be integers, got {infra_exit_codes!r}"
            ) from None
        if any(not 1 <= c <= 255 for c in self.infra_exit_codes):
            raise ConfigError("infra exit codes must be between 1 and 255")

    def argv(self, task: Task) -> list[str]:
        """The argument vector for ``task`` (each placeholder one value, never re-split)."""
        values = {
            "goal": task.goal, "device_id": task.device_id, "driver_type": task.driver_type,
            "task_id": task.task_id, "attempt": str(task.attempt), "tags": ",".join(task.tags),
            "host_id": task.host_id,
        }  # fmt: skip
        return self.parsed.render(values)

    def __call__(self, task: Task) -> Outcome:
        argv = self.argv(task)
        env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
        env.update(self.extra_env)
        env.update(task.env())
        lease = task.lease
        left = lease.remaining() if lease is not None else None
        if left is not None and left <= 0:
            return Outcome.failure("lease already ended: not started")
        ctl_r, ctl_w = os.pipe()
        guard = [sys.executable, "-I", "-S", "-c", GUARD_CODE, str(ctl_r),
                 f"{left or 0:.3f}", *argv]  # fmt: skip
        try:
            proc = subprocess.Popen(
                guard, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, env=env, cwd=self.cwd, start_new_session=True,
                pass_fds=(ctl_r,),
            )  # fmt: skip
        except OSError as exc:
            os.close(ctl_r)
            os.close(ctl_w)
            return Outcome.failure(f"cannot start {argv[0]!r}: {exc}")
        os.close(ctl_r)
        task.logger.info("command started", fields={"pid": proc.pid, "argv0": argv[0]})
        buf = bytearray()
        limit = max(1, min(self.tail_bytes, MAX_PAYLOAD_BYTES))

        def read() -> None:
            assert proc.stdout is not None
            fd = proc.stdout.fileno()
            for chunk in iter(lambda: os.read(fd, 65536), b""):
                buf.extend(chunk)
                if len(buf) > 4 * limit:
                    del buf[: len(buf) - limit]

        reader = threading.Thread(target=read, name=f"out-{task.task_id}", daemon=True)
        reader.start()
        stopped = False
        sent = lease.version if lease is not None else 0
        try:
            # The leader (the watchdog) is never reaped before its group is killed: while it
            # is a zombie its pid (= the group id) cannot be reused, so killing the group
            # never hits a stranger.
            while not exited(proc.pid, 0.05):
                if task.cancel.is_set():
                    stopped = True
                    self._stop(proc, task)
                    break
                if lease is not None and lease.version != sent:
                    sent = lease.version
                    left = lease.remaining()
                    if left is not None:
                        with contextlib.suppress(OSError):
                            os.write(ctl_w, f"EXTEND {max(0.0, left):.3f}\n".encode())
            kill_group(proc.pid)  # leftovers (background children) of the command's group
            rc = proc.wait()
        finally:
            os.close(ctl_w)
        reader.join(2.0)
        text = tail(bytes(buf), limit)
        if stopped:
            return Outcome.failure(f"stopped (signal {-rc if rc < 0 else rc})\n{text}".rstrip())
        if rc == 0:
            return Outcome.success(text)
        if WATCHDOG_MARK in buf:
            return Outcome.failure(f"killed by the lease watchdog\n{text}".rstrip())
        why = f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}"
        if rc in self.infra_exit_codes:
            return Outcome.infrastructure(f"{why} (an infrastructure failure)\n{text}".rstrip())
        return Outcome.failure(f"{why}\n{text}".rstrip())

    def _stop(self, proc: subprocess.Popen[bytes], task: Task) -> None:
        kill_group(proc.pid, signal.SIGTERM)
        if not exited(proc.pid, self.term_grace):
            task.logger.warning("command ignored SIGTERM; killing its process group")
        kill_group(proc.pid, signal.SIGKILL)
        exited(proc.pid, 10.0)


# -- built-in: sim ---------------------------------------------------------------------------


def parse_duration(spec: str | float | int) -> Callable[[random.Random], float]:
    """A duration distribution: ``0.5`` (fixed), ``uniform:A,B``, ``exp:MEAN``,
    ``normal:MEAN,SD`` or ``lognormal:MEAN,SD`` (seconds; never negative)."""
    if isinstance(spec, int | float):
        value = float(spec)
        return lambda rng: value
    text = str(spec).strip()
    kind, _, rest = text.partition(":")
    try:
        if not rest:
            value = float(text)
            if value < 0:
                raise ValueError("negative")
            return lambda rng: value
        nums = [float(x) for x in rest.split(",")]
        if kind == "uniform" and len(nums) == 2:
            a, b = nums
            return lambda rng: max(0.0, rng.uniform(a, b))
        if kind == "exp" and len(nums) == 1 and nums[0] > 0:
            mean = nums[0]
            return lambda rng: rng.expovariate(1.0 / mean)
        if kind == "normal" and len(nums) == 2:
            mu, sd = nums
            return lambda rng: max(0.0, rng.gauss(mu, sd))
        if kind == "lognormal" and len(nums) == 2 and nums[0] > 0:
            import math

            mean, sd = nums
            sigma2 = math.log(1 + (sd / mean) ** 2)
            mu = math.log(mean) - sigma2 / 2
            return lambda rng: rng.lognormvariate(mu, math.sqrt(sigma2))
    except ValueError:
        pass
    raise ConfigError(
        f"bad duration {text!r}: use SECONDS, uniform:A,B, exp:MEAN, normal:MEAN,SD "
        "or lognormal:MEAN,SD"
    )


class SimRunner:
    """Simulated work for demos and benchmarks: waits a duration drawn from ``duration`` (see
    `parse_duration`), then fails with probability ``fail_rate`` (a reported failure) or raises
    with probability ``error_rate`` (a runner error). Stops at once when cancelled."""

    def __init__(
        self,
        duration: str | float = "0.1",
        fail_rate: float = 0.0,
        error_rate: float = 0.0,
        seed: int | None = None,
    ) -> None:
        self.draw = parse_duration(duration)
        for name, rate in (("fail_rate", fail_rate), ("error_rate", error_rate)):
            if not 0.0 <= float(rate) <= 1.0:
                raise ConfigError(f"{name} must be between 0 and 1, got {rate}")
        self.fail_rate = float(fail_rate)
        self.error_rate = float(error_rate)
        self.rng = random.Random(seed)
        self._lock = threading.Lock()

    def __call__(self, task: Task) -> Outcome:
        with self._lock:
            seconds, roll = self.draw(self.rng), self.rng.random()
        if task.cancel.wait(seconds):
            return Outcome.failure(f"simulated work stopped after less than {seconds:.3f}s")
        if roll < self.error_rate:
            raise RuntimeError("simulated runner error")
        if roll < self.error_rate + self.fail_rate:
            return Outcome.failure(f"simulated failure after {seconds:.3f}s")
        return Outcome.success(f"simulated {task.goal!r} on {task.device_id} in {seconds:.3f}s")


# -- built-in: reference workflow runner -----------------------------------------------------


def run_steps(
    workflow: WorkflowDefinition, task: Task, goal_runner: GoalRunner, **_: Any
) -> Outcome:
    """The reference workflow runner: each step's goal in order through the goal runner, on the
    task's device; stops at the first failure (or cancellation). Exceptions propagate."""
    results: list[str] = []
    total = len(workflow.steps)
    for i, step in enumerate(workflow.steps, 1):
        label = f"step {i}/{total}" + (f" ({step.name})" if step.name else "")
        if task.cancel.is_set():
            return Outcome.failure(f"stopped before {label}")
        sub = replace(task, goal=step.goal, workflow=workflow.name, step=i)
        sub.logger = task_logger(sub, task.logger.logger)
        sub.logger.info(f"workflow {workflow.name}: {label} started")
        out = as_outcome(goal_runner(sub))
        if not out.ok:
            return Outcome.failure(tail(f"{label} failed: {out.text}"))
        results.append(f"{label}: {out.text.strip()}")
    return Outcome.success(tail("\n".join(results)))


# -- resolution ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunnerSpec:
    """Names a runner: a built-in name, ``package.module:callable`` or an entry point name in
    group ``deviceq.runners``; ``options`` configure built-ins and instantiated classes."""

    name: str
    options: Mapping[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.name


BUILTIN_GOAL: dict[str, Callable[..., GoalRunner]] = {"command": CommandRunner, "sim": SimRunner}
BUILTIN_WORKFLOW: dict[str, Any] = {"steps": run_steps, "sequential": run_steps}


def is_builtin(spec: RunnerSpec) -> bool:
    return spec.name in BUILTIN_GOAL or spec.name in BUILTIN_WORKFLOW


def _import(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import runner module {module_name!r}: {exc}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"module {module_name!r} has no {attr!r}") from None
    return obj


def _entry_point(name: str) -> Any:
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            try:
                return ep.load()
            except Exception as exc:  # a broken plugin must name itself
                raise ConfigError(f"entry point {name!r} failed to load: {exc}") from None
    known = sorted({*BUILTIN_GOAL, *BUILTIN_WORKFLOW})
    raise ConfigError(
        f"unknown runner {name!r}: not built in ({', '.join(known)}), not an import path "
        f"'package.module:callable' and not an entry point in group {ENTRY_POINT_GROUP!r}"
    )


def load_runner(spec: RunnerSpec, kind: str = "goal") -> Callable[..., Any]:
    """Resolve ``spec`` to a callable runner of ``kind`` (``goal`` or ``workflow``), in this
    process. Raises ConfigError naming the problem."""
    if kind == "goal" and spec.name in BUILTIN_GOAL:
        try:
            return BUILTIN_GOAL[spec.name](**dict(spec.options))
        except TypeError as exc:
            raise ConfigError(f"bad options for runner {spec.name!r}: {exc}") from None
    if kind == "workflow" and spec.name in BUILTIN_WORKFLOW:
        return BUILTIN_WORKFLOW[spec.name]
    if spec.name in BUILTIN_GOAL or spec.name in BUILTIN_WORKFLOW:
        raise ConfigError(f"{spec.name!r} is not a {kind} runner")
    obj = _import(spec.name) if ":" in spec.name else _entry_point(spec.name)
    if isinstance(obj, type):
        try:
            obj = obj(**dict(spec.options))
        except TypeError as exc:
            raise ConfigError(f"cannot create runner {spec.name!r}: {exc}") from None
    if not callable(obj):
        raise ConfigError(f"runner {spec.name!r} is not callable")
    return obj


# -- process isolation -----------------------------------------------------------------------

_MP_LOCK = threading.Lock()
_MP_CTX: Any = None


def _mp_context() -> Any:
    """A forkserver context (safe in a threaded parent; cheap forks of a preloaded server)."""
    global _MP_CTX
    with _MP_LOCK:
        if _MP_CTX is None:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(["deviceq.runners", "deviceq.models"])
            _MP_CTX = ctx
        return _MP_CTX


def _child_main(
    result_w: Any, cancel_r: Any, kind: str, spec: RunnerSpec, goal_spec: RunnerSpec | None,
    task_data: dict[str, Any], workflow_json: str | None, log_format: str,
) -> None:  # fmt: skip
    """Body of an isolated runner process: its own process group, cancel via a pipe."""
    with contextlib.suppress(OSError):
        os.setsid()
    from . import logs

    logs.configure(log_format)
    cancel = threading.Event()
    left = task_data.pop("lease_left", None)
    deadline = [None if left is None else time.monotonic() + float(left)]

    def die(why: str) -> None:
        logging.getLogger("deviceq.runner").error(f"{why}: run killed")
        logging.shutdown()
        os.killpg(os.getpid(), signal.SIGKILL)

    def watch() -> None:
        # the parent's messages: "cancel" (stop cooperatively), ("lease", seconds) (renewed);
        # the pipe closing means the host daemon is gone; a lease ending unrenewed means it is
        # frozen or cut off: either way this run must not go on
        while True:
            d = deadline[0]
            wait = None if d is None else max(0.0, d - time.monotonic())
            try:
                ready = cancel_r.poll(wait)
            except (EOFError, OSError):
                ready = True
            if not ready:
                if deadline[0] is not None and time.monotonic() >= deadline[0]:
                    die("lease ended without a renewal (host daemon frozen or cut off)")
                continue
            try:
                msg = cancel_r.recv()
            except (EOFError, OSError):
                die("the host daemon is gone")
                return
            if isinstance(msg, tuple) and msg and msg[0] == "lease":
                deadline[0] = time.monotonic() + float(msg[1])
            else:
                cancel.set()

    threading.Thread(target=watch, daemon=True).start()
    task = Task.from_portable(task_data, cancel)
    try:
        if kind == "workflow":
            assert goal_spec is not None and workflow_json is not None
            goal_runner = load_runner(goal_spec, "goal")
            wf = WorkflowDefinition.model_validate_json(workflow_json)
            out = as_outcome(load_runner(spec, "workflow")(wf, task, goal_runner))
        else:
            out = as_outcome(load_runner(spec, "goal")(task))
        result_w.send(("ok", out.ok, out.text, out.infra))
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
        result_w.send(("error", f"{type(exc).__name__}: {exc}", traceback.format_exc()))
    finally:
        result_w.close()
        if os.getpgrp() == os.getpid():  # leftovers of the runner die with it
            logging.shutdown()
            os.killpg(os.getpid(), signal.SIGKILL)


class RunnerCrashed(RuntimeError):
    """An isolated runner's process died without an answer, or raised."""


class IsolatedRunner:
    """Runs a Python runner in a child process per call (forkserver): the worker's threads keep
    running whatever the runner does with the GIL. On cancel the child's cancel signal is set;
    if it has not finished ``kill_grace`` seconds later its process group is killed."""

    def __init__(
        self,
        spec: RunnerSpec,
        kind: str = "goal",
        goal_spec: RunnerSpec | None = None,
        *,
        kill_grace: float = 5.0,
        log_format: str = "text",
    ) -> None:
        self.spec, self.kind, self.goal_spec = spec, kind, goal_spec
        self.kill_grace = kill_grace
        self.log_format = log_format

    def __call__(self, *args: Any) -> Outcome:
        if self.kind == "workflow":
            workflow, task = args[0], args[1]
            wf_json: str | None = workflow.model_dump_json()
        else:
            task, wf_json = args[0], None
        lease = task.lease
        left = lease.remaining() if lease is not None else None
        if left is not None and left <= 0:
            return Outcome.failure("lease already ended: not started")
        ctx = _mp_context()
        result_r, result_w = ctx.Pipe(duplex=False)
        cancel_r, cancel_w = ctx.Pipe(duplex=False)
        from . import logs

        data = {**task.portable(), "lease_left": left}
        proc = ctx.Process(
            target=_child_main,
            args=(result_w, cancel_r, self.kind, self.spec, self.goal_spec, data,
                  wf_json, logs._FORMAT.get("value", self.log_format)),
            name=f"runner-{task.task_id}", daemon=False,
        )  # fmt: skip
        proc.start()
        result_w.close()
        cancel_r.close()
        task.logger.info("isolated runner started", fields={"pid": proc.pid})
        answer: Any = None
        killed = False
        sent = lease.version if lease is not None else 0
        try:
            cancel_sent_at: float | None = None
            while True:
                if lease is not None and lease.version != sent:
                    sent = lease.version
                    remaining = lease.remaining()
                    if remaining is not None:
                        with contextlib.suppress(OSError):
                            cancel_w.send(("lease", max(0.0, remaining)))
                if result_r.poll(0.05):
                    try:
                        answer = result_r.recv()
                    except (EOFError, OSError):
                        answer = None
                    break
                if not proc.is_alive():
                    if result_r.poll(0.05):
                        with contextlib.suppress(EOFError, OSError):
                            answer = result_r.recv()
                    break
                if task.cancel.is_set() and cancel_sent_at is None:
                    cancel_sent_at = time.monotonic()
                    with contextlib.suppress(OSError):
                        cancel_w.send("cancel")
                waited = 0.0 if cancel_sent_at is None else time.monotonic() - cancel_sent_at
                if waited > self.kill_grace:
                    task.logger.warning("runner ignored cancel; killing its process group")
                    killed = True
                    break
        finally:
            pid = proc.pid
            if pid is not None:
                if killed:
                    kill_group(pid)  # it is alive (it ignored the cancel): the group is its own
                proc.join(1.0 if not killed else 5.0)
                if proc.is_alive():
                    kill_group(pid)
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    proc.join(5.0)
            for conn in (result_r, cancel_w):
                conn.close()
        if killed:
            return Outcome.failure("runner did not stop after cancel; process group killed")
        if answer is None:
            raise RunnerCrashed(f"runner process exited with code {proc.exitcode} and no answer")
        # (a child that answered ends itself and its group with SIGKILL: exit code -9 is fine)
        if answer[0] == "error":
            raise RunnerCrashed(f"{answer[1]}\n{tail(answer[2], 4096)}")
        return Outcome(
            bool(answer[1]), str(answer[2]), bool(answer[3]) if len(answer) > 3 else False
        )


def build_goal_runner(
    spec: RunnerSpec, isolation: str = "auto", *, kill_grace: float = 5.0
) -> GoalRunner:
    """The goal runner for ``spec``: in this process (built-ins, or ``isolation="thread"``) or
    in a child process per task (``"process"``; ``"auto"`` isolates every non-built-in)."""
    _check_isolation(isolation)
    if isolation == "thread" or (isolation == "auto" and is_builtin(spec)):
        return load_runner(spec, "goal")
    load_runner(spec, "goal")  # fail fast on a bad spec, in the parent
    return cast(GoalRunner, IsolatedRunner(spec, "goal", kill_grace=kill_grace))


def build_workflow_runner(
    spec: RunnerSpec,
    goal_spec: RunnerSpec,
    isolation: str = "auto",
    *,
    kill_grace: float = 5.0,
) -> WorkflowRunner:
    """The workflow runner for ``spec`` (see `build_goal_runner`). An isolated workflow runner
    runs its steps' goal runner (``goal_spec``) inside the same child process."""
    _check_isolation(isolation)
    if isolation == "thread" or (isolation == "auto" and is_builtin(spec)):
        return load_runner(spec, "workflow")
    load_runner(spec, "workflow")
    return cast(WorkflowRunner, IsolatedRunner(spec, "workflow", goal_spec, kill_grace=kill_grace))


def _check_isolation(isolation: str) -> None:
    if isolation not in ("auto", "process", "thread"):
        raise ConfigError(f"isolation must be auto, process or thread, not {isolation!r}")
