"""The lab session of docs/how-to/suites.md replayed against real daemons: a scheduler and a
host discovering three phones through the page's fake ``adb``, whose runs are the page's
``run-tests`` (one flaky test, one phone that crashes once). Every command of the page's
session runs in a shell as written (its daemons in the background); each output must show
what the page shows once ids, durations and which phone ran what are set aside."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import redis

from deviceq import PoolAdmin, verify
from docs_pages import section
from harness import SRC_DIR, TESTS_PATH

PAGE_LAB = "/tmp/suite-lab"
LAB_FILES = Path(__file__).resolve().parents[2] / "docs" / "examples" / "suite-lab"
ID = re.compile(r"\b[0-9a-f]{16}\b")
FENCE = re.compile(r"^```console[ \t]*\n(.*?)^```", re.MULTILINE | re.DOTALL)

pytestmark = pytest.mark.slow


def steps(block: str) -> list[tuple[str, list[str]]]:
    """The session's commands, each with the output the page shows under it."""
    out: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            out.append((line[2:], []))
        elif out:
            out[-1][1].append(line)
    return out


def normalized(line: str, lab: str) -> str:
    """A line with what differs between runs set aside: ids, durations, which phone."""
    line = line.replace(lab, PAGE_LAB)
    line = ID.sub("<id>", line)
    line = re.sub(r"\b\d+(m\d+)?s\b|\b\d+h\d+m\b", "<dur>", line)
    line = re.sub(r"\bpixel-\d\b", "pixel-N", line)
    line = re.sub(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(\.\d+)?Z?", "<time>", line)
    return re.sub(r"\s+", " ", line).strip()


def shown(expected: list[str], actual: list[str], lab: str) -> str | None:
    """None when ``actual`` shows the page's ``expected`` lines (in any order: stderr and
    stdout interleave; a ``...`` line stands for any further lines), else why not."""
    want = [normalized(x, lab) for x in expected if x.strip() != "..."]
    got = [normalized(x, lab) for x in actual]
    left = list(got)
    for w in want:
        if w not in left:
            return f"missing line {w!r}"
        left.remove(w)
    if left and not any(x.strip() == "..." for x in expected):
        return f"more lines than the page shows: {left[:5]!r}"
    return None


def test_the_suite_lab_session_of_the_docs_replays(redis_server: object, tmp_path: Path,
                                                   pool: str) -> None:  # fmt: skip
    _, text = section("A lab session")
    (block,) = FENCE.findall(text)
    lab = tmp_path / "lab"
    (lab / "bin").mkdir(parents=True)
    shutil.copy(LAB_FILES / "adb", lab / "bin" / "adb")
    shutil.copy(LAB_FILES / "run-tests", lab / "run-tests")
    mark = f"suite-lab-{pool}"
    env = {
        **os.environ,
        "DEVICEQ_REDIS_URL": redis_server.url,  # type: ignore[attr-defined]
        "DEVICEQ_POOL": pool,
        "LAB": str(lab),
        "PATH": f"{lab / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join((TESTS_PATH, SRC_DIR)),
        "DQTEST_MARK": mark,
        "COLUMNS": "200",
    }
    ids: dict[str, str] = {}
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        for command, expected in steps(block):
            if command.startswith("export "):
                assert command == f"export LAB={PAGE_LAB} PATH={PAGE_LAB}/bin:$PATH"
                continue
            for page_id, real in ids.items():
                command = command.replace(page_id, real)
            if command.endswith("&"):
                log = open(lab / f"daemon{len(daemons)}.log", "ab")  # noqa: SIM115
                daemons.append(subprocess.Popen(
                    ["sh", "-c", "exec " + command[:-1]], cwd=lab, env=env, stdout=log,
                    stderr=log, stdin=subprocess.DEVNULL, start_new_session=True,
                ))  # fmt: skip
                log.close()
                continue
            done = subprocess.run(["sh", "-c", command], cwd=lab, env=env, text=True,
                                  capture_output=True, timeout=180)  # fmt: skip
            actual = (done.stdout + done.stderr).splitlines()
            print("$", command, "\n" + "\n".join(actual))
            fails = bool(expected) and expected[0].startswith("deviceq: error")
            assert (done.returncode != 0) == fails, (command, done.returncode, actual)
            why = shown(expected, actual, str(lab))
            assert why is None, f"$ {command}\n{why}\n--- got:\n" + "\n".join(actual)
            page_ids = [x for x in expected if ID.fullmatch(x.strip())]
            real_ids = [x for x in actual if ID.fullmatch(x.strip())]
            for page_id, real in zip(page_ids, real_ids, strict=False):
                ids[page_id.strip()] = real.strip()
        admin = PoolAdmin(redis.Redis.from_url(env["DEVICEQ_REDIS_URL"], decode_responses=True),
                          pool)  # fmt: skip
        assert verify(admin).ok  # the pool's invariants hold after it all
    finally:
        for p in daemons:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in daemons:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
