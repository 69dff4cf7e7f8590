"""Who runs a host daemon session, and whether that process is still alive.

A session's owner is ``MACHINE:BOOT:PID:START`` (the machine id, the boot id, the daemon's pid
and its start time in clock ticks since boot). A daemon starting for a host id reads the
current session's owner: on the same machine it can tell for certain whether that daemon is
gone (a different boot, or no process with that pid and start time), so a restart after a crash
or SIGKILL takes over at once and hands the dead daemon's attempts back. Anywhere else only the
host's heartbeat age tells, so a live-looking session is refused unless ``--takeover``."""

from __future__ import annotations

import os
import re
import secrets
import socket
from pathlib import Path

_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def _read(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def machine_id() -> str:
    """This machine: /etc/machine-id, else the host name (id characters only)."""
    raw = _read("/etc/machine-id") or _read("/var/lib/dbus/machine-id") or socket.gethostname()
    return _SAFE.sub("-", raw)[:64] or "unknown"


def boot_id() -> str:
    return _SAFE.sub("-", _read("/proc/sys/kernel/random/boot_id"))[:64] or "unknown"


def start_time(pid: int) -> str:
    """A process's start time (clock ticks since boot, /proc/PID/stat field 22), '' if none or
    if it has exited and is only waiting to be reaped (a zombie: state Z or X, as a SIGKILLed
    daemon is until its parent waits for it)."""
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return ""
    try:
        fields = stat.rsplit(")", 1)[1].split()
        return "" if fields[0] in ("Z", "X") else fields[19]
    except IndexError:
        return ""


def owner_id(pid: int | None = None) -> str:
    """The owner string of a daemon process (this one by default)."""
    pid = os.getpid() if pid is None else pid
    return f"{machine_id()}:{boot_id()}:{pid}:{start_time(pid)}"


def owner_dead(owner: str) -> bool:
    """True only when ``owner``'s process is certainly gone: it ran on this machine and either
    the machine rebooted since or no process with that pid and start time exists. False when
    it is alive or runs elsewhere (unknown)."""
    parts = owner.split(":")
    if len(parts) != 4 or not parts[2].isdigit():
        return False
    machine, boot, pid, started = parts
    if machine != machine_id() or machine == "unknown":
        return False
    if boot != boot_id():
        return True
    return start_time(int(pid)) != started or not started


def new_session_id() -> str:
    return "s" + secrets.token_hex(8)
