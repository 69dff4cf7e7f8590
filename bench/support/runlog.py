"""The run log: a runner command that proves, physically, that no device and no task ever ran two
things at once: it takes an exclusive, non-blocking ``flock`` on a per-device and a per-task
lock file (the kernel drops it when the process dies, SIGKILL included) and logs each run's
start and end. A second holder at the same moment finds the lock taken and logs ``OVERLAP``.

Usage (as a ``--command`` template, see `command`): ``python bench/support/runlog.py {device_id}
{task_id} {goal}`` with the goal ``SECONDS [EXIT_CODE]``; the log directory is ``$DQ_RUNLOG``.
`RunLog` reads what the runs logged (the end-to-end tests and ``bench/faults/chaos.py``). Standard
library only: the runner starts once per task."""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import time
from pathlib import Path

RUNNER = str(Path(__file__).resolve())


def command() -> str:
    """The ``--command`` template of the overlap-proving runner (goal: ``SECONDS [EXIT]``)."""
    return f"{sys.executable} {RUNNER} {{device_id}} {{task_id}} {{goal}}"


class RunLog:
    """What the overlap runner logged: starts, ends and overlaps (see the module's docstring)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def env(self) -> dict[str, str]:
        return {"DQ_RUNLOG": str(self.folder)}

    def lines(self) -> list[list[str]]:
        path = self.folder / "runs.log"
        return [ln.split() for ln in path.read_text().splitlines()] if path.exists() else []

    def overlaps(self) -> list[str]:
        return [" ".join(x) for x in self.lines() if x[0] == "OVERLAP"]

    def starts(self, task: str | None = None) -> list[list[str]]:
        return [x for x in self.lines() if x[0] == "start" and (task is None or x[2] == task)]

    def ends(self, task: str | None = None) -> list[list[str]]:
        return [x for x in self.lines() if x[0] == "end" and (task is None or x[2] == task)]

    def intervals_overlap(self) -> list[str]:
        """Completed runs (start and end logged) of one device or one task that overlap in
        time (a second check beside the locks)."""
        runs: dict[str, list[tuple[float, float, str]]] = {}
        begun = {x[3]: (x[1], x[2], float(x[4])) for x in self.starts()}
        for x in self.ends():
            if x[3] in begun:
                dev, task, t0 = begun[x[3]]
                for key in ("d:" + dev, "t:" + task):
                    runs.setdefault(key, []).append((t0, float(x[4]), x[3]))
        bad = []
        for key, spans in runs.items():
            spans.sort()
            for (a0, a1, pa), (b0, b1, pb) in zip(spans, spans[1:], strict=False):
                if b0 < a1:
                    bad.append(f"{key}: {pa} [{a0:.3f},{a1:.3f}] and {pb} [{b0:.3f},{b1:.3f}]")
        return bad


def note(line: str) -> None:
    fd = os.open(os.path.join(os.environ["DQ_RUNLOG"], "runs.log"),
                 os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)  # fmt: skip
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def hold(name: str, who: str) -> object:
    f = open(os.path.join(os.environ["DQ_RUNLOG"], name + ".lock"), "a")  # noqa: SIM115
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        note(f"OVERLAP {name} {who} {time.time():.6f}")
    return f


def main() -> int:
    device, task, spec = sys.argv[1], sys.argv[2], sys.argv[3].split()
    seconds = float(spec[0])
    code = int(spec[1]) if len(spec) > 1 else 0
    who = f"{device}/{task}/{os.getpid()}"
    locks = [hold("device-" + device, who), hold("task-" + task, who)]
    note(f"start {device} {task} {os.getpid()} {time.time():.6f}")

    def stopped(signum: int, _frame: object) -> None:  # (SIGTERM: a cancel or a preemption)
        note(f"end {device} {task} {os.getpid()} {time.time():.6f}")
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stopped)
    time.sleep(seconds)
    note(f"end {device} {task} {os.getpid()} {time.time():.6f}")
    del locks
    return code


if __name__ == "__main__":
    sys.exit(main())
