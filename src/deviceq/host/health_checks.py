"""The kinds of device health check (``--health-check DRIVER=CHECK``) and how each one runs.
`deviceq.host.health` decides when a device's check runs; a check is called with the `Task`
of that run and answers ``(healthy, output, reason)``.

- `CommandCheck` (``DRIVER=TEMPLATE``): a command template like the command runner's (split
  once, never through a shell unless it names one; placeholders ``{device_id}``
  ``{driver_type}`` ``{tags}`` ``{host_id}``), run through `CommandRunner` in a process group
  of its own under the same watchdog (killed when the daemon dies or the timeout passes),
  without the host token in its environment. Exit 0 is healthy; otherwise the reason is the
  exit status and the last line written on stderr, else the output's last line (``exit
  code 1: no usb``).
- `PythonCheck` (``DRIVER=python:package.module:callable``, or an entry point name in group
  ``deviceq.runners``, resolved like a runner by `load_runner`: a class is instantiated
  without arguments): ``check(task)`` called in a thread of its own in the daemon's process.
  ``True``, ``None`` or an ok `Outcome` is healthy; ``False`` or a failed `Outcome` is
  unhealthy (the Outcome's text is the output, its last line the reason); an exception is
  unhealthy with the reason ``raised ExcType: message`` and the traceback as the output. A
  check still running when the timeout passes is asked to stop (``task.cancel`` is set; it
  should watch it, or ``task.time_left()``) and the device is unhealthy (``timed out after
  N s``, with the stack where it hung as the output); as a thread cannot be killed, no other
  check of that device starts until that call has returned (`busy`), so the device stays out
  of service meanwhile.

Whatever a check prints or returns, the host token is never stored (`HostClient.health_end`
replaces it) and only the output's last 2,000 bytes are kept."""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..core.errors import ConfigError
from .link import HEALTH_OUTPUT_BYTES
from .runners import CommandRunner, Outcome, RunnerSpec, Task, as_outcome
from .runners.command import WATCHDOG_MARK
from .runners.registry import is_builtin, load_runner

PYTHON_PREFIX = "python:"
CheckResult = tuple[bool, str, str]  # (healthy, output, reason when unhealthy)
STOPPED = "stopped: the host daemon is shutting down"
POLL = 0.05  # seconds between looks at a running Python check's cancel signal


class HealthCheck(Protocol):
    def __call__(self, task: Task) -> CheckResult: ...

    def busy(self, device_id: str) -> bool:
        """A call for this device has not returned yet (no other may start)."""
        ...


@dataclass(frozen=True)
class PythonCheckSpec:
    """A resolved ``python:PATH`` health check: the import path (or entry point name) and the
    callable it names."""

    path: str
    func: Callable[[Task], Any] = field(compare=False, repr=False)

    def __str__(self) -> str:
        return PYTHON_PREFIX + self.path


def resolve_python_check(path: str) -> PythonCheckSpec:
    """Resolve ``package.module:callable`` (or an entry point name) like a runner: a class is
    instantiated without arguments. ConfigError when it cannot be imported, has no such
    attribute, is not callable or fails to load."""
    path = path.strip()
    if not path:
        raise ConfigError("python: needs an import path, e.g. python:mychecks:adb_ok")
    spec = RunnerSpec(path)
    if is_builtin(spec):
        raise ConfigError(f"{path!r} is a built-in runner, not a health check: "
                          "use python:package.module:callable")  # fmt: skip
    try:
        func = load_runner(spec, "goal")
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - a module failing at import must name itself
        raise ConfigError(f"{path!r} failed to load: {type(exc).__name__}: {exc}") from None
    return PythonCheckSpec(path, func)


def check_spec(value: Any) -> str | PythonCheckSpec:
    """A health check as given (a template, ``python:PATH``, a resolved spec or a callable) as
    settings keep it: a template (checked later, by the caller) or a resolved `PythonCheckSpec`."""
    if isinstance(value, PythonCheckSpec):
        return value
    if isinstance(value, str):
        if value.strip().startswith(PYTHON_PREFIX):
            return resolve_python_check(value.strip()[len(PYTHON_PREFIX) :])
        return value
    if callable(value):  # a callable given directly (settings built in Python)
        name = getattr(value, "__qualname__", type(value).__qualname__)
        return PythonCheckSpec(f"{getattr(value, '__module__', '?')}:{name}", value)
    raise ConfigError("the check must be a command template or python:package.module:callable")


