"""Task progress: a runner says how far it is (``task.progress`` in a Python runner, a
``::deviceq progress`` line on a command's stdout, or its ``$DEVICEQ_PROGRESS_FILE``); the host
records it for the current lease only (``lua/progress.lua``), at most once a second per run
with the last value never lost; ``task show``, ``task list``, the HTTP API and the dashboard
show it; a bad value is refused and changes nothing; a new attempt starts without any. End to
end on real daemons (``host run`` on Redis and through the HTTP API, ``scheduler run``,
``dashboard``) and real Redis."""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from test_api_host import ApiServer, api_host, http
from test_live_logs import claimed

from deviceq import TaskStatus
from deviceq.api.tokens import TokenStore
from deviceq.core.errors import InvalidInput
from deviceq.core.script_args import PROGRESS
from deviceq.host.progress import (
    EVERY,
    TEXT_BYTES,
    TEXT_CHARS,
    ProgressStreamer,
    ProgressUpdate,
    clean_text,
    parse_line,
)
from deviceq.host.runners import Outcome, Task
from deviceq.ops.verify import verify
from harness import Deployment, deviceq, free_port, wait_for
from runner_kinds import KINDS, host_flags


def show(d: Deployment, tid: str) -> dict[str, Any]:
    res = deviceq(d.url, d.pool, "task", "show", tid, "--json")
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout))


def progress_of(d: Deployment, tid: str) -> dict[str, Any] | None:
    return show(d, tid)["progress"]


def wait_progress(d: Deployment, tid: str, fraction: float, timeout: float = 60) -> dict[str, Any]:
    def seen() -> dict[str, Any] | None:
        p = progress_of(d, tid)
        return p if p is not None and p["fraction"] == fraction else None

    return dict(wait_for(seen, timeout, f"progress {fraction} of {tid}"))


def gate(path: Path) -> str:
    return f"while [ ! -e {path} ]; do sleep 0.05; done"


# -- a Python runner (run by the host daemons below, in a process of its own) ----------------
def progress_runner(task: Task) -> Outcome:
    """Refuses to record bad values (each raises ValueError), says 25% with a text that must
    be cleaned, waits for the file named by its goal, then says many values at once and ends
    at once: the last one (100% "finished") must be what stays."""
    for bad in (1.5, -0.1, float("nan"), float("inf"), "abc", None, True):
        try:
            task.progress(bad, "bad")  # type: ignore[arg-type]
        except ValueError:
            continue
        return Outcome.failure(f"task.progress accepted {bad!r}")
    task.progress(0.25, "quarter\x07 done\n" + "x" * 500)
    release = Path(task.goal)
    while not release.exists():
        if task.cancel.wait(0.05):
            return Outcome.failure("cancelled")
    for i in range(50):
        task.progress(0.5 + i / 100, f"burst {i}")
    task.progress(1, "finished")
    return Outcome.success("ok")


async def progress_runner_async(task: Task) -> Outcome:
    """`progress_runner` as an async runner: the same values, its wait awaited."""
    for bad in (1.5, -0.1, float("nan"), float("inf"), "abc", None, True):
        try:
            task.progress(bad, "bad")  # type: ignore[arg-type]
        except ValueError:
            continue
        return Outcome.failure(f"task.progress accepted {bad!r}")
    task.progress(0.25, "quarter\x07 done\n" + "x" * 500)
    release = Path(task.goal)
    while not release.exists():
        if await task.wait_cancel(0.05):
            return Outcome.failure("cancelled")
    for i in range(50):
        task.progress(0.5 + i / 100, f"burst {i}")
    task.progress(1, "finished")
    return Outcome.success("ok")


