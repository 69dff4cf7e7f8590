"""The documentation's console sessions against the tool (the pages of the docs site under
docs/, and README.md).

Every ``$ deviceq ...`` line of every ```console block (also those inside ``$(...)`` and
pipes) is parsed by the CLI: a command, option or value the CLI does not know fails here,
unless the page shows that very line failing (its output starts with ``deviceq: error``).

Sessions marked ``<!-- replay -->`` on the line before their fence are run as written, line
by line, in one shell against a live pool (a fresh pool on the test Redis; the session's own
``export DEVICEQ_POOL=...`` is pointed at it), background daemons (``... &``) included. Each
command's output must match the page's once what differs between runs is set aside: task
ids (the page's ids stand for the ones this run made: its later commands get them),
webhook ids, times (also in ms since the epoch), durations, the leader's name, the Redis
version, the widths of table rules; a ``...`` line in a page stands for any lines.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click
import pytest

from cli_check import check_cli, deviceq_invocations
from docs_pages import README, pages, rel

ROOT = Path(__file__).resolve().parents[2]
REPLAYED = 9  # the sessions replayed: a page's session lost in an edit fails the count
FENCE = re.compile(r"^```console[ \t]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
TASK_ID = re.compile(r"\b[0-9a-f]{16}\b")
MARK = "@@deviceq-step-done@@"
BACKGROUND = re.compile(r"^(.*[^&])&[ \t]*(#[^'\"]*)?$")  # `cmd &`, maybe `cmd &  # comment`


@dataclass
class Step:
    line: int  # in its page, 1-based
    command: str
    output: list[str] = field(default_factory=list)


@dataclass
class Session:
    line: int
    replay: bool
    steps: list[Step]
    page: str = ""  # the page's path in the repository

    def at(self, line: int) -> str:
        return f"{self.page}:{line}"


def sessions(text: str) -> list[Session]:
    """Every ```console block of ``text``: its commands (``$ `` lines, a trailing ``\\``
    joining the next) with the output shown under each."""
    out = []
    for m in FENCE.finditer(text):
        first = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        steps: list[Step] = []
        lines = m.group(1).splitlines()
        i = 0
        while i < len(lines):
            ln = lines[i]
            if ln.startswith("$ "):
                cmd, at = ln[2:], first + 1 + i
                while cmd.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    cmd = cmd[:-1] + " " + lines[i].strip()
                steps.append(Step(at, cmd))
            elif steps:
                steps[-1].output.append(ln)
            i += 1
        out.append(Session(first, before.strip() == "<!-- replay -->", steps))
    return out


def all_sessions() -> list[Session]:
    """The sessions of every docs page and of README.md, each knowing its page."""
    out = []
    for page in [*pages(), README]:
        for session in sessions(page.read_text(encoding="utf-8")):
            session.page = rel(page)
            out.append(session)
    return out


def test_the_session_reader_joins_lines_and_finds_replays() -> None:
    text = (
        "x\n<!-- replay -->\n```console\n$ deviceq status \\\n    --json\n{}\n$ # note\n```\n"
        "```console\n$ deviceq nope\ndeviceq: error: No such command\n```\n"
    )
    a, b = sessions(text)
    assert a.replay and not b.replay and a.line == 3
    assert [(s.line, s.command, s.output) for s in a.steps] == [
        (4, "deviceq status  --json", ["{}"]),
        (7, "# note", []),
    ]
    assert b.steps[0].output == ["deviceq: error: No such command"]
    calls = deviceq_invocations("id=$(deviceq submit 'a b' --tag x) | deviceq task wait $id > f")
    assert calls == [["submit", "a b", "--tag", "x"], ["task", "wait", "0123456789abcdef"]]


def test_every_deviceq_command_in_the_readme_parses() -> None:
    checked, bad = 0, []
    for session in all_sessions():
        for step in session.steps:
            shows_error = bool(step.output) and step.output[0].startswith("deviceq: error")
            for args in deviceq_invocations(step.command):
                checked += 1
                try:
                    check_cli(args)
                except (click.UsageError, click.BadParameter) as e:
                    if "does not exist" in str(e):  # a file the session made: not here
                        continue
                    if not shows_error:
                        bad.append(f"{session.at(step.line)}: deviceq {' '.join(args)}: {e}")
    assert checked > 100, checked  # the pages' sessions are read at all
    assert not bad, "\n".join(bad)


