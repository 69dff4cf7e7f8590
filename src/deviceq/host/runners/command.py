"""The built-in ``command`` runner: a command per task from a template split once at start
(`CommandTemplate`), run in a process group of its own under a lease watchdog; as a thread
runner (`CommandRunner`) or an async one (`AsyncCommandRunner`, ``--async``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...core.bounds import MAX_PAYLOAD_BYTES
from ...core.errors import ConfigError, InvalidInput
from ..progress import PROGRESS_FILE_ENV, ProgressSource, progress_file
from .aio import first_of, pidfd, process_exited
from .base import DEFAULT_TAIL_BYTES, Outcome, Task, describe_exception
from .command_output import CommandOutput

PLACEHOLDERS = ("goal", "device_id", "driver_type", "task_id", "attempt", "tags", "host_id",
                "serial")  # fmt: skip
SAFE_PLACEHOLDERS = frozenset(PLACEHOLDERS) - {"goal"}  # validated ids: safe anywhere
SECRET_ENV = ("DEVICEQ_HOST_TOKEN",)
_FIELD_RE = re.compile(r"\$\{[^{}]*\}|\{\{|\}\}|\{([^{}]*)\}|[{}]")


@dataclass(frozen=True)
class CommandTemplate:
    """A command template split into arguments ONCE, at start, like a shell would split it;
    then each argument's placeholders are substituted with the values as they are: a value is
    never split, globbed or re-parsed here, whatever it contains.

    Placeholders: ``{device_id}`` ``{driver_type}`` ``{task_id}`` ``{attempt}`` ``{tags}``
    ``{host_id}`` ``{serial}`` (the device's real serial, else its id) (validated: allowed
    anywhere in an argument, e.g. ``--serial={device_id}``)
    and ``{goal}``, free text, which must be a whole argument. Where the goal must travel through
    a shell — a script (``sh -c 'echo {goal:shell}'``) or a command that hands its arguments to
    a shell (``adb shell``, ``ssh``) — write ``{goal:shell}``: it is quoted as one word for that
    shell. ``sh -c {goal}`` runs the goal itself as a shell script, on purpose (producers then
    have code execution on the host). ``{{`` and ``}}`` are literal braces, and so is a shell's
    ``${VAR}`` (the task's values are also in the environment: ``"$DEVICEQ_GOAL"``). An unknown
    placeholder, or ``{goal}`` inside a larger argument, is a ConfigError at start; so is a
    raw ``{goal}`` anywhere after a program that hands its arguments to a shell, wherever it
    stands in the argument vector (``timeout 60 adb -s X shell {goal}``, ``sudo ssh H {goal}``,
    ``su -c {goal}``).

    A value that starts with ``-`` in a whole-argument placeholder would be read as an option
    by the program (``git clone {goal}`` with the goal ``--upload-pack=CMD`` runs CMD): it is
    refused (InvalidInput, nothing runs) unless the template puts ``--`` (the end of the
    options) before that placeholder."""

    template: str
    parts: tuple[tuple[tuple[str, str], ...], ...]  # per argument: (literal | name, kind)
    after_options: tuple[bool, ...] = ()  # per argument: a ``--`` argument comes before it

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
                shell = _to_remote_shell(words, i) if piece == "goal" and kind == "value" else ""
                if shell:
                    raise ConfigError(
                        f"command template {template!r}: {shell} hands its arguments to a "
                        "shell, which would parse the goal; write {goal:shell} so it arrives "
                        "as one quoted word"
                    )
            parts.append(tuple(pieces))
        after = tuple("--" in words[:i] for i in range(len(words)))
        return cls(template, tuple(parts), after)

    def render(self, values: Mapping[str, str]) -> list[str]:
        """The argument vector for ``values`` (every placeholder of the template given)."""
        argv: list[str] = []
        for i, pieces in enumerate(self.parts):
            if len(pieces) == 1 and pieces[0][1] == "value":
                self._check_not_an_option(i, pieces[0][0], values[pieces[0][0]])
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

    def _check_not_an_option(self, i: int, name: str, value: str) -> None:
        """InvalidInput when ``value``, argument ``i`` of its own, would be taken for an
        option (it starts with ``-`` and no ``--`` comes before it in the template)."""
        if value.startswith("-") and not (i < len(self.after_options) and self.after_options[i]):
            shown = value if len(value) <= 40 else value[:40] + "..."
            raise InvalidInput(
                f"the {name} {shown!r} starts with '-': the command would take it for an "
                f"option; not run (a template that means it as an operand puts -- before "
                f"{{{name}}})"
            )

    @property
    def names(self) -> frozenset[str]:
        return frozenset(p for pieces in self.parts for p, kind in pieces if kind != "lit")


REMOTE_SHELLS = frozenset({"ssh", "rsh", "slogin"})
"""Programs that join the arguments after their host into one command line for a shell."""
ADB_SHELL_COMMANDS = ("shell", "exec-out", "exec-in")
"""adb commands that run their arguments through the device's shell as one command line."""
SHELL_COMMAND_OPTION = {"su": ("-c", "--command"), "runuser": ("-c", "--command")}
"""Programs whose option hands its value to a shell as a command line."""


def _to_remote_shell(words: list[str], i: int) -> str:
    """The program (or '' for none) that makes argument ``i`` reach a shell as command-line
    text: ``adb ... shell`` (or ``exec-out``, ``exec-in``), ``ssh HOST``, ``su -c``,
    wherever it stands before ``i`` (after ``timeout 60``, ``sudo -u lab``, ...)."""
    for j, word in enumerate(words[:i]):
        prog = os.path.basename(word)
        if prog == "adb":
            run = next((w for w in words[j + 1 : i] if w in ADB_SHELL_COMMANDS), "")
            if run:
                return f"adb {run}"
        if prog in REMOTE_SHELLS and i >= j + 2:
            return prog
        if any(opt in words[j + 1 : i] for opt in SHELL_COMMAND_OPTION.get(prog, ())):
            return f"{prog} -c"
    return ""


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


class _Command:
    """What the command runner's two kinds share: the template, the environment, starting
    the command under its watchdog and reading its end (`CommandRunner`, `AsyncCommandRunner`)."""

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
            "host_id": task.host_id, "serial": task.serial or task.device_id,
        }  # fmt: skip
        return self.parsed.render(values)

    def _start(self, task: Task) -> _Started | Outcome:
        """The command started under its watchdog, in a process group of its own; or the
        outcome of a command that cannot start (nothing runs)."""
        try:
            argv = self.argv(task)
        except InvalidInput as exc:  # the task's own value: its failure, nothing runs
            task.logger.warning(f"not started: {exc}")
            return Outcome.failure(f"not started: {exc}")
        env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
        env.update(self.extra_env)
        env.update(task.env())
        progress = ProgressSource(task, progress_file(task))  # (a file only in a daemon)
        if progress.path is not None:
            env[PROGRESS_FILE_ENV] = progress.path
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
                stderr=subprocess.PIPE, env=env, cwd=self.cwd, start_new_session=True,
                pass_fds=(ctl_r,),
            )  # fmt: skip
        except (ValueError, OSError) as exc:
            # the task's own values cannot be passed (a NUL byte: ValueError; an argument
            # list too long: E2BIG): its failure (runner_failed), not the device's
            os.close(ctl_r)
            os.close(ctl_w)
            progress.finish()
            task.logger.warning(f"cannot start {argv[0]!r}: {type(exc).__name__}: {exc}")
            return Outcome.failure(f"cannot start the command: {describe_exception(exc)}")
        os.close(ctl_r)
        task.logger.debug("command started", fields={"pid": proc.pid, "argv0": argv[0]})
        out = CommandOutput(max(1, min(self.tail_bytes, MAX_PAYLOAD_BYTES)), task, progress)
        return _Started(proc, ctl_w, out, progress, lease.version if lease is not None else 0)

    @staticmethod
    def _forward_lease(task: Task, run: _Started) -> None:
        """A renewal moved the lease: tell the watchdog its new end."""
        lease = task.lease
        if lease is not None and lease.version != run.lease_version:
            run.lease_version = lease.version
            left = lease.remaining()
            if left is not None:
                with contextlib.suppress(OSError):
                    os.write(run.ctl_w, f"EXTEND {max(0.0, left):.3f}\n".encode())

    def _ended(self, rc: int, stopped: bool, out: CommandOutput) -> Outcome:
        """The outcome of a command that ended with ``rc`` (``stopped``: told to stop)."""
        text, buf = out.tail(), out.data()
        if rc != 0 and not stopped:
            return dataclasses.replace(self._failed(rc, text, buf), reason_line=out.err_last)
        if stopped:
            return Outcome.failure(f"stopped (signal {-rc if rc < 0 else rc})\n{text}".rstrip())
        return Outcome.success(text)

    def _failed(self, rc: int, text: str, buf: bytes) -> Outcome:
        if WATCHDOG_MARK in buf:
            return Outcome.failure(f"killed by the lease watchdog\n{text}".rstrip())
        why = f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}"
        if rc in self.infra_exit_codes:
            return Outcome.infrastructure(f"{why} (an infrastructure failure)\n{text}".rstrip())
        return Outcome.failure(f"{why}\n{text}".rstrip())