# -- unit: parsing and bounds ------------------------------------------------------------------
def test_lines_and_values_are_checked_and_cleaned() -> None:
    assert parse_line("::deviceq progress 0.4 step 3/7\n") == (0.4, "step 3/7")
    assert parse_line("::deviceq progress 1") == (1.0, "")
    assert parse_line("::deviceq progress   0   starting  ") == (0.0, "starting")
    assert parse_line("progress 0.4") is None and parse_line("::deviceq progressive 1") is None
    for bad in ("::deviceq progress 1.5 x", "::deviceq progress -1", "::deviceq progress nan",
                "::deviceq progress abc", "::deviceq progress"):  # fmt: skip
        with pytest.raises(ValueError, match="progress must be a number from 0 to 1"):
            parse_line(bad)
    assert clean_text("a\tb\x1b[31mc\u2028d") == "ab[31mcd"
    assert len(clean_text("é" * 1000)) == TEXT_CHARS
    assert len(clean_text("€" * 1000).encode()) <= TEXT_BYTES
    t = Task(goal="g", task_id="t1", device_id="d1", driver_type="x")
    t.progress(0.5, "no daemon: a no-op")
    with pytest.raises(ValueError, match=r"not 2"):
        t.progress(2)


def test_progress_script_limit_mirrors_the_python_cap() -> None:
    """progress.lua's byte limit is the Python cap's worst case (4 bytes a character)."""
    from deviceq.core.scripts import lua_dir

    text = (lua_dir() / "progress.lua").read_text()
    assert f"#text > {TEXT_BYTES}" in text and f"at most {TEXT_BYTES} bytes" in text


