"""The programs some tests drive that are not Python packages: Debian's ``prometheus``
(``promtool`` and ``prometheus``: tests/ops/test_alerts.py) and ``chromium`` with
``chromium-driver`` (the dashboard's browser tests).

The first test that needs one asks for it (`prometheus`, `browser`); when a program is missing,
apt-get exists and the run is root, the package is installed then, once for the machine: under
a file lock, so the pytest-xdist workers that need it at the same moment install it once (the
others wait, then find it). Otherwise the test fails with a line saying how to install it: the
suite never skips them."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

LOCK = Path(tempfile.gettempdir()) / "deviceq-tests-apt.lock"
APT_TIMEOUT = 1200  # seconds an apt-get may take (a download of chromium on a slow link)


def find(*names: str) -> str | None:
    """The first of ``names`` (an absolute path, or a command on PATH) that exists."""
    for n in names:
        path = n if n.startswith("/") else shutil.which(n)
        if path and Path(path).exists():
            return path
    return None


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    with LOCK.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _say(text: str) -> None:
    """A line on the terminal, past pytest's capture (``sys.__stderr__``), and a warning in
    the run's summary (a pytest-xdist worker's terminal is not the run's)."""
    print(f"deviceq tests: {text}", file=sys.__stderr__, flush=True)
    warnings.warn(f"deviceq tests: {text}", stacklevel=2)


def provide(programs: dict[str, tuple[str, ...]], package: str, why: str) -> dict[str, str]:
    """The path of each program (name -> the names or paths to look for); the missing ones are
    installed with ``apt-get install PACKAGE`` when that is possible (root, apt-get present),
    else the calling test fails with how to install them."""
    found = {name: find(*names) for name, names in programs.items()}
    missing = sorted(n for n, p in found.items() if p is None)
    if not missing:
        return {n: str(p) for n, p in found.items()}
    how = f"apt-get install {package}"
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        reason = "no apt-get on this machine" if apt is None else "not running as root"
        pytest.fail(f"{', '.join(missing)} not found ({why}) and {reason}: install Debian's "
                    f"{package} package ({how}, as root) and run the tests again",
                    pytrace=False)  # fmt: skip
    with _machine_lock():
        found = {name: find(*names) for name, names in programs.items()}
        if any(p is None for p in found.values()):
            _say(f"{', '.join(missing)} not found ({why}): installing Debian's {package} "
                 f"package ({how}; once for the machine)")  # fmt: skip
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            wait = ["-o", "DPkg::Lock::Timeout=600"]  # (another apt-get on the machine)
            for cmd in (
                [apt, *wait, "update", "-qq"],
                [apt, *wait, "install", "-y", "-qq", package],
            ):
                try:
                    done = subprocess.run(cmd, capture_output=True, text=True, env=env,
                                          timeout=APT_TIMEOUT)  # fmt: skip
                except subprocess.TimeoutExpired:
                    pytest.fail(f"{' '.join(cmd)} took over {APT_TIMEOUT} s", pytrace=False)
                if done.returncode != 0:
                    tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
                    pytest.fail(f"{' '.join(cmd)} failed (exit {done.returncode}): "
                                + " / ".join(tail), pytrace=False)  # fmt: skip
            found = {name: find(*names) for name, names in programs.items()}
            _say(f"{package} installed")
    still = sorted(n for n, p in found.items() if p is None)
    if still:
        pytest.fail(f"{', '.join(still)} still not found after {how}", pytrace=False)
    return {n: str(p) for n, p in found.items()}


@functools.cache
def _prometheus() -> dict[str, str]:
    why = "the alert rules are checked by promtool and evaluated by prometheus"
    return provide({"promtool": ("promtool",), "prometheus": ("prometheus",)}, "prometheus", why)


@functools.cache
def _browser() -> dict[str, str]:
    # chromium-driver depends on chromium: one package brings both
    return provide(
        {"chromium": ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"),
         "chromedriver": ("/usr/bin/chromedriver", "chromedriver")},
        "chromium-driver", "the dashboard is tested in a headless Chromium",
    )  # fmt: skip


def prometheus() -> dict[str, str]:
    """``{"promtool": PATH, "prometheus": PATH}``, installed first if need be."""
    return _prometheus()


def browser() -> dict[str, str]:
    """``{"chromium": PATH, "chromedriver": PATH}``, installed first if need be."""
    return _browser()