def build_check(spec: str | PythonCheckSpec, *, timeout: float, term_grace: float) -> HealthCheck:
    if isinstance(spec, PythonCheckSpec):
        return PythonCheck(spec, timeout=timeout, term_grace=term_grace)
    return CommandCheck(spec, timeout=timeout, term_grace=term_grace)


class CommandCheck:
    """A command template's check (see the module docstring)."""

    def __init__(self, template: str, *, timeout: float, term_grace: float) -> None:
        self.timeout = timeout
        self.runner = CommandRunner(
            template, tail_bytes=2 * HEALTH_OUTPUT_BYTES, term_grace=term_grace
        )

    def busy(self, device_id: str) -> bool:
        return False  # its process group is killed when it times out or is stopped

    def __call__(self, task: Task) -> CheckResult:
        out = self.runner(task)
        if out.ok:
            return True, out.text, ""
        first, _, rest = out.text.partition("\n")
        if WATCHDOG_MARK.decode() in out.text or first.startswith("killed by the lease watchdog"):
            reason = f"timed out after {self.timeout:g} s"
        elif first.startswith("stopped"):
            reason = STOPPED
        else:
            # the exit status and the last line on stderr (else of the output):
            # "exit code 1: adb: device offline"
            last = out.reason_line or last_line(rest)
            reason = f"{first}: {last}" if first and last else first or "health check failed"
        return False, rest, reason


class PythonCheck:
    """A Python callable's check (see the module docstring)."""

    def __init__(self, spec: PythonCheckSpec, *, timeout: float, term_grace: float) -> None:
        self.spec = spec
        self.timeout = timeout
        self.term_grace = term_grace
        self.lock = threading.Lock()
        self.threads: dict[str, threading.Thread] = {}  # device id -> its call, until it returns

    def busy(self, device_id: str) -> bool:
        with self.lock:
            t = self.threads.get(device_id)
        return t is not None and t.is_alive()

    def __call__(self, task: Task) -> CheckResult:
        did = task.device_id
        if task.cancel.is_set():
            return False, "", STOPPED
        if task.deadline is None:  # for task.time_left(); the lease clock says the same
            task.deadline = time.monotonic() + self.timeout
        done = threading.Event()
        got: list[CheckResult] = []

        def call() -> None:
            try:
                got.append(result_of(self.spec.func(task)))
            except BaseException as exc:  # noqa: BLE001 - any exception: the device is unhealthy
                got.append(raised(exc))
            finally:
                if not got:  # (formatting the exception failed)
                    got.append((False, "", "health check failed"))
                with self.lock:
                    if self.threads.get(did) is threading.current_thread():
                        del self.threads[did]
                done.set()

        t = threading.Thread(target=call, name=f"health-call-{did}", daemon=True)
        with self.lock:
            self.threads[did] = t
        t.start()
        deadline = time.monotonic() + self.timeout
        while not done.wait(max(0.0, min(POLL, deadline - time.monotonic()))):
            if task.cancel.is_set():  # the daemon is closing: a moment to return
                return got[0] if done.wait(self.term_grace) else (False, "", STOPPED)
            if time.monotonic() >= deadline:
                task.cancel.set()
                output = got[0][1] if done.wait(POLL) else hung_at(t, self.timeout)
                return False, output, f"timed out after {self.timeout:g} s"
        return got[0]


def result_of(value: Any) -> CheckResult:
    """What a Python check returned, as (healthy, output, reason)."""
    if value is True:
        return True, "", ""
    if value is False:
        return False, "", "check returned False"
    try:
        out: Outcome = as_outcome(value)
    except TypeError:
        return False, "", (f"check returned {type(value).__name__}: expected True, False, "
                           "None or an Outcome")  # fmt: skip
    if out.ok:
        return True, out.text, ""
    return False, out.text, last_line(out.text) or "check returned a failed Outcome"


def raised(exc: BaseException) -> CheckResult:
    msg = str(exc).strip()
    reason = f"raised {type(exc).__name__}" + (f": {msg}" if msg else "")
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return False, text, reason


def hung_at(t: threading.Thread, timeout: float) -> str:
    """Where a timed-out check is (its stack), for the output."""
    head = (f"still running after {timeout:g} s (task.cancel set); no other check of this "
            "device starts until it returns\n")  # fmt: skip
    frame = sys._current_frames().get(t.ident or -1)
    return head + ("".join(traceback.format_stack(frame)) if frame is not None else "")


def last_line(text: str) -> str:
    return next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "")