# -- the script: only the lease holder writes; bad values change nothing -----------------------
def test_only_the_lease_holder_records_and_bad_values_change_nothing(real_fleet: Any) -> None:
    f = real_fleet
    h1, h2, tid, lease = claimed(f)
    key = f.admin.keys.task(tid)
    assert h1.progress([ProgressUpdate(tid, lease, 0.3, "a third")]) == ["ok"]
    h = f.r.hgetall(key)
    assert (h["progress"], h["progress_text"], h["progress_lease"]) == ("0.3", "a third", lease)
    sec, usec = f.r.time()
    assert abs(int(h["progress_at"]) - (sec * 1000 + usec // 1000)) < 5000  # Redis's clock
    before = f.r.hgetall(key)
    # another host: refused, nothing written
    assert h2.progress([ProgressUpdate(tid, lease, 0.9, "forged")]) == ["rejected:not_owner"]
    # a lease that is not the task's: refused
    assert h1.progress([ProgressUpdate(tid, "l" + "0" * 15, 0.9)]) == ["rejected:superseded"]
    # out of range, NaN, not a number: refused before anything is sent (Python) ...
    for bad in (1.01, -0.5, math.nan, "x"):
        with pytest.raises(ValueError, match="progress must be a number from 0 to 1"):
            h1.progress([ProgressUpdate(tid, lease, bad)])  # type: ignore[arg-type]
    # ... and by the script itself, whoever calls it (one INVALID line, nothing written)
    for frac, text in (("1.5", ""), ("-0", "x\n"), ("nan", ""), ("0.5", "é" * 401)):
        with pytest.raises(InvalidInput, match="progress"):
            h1._run("progress", [*h1._auth(), "1", PROGRESS.pack([{"task_id": tid,
                     "lease_id": lease, "fraction": frac, "text": text}])])  # fmt: skip
    assert f.r.hgetall(key) == before
    # after the report nothing more is accepted; the finished task keeps its last progress
    assert h1.report(tid, lease, "done") == "ok:done"
    assert h1.progress([ProgressUpdate(tid, lease, 1.0)]) == ["rejected:ended"]
    assert f.client.get(tid).progress == {"fraction": 0.3, "text": "a third",
                                           "at": int(h["progress_at"])}  # fmt: skip


class CountingSink:
    """The real host client, its calls counted (what the streamer sent, and when)."""

    def __init__(self, host: Any) -> None:
        self.host = host
        self.calls: list[tuple[float, list[ProgressUpdate]]] = []

    def progress(self, updates: Sequence[ProgressUpdate]) -> list[str]:
        self.calls.append((time.monotonic(), list(updates)))
        return list(self.host.progress(updates))


def test_a_chatty_runner_is_written_at_most_once_a_second_and_its_last_value_stays(
    real_fleet: Any,
) -> None:
    f = real_fleet
    h1, _, tid, lease = claimed(f)
    sink = CountingSink(h1)
    streamer = ProgressStreamer(sink, tick=0.05)
    run = streamer.open(tid, lease)
    write = streamer.writer(run)
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < 2.6:  # ~ thousands of values in 2.6 s
        write((n % 1000) / 1000, f"value {n}")
        n += 1
    write(0.999, "the last")
    streamer.close(run)
    streamer.stop()
    times = [t for t, _ in sink.calls]
    sent = [u for _, us in sink.calls for u in us]
    assert n > 1000
    # the first at once, then at most one a second while it runs, plus the final one
    shown = [(round(t - start, 2), u.text) for t, u in zip(times, sent, strict=True)]
    assert 3 <= len(sent) <= 5, shown
    gaps = [b - a for a, b in zip(times[:-2], times[1:-1], strict=True)]
    assert all(g >= EVERY * 0.99 for g in gaps), gaps
    assert sent[-1].text == "the last"
    p = f.client.get(tid).progress
    assert p is not None and (p["fraction"], p["text"]) == (0.999, "the last")


# -- end to end --------------------------------------------------------------------------------
@pytest.fixture
def api_server(deploy: Deployment) -> Iterator[ApiServer]:
    server = ApiServer(deploy.url, deploy.pool, deploy.tmp / "api.log")
    server.start()
    try:
        yield server
    finally:
        server.kill()


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=20) as resp:  # noqa: S310 - local test server
        return str(resp.read().decode())


@pytest.mark.parametrize("kind", KINDS)
def test_a_command_and_a_python_runner_show_progress_everywhere(
    deploy: Deployment, api_server: ApiServer, kind: str
) -> None:
    d, api = deploy, api_server
    d.configure(lease_ttl=5.0, claim_ttl=5.0, host_timeout=5.0)
    d.scheduler()
    d.command_host("h1", "d1:cmd", extra=host_flags(kind))  # on Redis
    runner = "test_progress:progress_runner" + ("_async" if kind == "async" else "")
    api_host(d, api, "h2", "d2:py", extra=("--goal-runner", runner))
    port = free_port()
    d.spawn("dash", "dashboard", "--port", str(port))  # read-only: no login
    dash = f"http://127.0.0.1:{port}"
    wait_for(lambda: d.alive("h1") and d.alive("h2"), 30, "hosts alive")
    one, two, three = d.tmp / "one", d.tmp / "two", d.tmp / "py-release"
    cmd = d.client.submit(
        "echo '::deviceq progress 0.4 step 3/7'; echo '::deviceq progress 1.7 too far'; "
        "echo '::deviceq progress abc'; "
        f"{gate(one)}; echo '0.7 from the file' > \"$DEVICEQ_PROGRESS_FILE\"; {gate(two)}",
        driver_type="cmd",
    )
    py = d.client.submit(str(three), driver_type="py")

    # the command's line: in task show --json (bad lines ignored: 0.4 stays)
    p = wait_progress(d, cmd, 0.4)
    assert p["text"] == "step 3/7" and p["at"] > 0
    assert show(d, cmd)["status"] == "dispatched"
    wait_for(lambda: "progress ignored" in d.log("h1"), 20, "the warning")
    assert d.log("h1").count("progress ignored") == 1  # two bad lines, one warning
    assert "progress must be a number from 0 to 1" in d.log("h1")
    # the Python runner's (through the HTTP API): cleaned and cut
    p = wait_progress(d, py, 0.25)
    assert p["text"] == "quarter done" + "x" * (TEXT_CHARS - len("quarter done"))

    # task show (text) and task list
    text = deviceq(d.url, d.pool, "task", "show", cmd).stdout
    assert "40% step 3/7 (at " in text
    listed = deviceq(d.url, d.pool, "task", "list").stdout
    assert "progress" in listed.splitlines()[1] or "progress" in listed
    row = next(line for line in listed.splitlines() if cmd in line)
    assert "40% step 3/7" in row

    # the HTTP API's task JSON
    token = TokenStore(d.r, d.client.keys).add("tester", "producer")
    status, doc = http(api.url, "GET", f"/tasks/{cmd}", token)
    assert status == 200 and doc["progress"]["fraction"] == 0.4
    assert doc["progress"]["text"] == "step 3/7"

    # the dashboard's task page and the fleet page of its host
    page = get(f"{dash}/tasks/{cmd}")
    assert 'id="progress"' in page and "40%" in page and "step 3/7" in page
    fleet = get(f"{dash}/fleet?host=h1")
    assert "40%" in fleet and "step 3/7" in fleet
    assert "25%" in get(f"{dash}/fleet?host=h2")

    # the progress file's last line replaces the line's value
    one.touch()
    assert wait_progress(d, cmd, 0.7)["text"] == "from the file"
    two.touch()
    three.touch()
    t_cmd, t_py = d.wait_all([cmd, py], timeout=60)
    assert t_cmd.status == TaskStatus.done and t_py.status == TaskStatus.done, t_py.error
    # finished tasks keep their last attempt's last value
    assert (t_cmd.progress or {})["fraction"] == 0.7
    assert t_py.progress is not None and (t_py.progress["fraction"], t_py.progress["text"]) == (
        1.0,
        "finished",
    )
    assert verify(d.admin).ok


@pytest.mark.parametrize("kind", KINDS)
def test_a_retry_starts_without_the_progress_of_the_attempt_before(
    deploy: Deployment, kind: str
) -> None:
    d = deploy
    d.scheduler()
    d.command_host("h1", "d1:x", extra=host_flags(kind))
    wait_for(lambda: d.alive("h1"), 30, "host alive")
    fail, release = d.tmp / "fail", d.tmp / "release"
    tid = d.client.submit(
        'if [ "$DEVICEQ_ATTEMPT" = 1 ]; then echo "::deviceq progress 0.5 half"; '
        f"{gate(fail)}; exit 1; fi; {gate(release)}",
        driver_type="x",
        max_attempts=2,
        retry_on="runner_failed",
    )
    wait_progress(d, tid, 0.5)
    fail.touch()
    wait_for(
        lambda: (lambda t: t["attempt"] == 2 and t["status"] == "dispatched")(show(d, tid)),
        60,
        "the second attempt running",
    )
    assert progress_of(d, tid) is None  # the second attempt said nothing yet
    release.touch()
    t = d.client.wait(tid, timeout=60)
    assert t.status == TaskStatus.done and t.progress is None


@pytest.mark.parametrize("kind", KINDS)
def test_progress_from_a_thread_runner_under_the_rate_limit(deploy: Deployment, kind: str) -> None:
    """A Python runner in the daemon's own process (``--isolation thread``; an async one on
    its event loop): its burst of values ends with the last one recorded."""
    d = deploy
    d.scheduler()
    runner = "test_progress:progress_runner" + ("_async" if kind == "async" else "")
    d.host("h1", "d1:x", extra=("--goal-runner", runner, "--isolation", "thread"))
    release = d.tmp / "go"
    tid = d.client.submit(str(release), driver_type="x")
    wait_progress(d, tid, 0.25)
    threading.Timer(0.1, release.touch).start()
    t = d.client.wait(tid, timeout=60)
    assert t.status == TaskStatus.done, t.error
    assert t.progress is not None and (t.progress["fraction"], t.progress["text"]) == (
        1.0,
        "finished",
    )
