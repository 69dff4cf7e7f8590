"""A test runner command that proves, physically, that no device and no task ever ran two
things at once: it takes an exclusive, non-blocking ``flock`` on a per-device and a per-task
lock file (the kernel drops it when the process dies, SIGKILL included) and logs each run's
start and end. A second holder at the same moment finds the lock taken and logs ``OVERLAP``.

Usage (as a ``--command`` template): ``python overlap_runner.py {device_id} {task_id} {goal}``
with the goal ``SECONDS [EXIT_CODE]``; the log directory is ``$DQ_RUNLOG``."""

from __future__ import annotations

import fcntl
import os
import sys
import time


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
    time.sleep(seconds)
    note(f"end {device} {task} {os.getpid()} {time.time():.6f}")
    del locks
    return code


if __name__ == "__main__":
    sys.exit(main())