# -- replaying a session -----------------------------------------------------------------------
class Shell:
    """One bash reading commands from a pipe, so a session's variables, exports and
    background jobs live on from line to line."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd = cwd
        self.proc = subprocess.Popen(
            ["bash", "--norc", "--noprofile"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.jobs = 0

    def run(self, command: str, timeout: float = 90) -> tuple[str, int]:
        """Run one line; a background one (``... &``) gets what it does not redirect itself
        in a log file."""
        background = BACKGROUND.match(command)
        if background:
            self.jobs += 1
            command = f"( {background.group(1)} ) > bg-{self.jobs}.log 2>&1 &"
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(f'{command}\necho "{MARK} $?"\n'.encode())
        self.proc.stdin.flush()
        buf, deadline = b"", time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while MARK.encode() not in buf:
            left = deadline - time.monotonic()
            assert left > 0, f"{command!r} still running after {timeout}s: {buf.decode()!r}"
            ready, _, _ = select.select([fd], [], [], left)
            if ready:
                chunk = os.read(fd, 65536)
                assert chunk, f"the shell ended during {command!r}: {buf.decode()!r}"
                buf += chunk
        text, _, rest = buf.decode().partition(MARK)
        return text, int(rest.split()[0])

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def normalized(line: str, ids: dict[str, str]) -> str:
    """``line`` without what differs between runs (ids are mapped through ``ids`` first)."""
    line = TASK_ID.sub(lambda m: ids.get(m.group(0), m.group(0)), line)
    line = re.sub(r"\bwh-[0-9a-f]{10}\b", "<webhook>", line)
    line = re.sub(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?Z?", "<time>", line)
    line = re.sub(r"\d{13}-\d+", "<event-id>", line)
    line = re.sub(r"\b1\d{12}\b", "<ms>", line)  # a time in ms since the epoch
    line = re.sub(r"\b\d+(\.\d+)?(ms|s|m|h)\b", "<dur>", line)
    line = re.sub(r"leader \S+ \(epoch \d+\)", "leader <name>", line)
    line = re.sub(r"^redis \d+\.\d+\.\d+ ", "redis <version> ", line)
    line = re.sub(r"\S*…", "…", line)  # a cell cut to the table's width
    line = re.sub(r"[─━]+", "─", line)
    return re.sub(r"\s+", " ", line).strip()


def learn_ids(expected: list[str], actual: list[str], ids: dict[str, str]) -> None:
    """Map the page's task ids to this run's: in order when both show as many, else by
    their places in the same lines."""
    want = [i for x in expected for i in TASK_ID.findall(x)]
    got = [i for x in actual for i in TASK_ID.findall(x)]
    if len(want) == len(got):
        for w, g in zip(want, got, strict=True):
            ids.setdefault(w, g)
        return
    for e, a in zip(expected, actual, strict=False):
        want, got = TASK_ID.findall(e), TASK_ID.findall(a)
        if len(want) == len(got):
            for w, g in zip(want, got, strict=True):
                ids.setdefault(w, g)


def matches(expected: list[str], actual: list[str], ids: dict[str, str]) -> str | None:
    """None when ``actual`` shows what ``expected`` (the page) shows, else what differs."""
    exp = [normalized(x, ids) for x in expected if x.strip()]
    act = [normalized(x, ids) for x in actual if x.strip()]
    i = 0
    for n, want in enumerate(exp):
        if want == "...":
            if n + 1 == len(exp):
                return None
            nxt = exp[n + 1]
            while i < len(act) and act[i] != nxt:
                i += 1
            continue
        if i >= len(act) or act[i] != want:
            got = act[i] if i < len(act) else "<nothing>"
            return f"expected {want!r}, got {got!r}"
        i += 1
    return None if i == len(act) else f"more output than the page shows: {act[i]!r}"


def replayed() -> Iterator[Session]:
    for s in all_sessions():
        if s.replay:
            yield s


def test_the_replayed_sessions_are_all_found_in_the_docs_pages() -> None:
    found = list(replayed())
    assert len(found) == REPLAYED, [s.at(s.line) for s in found]
    assert all(s.page.startswith("docs/") for s in found), [s.at(s.line) for s in found]


@pytest.mark.parametrize("session", list(replayed()), ids=lambda s: s.at(s.line))
def test_a_readme_session_runs_as_written(
    session: Session, redis_url: str, pool: str, tmp_path: Path
) -> None:
    bindir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
        "DEVICEQ_REDIS_URL": redis_url,
        "DEVICEQ_POOL": pool,
        "COLUMNS": "200",
        "NO_COLOR": "1",
    }
    env.pop("DEVICEQ_CONFIG", None)
    shell = Shell(tmp_path, env)
    ids: dict[str, str] = {}
    shown_pool = pool  # the pool name the session exports: this run's pool stands for it
    try:
        for step in session.steps:
            exported = re.search(r"export DEVICEQ_POOL=(\S+)", step.command)
            if exported:
                shown_pool = exported.group(1)
            cmd = re.sub(r"export DEVICEQ_POOL=\S+", f"export DEVICEQ_POOL={pool}", step.command)
            cmd = TASK_ID.sub(lambda m: ids.get(m.group(0), m.group(0)), cmd)
            out, rc = shell.run(cmd)
            lines = [re.sub(rf"\b{pool}\b", shown_pool, x) for x in out.splitlines()]
            learn_ids(step.output, lines, ids)
            shows_error = any(x.startswith(("deviceq: error", "error:")) for x in step.output)
            assert rc == 0 or shows_error or "exit " in step.command, (
                f"{session.at(step.line)}: `{step.command}` exited {rc}:\n{out}"
            )
            diff = matches(step.output, lines, ids)
            assert diff is None, f"{session.at(step.line)}: `{step.command}`: {diff}\n{out}"
    finally:
        shell.close()
