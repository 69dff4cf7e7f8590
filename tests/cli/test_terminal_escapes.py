"""What a run printed cannot drive the terminal of whoever reads it: ``deviceq task logs``
(``--follow`` too, from Redis and through ``--api-url``) and ``task show`` write terminal
control sequences (OSC title and OSC 52 clipboard, DCS, CSI, ``\\r`` + erase line) as
visible escapes, and as they are with ``--raw``. Checked in a real pseudo-terminal: the real
``deviceq`` command on a real pty, a real run's output on real daemons and Redis."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from test_api_server import start_api

from deviceq import TaskStatus
from deviceq.api.tokens import TokenStore
from harness import Deployment

EXE = str(Path(sys.executable).parent / "deviceq")

# what the run prints: a title (OSC 0), a clipboard write (OSC 52), a DCS string, colours and a
# cursor move (CSI), a line rewritten (CR, erase line), a screen clear on stderr
GOAL = (
    r"printf 'title\033]0;pwned\007 clip\033]52;c;cHduZWQ=\007 dcs\033P1$r0m\033\\ "
    r"red\033[31mRED\033[0m\rover\033[K done\n'; printf 'err\033[2J\n' >&2"
)
CONTROL = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]")  # what reaches the terminal: none of these


def on_a_terminal(*args: str) -> tuple[int, bytes]:
    """Run ``deviceq ARGS`` with a pseudo-terminal as its stdin, stdout and stderr; its exit
    status and every byte it wrote there (the terminal's line discipline turns ``\\n`` into
    ``\\r\\n``: those are taken back)."""
    master, slave = os.openpty()
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen([EXE, *args], stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True, env=env)  # fmt: skip
    os.close(slave)
    out = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the last writer closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return proc.wait(30), out.replace(b"\r\n", b"\n")


def test_a_runs_escape_sequences_are_shown_escaped_unless_raw(deploy: Deployment) -> None:
    d = deploy
    d.configure(retention=3600)
    d.scheduler()
    d.command_host("h1", "d1:x")
    tid = d.client.submit(GOAL, driver_type="x")
    assert d.client.wait(tid, timeout=60).status is TaskStatus.done
    token = TokenStore(d.r, d.client.keys).add("reader", "producer")
    (d.tmp / "api.token").write_text(token + "\n")
    url = start_api(d, "api", "--max-wait", "3")
    redis_opts = ("--redis-url", d.url, "--pool", d.pool)
    api_opts = ("--api-url", url, "--api-token-file", str(d.tmp / "api.token"))

    for via in ((), api_opts):
        for cmd in (("task", "logs", tid), ("task", "logs", tid, "--follow"),
                    ("task", "show", tid)):  # fmt: skip
            command = (*cmd, *via)
            what = (" ".join(cmd), "api" if via else "redis")
            rc, out = on_a_terminal(*redis_opts, *command)
            assert rc == 0, (what, out)
            assert not CONTROL.search(out), (what, out)  # no ESC, BEL, CR reaches the terminal
            shown = out.decode()
            assert "title\\e]0;pwned\\a clip\\e]52;c;cHduZWQ=\\a dcs\\eP1$r0m\\e\\ " in shown
            assert "red\\e[31mRED\\e[0m\\rover\\e[K done" in shown, (what, shown)
            if command[1] == "logs":
                assert "[stderr] err\\e[2J\n" in shown, (what, shown)

            rc, out = on_a_terminal(*redis_opts, *command, "--raw")
            assert rc == 0, (what, out)
            assert b"title\x1b]0;pwned\x07 clip\x1b]52;c;cHduZWQ=\x07 dcs\x1bP1$r0m\x1b\\ " in out
            assert b"red\x1b[31mRED\x1b[0m\rover\x1b[K done" in out, (what, out)
            if command[1] == "logs":
                assert b"[stderr] err\x1b[2J\n" in out, (what, out)

    # printable text, UTF-8, tabs and newlines are left as they are
    tid2 = d.client.submit(r"printf 'caf\303\251 \342\202\254\tcol\nline 2\n'", driver_type="x")
    assert d.client.wait(tid2, timeout=60).status is TaskStatus.done
    rc, out = on_a_terminal(*redis_opts, "task", "logs", tid2)
    assert (rc, out.decode()) == (0, "café €\tcol\nline 2\n")