@dataclass(eq=False)
class _Started:
    """A command started: its watchdog process (the group's leader), the watchdog's control
    pipe, its output and progress as read, the lease version last forwarded."""

    proc: subprocess.Popen[bytes]
    ctl_w: int
    out: CommandOutput
    progress: ProgressSource
    lease_version: int


class CommandRunner(_Command):
    """Runs a command per task. ``template`` is split into arguments once, at start (see
    `CommandTemplate` for the placeholders and how ``{goal}`` may be used), and executed
    directly, never through a shell unless the template names one. The same values are in
    the environment (``DEVICEQ_GOAL`` ...). Exit 0 is success; an exit code listed in
    ``infra_exit_codes`` is an `infrastructure` failure (the device's, not the task's); the
    tail of the combined stdout/stderr is the result or error.

    The command runs in a process group of its own, under a watchdog (``GUARD_CODE``) that
    kills the group when the host daemon dies or the task's lease (``Task.lease``) ends
    without a renewal; on cancel the group gets SIGTERM, then SIGKILL after ``term_grace``
    seconds; when the command exits, leftovers of its group are killed. This one runs in its
    caller's thread (a thread runner: its output read by a thread per pipe);
    `AsyncCommandRunner` is the same on an event loop."""

    def __call__(self, task: Task) -> Outcome:
        run = self._start(task)
        if isinstance(run, Outcome):
            return run
        proc, out, progress = run.proc, run.out, run.progress
        assert proc.stdout is not None and proc.stderr is not None
        readers = [out.reader(proc.stdout, "stdout"), out.reader(proc.stderr, "stderr")]
        stopped = False
        try:
            # The leader (the watchdog) is never reaped before its group is killed: while it
            # is a zombie its pid (= the group id) cannot be reused, so killing the group
            # never hits a stranger.
            while not exited(proc.pid, 0.05):
                if task.cancel.is_set():
                    stopped = True
                    self._stop(proc, task)
                    break
                progress.poll()
                self._forward_lease(task, run)
            kill_group(proc.pid)  # leftovers (background children) of the command's group
            rc = proc.wait()
        finally:
            os.close(run.ctl_w)
        out.finish(readers)
        progress.finish()
        return self._ended(rc, stopped, out)

    def _stop(self, proc: subprocess.Popen[bytes], task: Task) -> None:
        kill_group(proc.pid, signal.SIGTERM)
        grace = task.stop_grace if task.stop_grace is not None else self.term_grace
        if not exited(proc.pid, grace):
            task.logger.warning("command ignored SIGTERM; killing its process group")
        kill_group(proc.pid, signal.SIGKILL)
        exited(proc.pid, 10.0)


ASYNC_POLL = 0.5
"""Seconds between an async command's looks at its lease (a renewal to forward) and its
progress file, at most, while it waits for the command's end or a stop, which wake it at once;
an eighth of the lease when that is shorter (a renewal reaches the watchdog long before the
lease it extends would end there), 50 ms at least."""


class AsyncCommandRunner(_Command):
    """The command runner as an async runner (``deviceq host run --command T --async``): the
    same command, watchdog, process group, environment, output, progress and outcomes as
    `CommandRunner`, awaited on the host's event loop. Its process's end is awaited on a
    pidfd and its pipes are read as the loop's selector finds them readable: no thread per
    run, for hosts whose runs mostly wait (adb, HTTP, Appium). On a stop its group gets
    SIGTERM, then SIGKILL after ``term_grace`` seconds, as with the thread runner."""

    async def __call__(self, task: Task) -> Outcome:
        run = self._start(task)
        if isinstance(run, Outcome):
            return run
        proc, out, progress = run.proc, run.out, run.progress
        assert proc.stdout is not None and proc.stderr is not None
        readers = [out.reader_async(proc.stdout, "stdout"), out.reader_async(proc.stderr, "stderr")]
        pfd = pidfd(proc.pid)
        left = task.lease.remaining() if task.lease is not None else None
        poll = ASYNC_POLL if left is None else min(ASYNC_POLL, max(0.05, left / 8))
        stopped = False
        try:
            # (the leader is never reaped before its group is killed: see CommandRunner)
            while True:
                ended = asyncio.ensure_future(process_exited(proc.pid, pfd, poll))
                told = asyncio.ensure_future(task.wait_cancel(poll))
                await first_of(None, ended, told)
                told.cancel()
                ended.cancel()
                # (their ends run before the next wait: a cancelled wait on the pidfd would
                # otherwise take the next one's reader away)
                await asyncio.gather(ended, told, return_exceptions=True)
                if ended.done() and not ended.cancelled() and ended.result():
                    break
                if task.cancel.is_set():
                    stopped = True
                    await self._stop(proc.pid, pfd, task)
                    break
                progress.poll()
                self._forward_lease(task, run)
            kill_group(proc.pid)  # leftovers (background children) of the command's group
            rc = proc.wait()  # (it has exited: this only reaps it)
        finally:
            os.close(run.ctl_w)
            if pfd is not None:
                os.close(pfd)
        await out.finish_async(readers)
        for pipe in (proc.stdout, proc.stderr):
            pipe.close()
        progress.finish()
        return self._ended(rc, stopped, out)

    async def _stop(self, pid: int, pfd: int | None, task: Task) -> None:
        kill_group(pid, signal.SIGTERM)
        grace = task.stop_grace if task.stop_grace is not None else self.term_grace
        if not await process_exited(pid, pfd, grace):
            task.logger.warning("command ignored SIGTERM; killing its process group")
        kill_group(pid, signal.SIGKILL)
        await process_exited(pid, pfd, 10.0)
