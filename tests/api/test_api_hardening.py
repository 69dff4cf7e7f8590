"""Findings of a security review, each checked against the real private Redis (and
fakeredis where the fixture is parametrized):

1. ids, tags, driver types, pool and workflow names, idempotency keys match as a *whole*: a
   trailing newline is refused everywhere (Python API, host heartbeats, the CLI);
2. Python API traps: a bare ``str`` for tags, ``bytes`` for text, bad ``limit``/``offset``;
3. every bad Redis URL or connection problem is one line on stderr and exit 1, for every
   command (CliRunner and a real ``deviceq`` process);
4. ``register_strategy`` sets the strategy's ``name``;
5. the docs' Python examples ("Writing a strategy", "Python API", "Writing a runner") run
   verbatim, and ``newest_first`` really assigns the newest task;
6. the metrics endpoint listens on 127.0.0.1 unless ``--metrics-host`` says otherwise.

(Finding 7, docker-compose.yml, is checked by ``tests/ops/test_compose.py``.)"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

import docs_pages
from deviceq import Client, DeviceReport, HostClient, InvalidInput, PoolAdmin, TaskFilter
from deviceq.cli import main
from deviceq.core.errors import ConfigError
from deviceq.core.models import TaskSpec
from deviceq.core.redis_server import RedisServer
from deviceq.core.validation import validate_id, validate_tag, validate_tags
from deviceq.host.runners import Outcome, Task
from deviceq.scheduler import TaskScheduler
from deviceq.scheduler import strategies as S
from deviceq.scheduler.strategies import get_strategy, register_strategy
from deviceq.services.metrics import serve_metrics
from harness import free_port

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DEVICEQ = shutil.which("deviceq", path=str(BIN)) or "deviceq"


# -- helpers -------------------------------------------------------------------------------------
@contextlib.contextmanager
def writes_nothing(fleet: Any) -> Iterator[None]:
    before = snapshot(fleet)
    yield
    assert snapshot(fleet) == before, "refused input must not write anything"


def snapshot(fleet: Any) -> tuple[int, dict[str, Any]]:
    r = fleet.r
    readers: dict[str, Callable[[str], Any]] = {
        "hash": r.hgetall,
        "string": r.get,
        "list": lambda k: r.lrange(k, 0, -1),
        "set": lambda k: sorted(r.smembers(k)),
        "zset": lambda k: r.zrange(k, 0, -1, withscores=True),
        "stream": r.xrange,
    }
    keys = {}
    for key in r.scan_iter(match=f"dq:{{{fleet.pool}}}:*", count=1000):
        kind = r.type(key)
        keys[key] = readers[kind](key) if kind in readers else kind
    return int(r.dbsize()), keys


def refused(fleet: Any, fn: Callable[[], Any], exc: type[Exception] = InvalidInput) -> str:
    """``fn()`` raises ``exc`` with a one-line message and writes nothing; returns the message."""
    with writes_nothing(fleet), pytest.raises(exc) as info:
        fn()
    msg = str(info.value).strip()
    assert msg and "\n" not in msg, msg
    return msg


def cli(url: str, *args: str, pool: str = "default", **kw: Any) -> Result:
    return CliRunner().invoke(main, ["--redis-url", url, "--pool", pool, *args], **kw)


def one_line_error(res: Result | subprocess.CompletedProcess[str]) -> str:
    """The run failed with exactly one line on stderr (no traceback); returns that line."""
    code = res.exit_code if isinstance(res, Result) else res.returncode
    stderr = res.stderr
    assert code == 1, (code, stderr, getattr(res, "exception", None))
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


@pytest.fixture
def ready(fleet: Any) -> Any:
    """A pool with a host, an android device and a stored workflow."""
    fleet.h1 = fleet.add_host("h1", ("d1", "android", ("wifi",)))
    fleet.client.put_workflow({"name": "smoke", "steps": [{"goal": "go"}]})
    return fleet


# -- 1. whole-string validation ------------------------------------------------------------------
NEWLINE_TAILED = ["android\n", "a\n", "x" * 10 + "\n", "ok\r\n"]


@pytest.mark.parametrize("bad", NEWLINE_TAILED)
def test_validators_refuse_a_trailing_newline(bad: str) -> None:
    for check in (validate_id, validate_tag, lambda v: validate_tags([v])):
        with pytest.raises(InvalidInput) as info:
            check(bad)
        assert "\n" not in str(info.value)  # shown escaped: the error stays one line
    assert validate_id("android") == "android" and validate_tag("a=b/c+d") == "a=b/c+d"
    assert validate_id("x" * 128) and validate_tag("t" * 64)


def test_python_api_refuses_newline_tailed_names(ready: Any) -> None:
    c, h1 = ready.client, ready.h1
    refused(ready, lambda: c.submit("g", driver_type="android\n"))
    refused(ready, lambda: c.submit("g", tags=["wifi\n"]))
    refused(ready, lambda: c.submit(workflow="smoke\n"))
    refused(ready, lambda: c.submit("g", idempotency_key="build-1\n"))
    refused(ready, lambda: c.submit_many([{"goal": "fine"}, {"goal": "g", "tags": ["a\n"]}]))
    refused(ready, lambda: c.get("abc\n"))
    refused(ready, lambda: c.cancel("abc\n"))
    refused(ready, lambda: c.put_workflow({"name": "smoke\n", "steps": [{"goal": "go"}]}))
    refused(ready, lambda: ready.admin.add_host("h2\n"))
    refused(ready, lambda: ready.admin.drain("h1\n"))
    # a host's heartbeat: device id, driver type and tags
    refused(ready, lambda: h1.heartbeat([DeviceReport("d1\n", "android", ())]))
    refused(ready, lambda: h1.heartbeat([DeviceReport("d1", "android\n", ())]))
    refused(ready, lambda: h1.heartbeat([DeviceReport("d1", "android", ("wifi\n",))]))
    with pytest.raises(InvalidInput):
        HostClient(ready.r, ready.pool, "h1\n", ready.tokens["h1"])
    with pytest.raises(InvalidInput):
        Client(ready.r, "lab\n")
    # and the good spellings still work
    task_id = c.submit("g", driver_type="android", tags=["wifi"], idempotency_key="build-1")
    assert c.get(task_id).tags == ("wifi",)


@pytest.mark.parametrize(
    "args",
    [
        ["submit", "g", "--driver-type", "android\n"],
        ["submit", "g", "--tag", "wifi\n"],
        ["submit", "--workflow", "smoke\n"],
        ["submit", "g", "--idempotency-key", "k\n"],
        ["task", "show", "abc\n"],
    ],
)
def test_cli_refuses_newline_tailed_values_in_one_line(
    redis_url: str, pool: str, args: list[str]
) -> None:
    res = cli(redis_url, *args, pool=pool)
    line = one_line_error(res)
    assert "InvalidInput" in line and "\\n" in line  # the newline is shown, escaped
    assert Client(redis_url, pool).counts()["queued"] == 0


def test_cli_refuses_a_newline_tailed_pool(redis_url: str) -> None:
    res = CliRunner().invoke(main, ["--redis-url", redis_url, "--pool", "lab\n", "status"])
    assert "invalid pool name" in one_line_error(res)


def test_cli_refuses_a_newline_tailed_driver_type_in_a_real_process(
    redis_url: str, pool: str
) -> None:
    """What a shell's ``--driver-type $'android\\n'`` passes."""
    env = {**os.environ, "DEVICEQ_REDIS_URL": redis_url, "DEVICEQ_POOL": pool}
    res = subprocess.run(
        [DEVICEQ, "submit", "g", "--driver-type", "android\n"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "invalid driver_type 'android\\n'" in one_line_error(res)
    assert res.stdout == ""


# -- 2. Python API traps -------------------------------------------------------------------------
def test_a_bare_string_of_tags_is_refused_not_split_into_characters(ready: Any) -> None:
    c = ready.client
    msg = refused(ready, lambda: c.submit("x", tags="wifi"))  # type: ignore[arg-type]
    assert "list" in msg and "'wifi'" in msg
    refused(ready, lambda: c.submit_many([{"goal": "x", "tags": "wifi"}]))
    refused(ready, lambda: c.submit_many([{"goal": "x", "tags": "wifi,camera"}]))
    with pytest.raises(ValueError, match="list of strings"):
        TaskSpec(goal="x", tags="wifi")  # type: ignore[arg-type]
    # any other collection of tags is fine; None means none
    for tags in (["wifi"], ("wifi",), {"wifi"}, frozenset({"wifi"}), (t for t in ["wifi"])):
        assert c.get(c.submit("x", tags=tags)).tags == ("wifi",)
    assert c.get(c.submit("x", tags=None)).tags == ()  # type: ignore[arg-type]
    assert TaskSpec(goal="x", tags=["b", "a", "b"]).tags == ("a", "b")


def test_the_cli_still_splits_comma_lists_of_tags(redis_url: str, pool: str) -> None:
    res = cli(redis_url, "submit", "x", "--tag", "wifi,camera", "--tag", "nfc", pool=pool)
    assert res.exit_code == 0, res.stderr
    assert Client(redis_url, pool).get(res.stdout.strip()).tags == ("camera", "nfc", "wifi")
    assert "invalid tag ''" in one_line_error(
        cli(redis_url, "submit", "x", "--tag", "a,", pool=pool)
    )


def test_bytes_are_refused_where_text_is_expected(ready: Any) -> None:
    c = ready.client
    cases: list[Callable[[], Any]] = [
        lambda: c.submit(b"open the camera"),  # type: ignore[arg-type]
        lambda: c.submit(workflow=b"smoke"),  # type: ignore[arg-type]
        lambda: c.submit("g", driver_type=b"android"),  # type: ignore[arg-type]
        lambda: c.submit("g", tags=[b"wifi"]),  # type: ignore[list-item]
        lambda: c.submit("g", tags=b"wifi"),  # type: ignore[arg-type]
        lambda: c.submit("g", idempotency_key=b"k1"),  # type: ignore[arg-type]
        lambda: c.submit_many([{"goal": b"g"}]),
        lambda: c.get(b"abc"),  # type: ignore[arg-type]
        lambda: c.cancel(b"abc"),  # type: ignore[arg-type]
        lambda: c.put_workflow({"name": b"wf", "steps": [{"goal": "go"}]}),
        lambda: c.put_workflow({"name": "wf", "steps": [{"goal": b"go"}]}),
        lambda: ready.admin.add_host(b"h2"),  # type: ignore[arg-type]
        lambda: ready.h1.heartbeat([DeviceReport("d1", "android", b"wifi")]),  # type: ignore[arg-type]
    ]
    for case in cases:
        msg = refused(ready, case)
        assert "bytes" in msg, msg
    with pytest.raises(ValueError, match="bytes"):
        TaskSpec(goal=b"g")  # type: ignore[arg-type]


def test_list_refuses_bad_limits_and_offsets(ready: Any) -> None:
    c = ready.client
    ids = [c.submit(f"t{i}") for i in range(3)]
    for kwargs in (
        {"limit": -1},
        {"limit": 0},
        {"limit": True},
        {"limit": 2.5},
        {"limit": "10"},
        {"offset": -1},
        {"offset": None},
    ):
        msg = refused(ready, lambda kw=kwargs: c.list("queued", **kw))  # type: ignore[misc]
        assert next(iter(kwargs)) in msg
    assert "unknown status" in refused(ready, lambda: c.list("bogus"))
    assert [t.id for t in c.list("queued", limit=2)] == ids[:2]
    assert [t.id for t in c.list("queued", limit=2, offset=1)] == ids[1:]
    assert [t.id for t in c.list("queued", offset=5)] == []


def test_single_values_where_lists_are_expected_are_refused(ready: Any) -> None:
    c = ready.client
    task_id = c.submit("x")
    assert "list of task ids" in refused(ready, lambda: c.get_many(task_id))  # type: ignore[arg-type]
    refused(ready, lambda: c.submit_many("abc"))  # type: ignore[arg-type]
    refused(ready, lambda: c.submit_many({"goal": "x"}))  # type: ignore[arg-type]
    refused(ready, lambda: c.submit_many(["goal"]))  # type: ignore[list-item]
    refused(ready, lambda: c.submit_many([{"goal": "x"}], chunk=0))
    assert [t.id for t in c.get_many([task_id])] == [task_id]


# -- 3. one line for every bad URL or connection problem -------------------------------------
COMMANDS = [
    ["status"],
    ["submit", "g"],
    ["task", "list"],
    ["task", "show", "abc"],
    ["task", "wait", "abc", "--timeout", "1"],
    ["events"],
    ["host", "list"],
    ["host", "add", "h9"],
    ["device", "list"],
    ["config", "get"],
    ["workflow", "list"],
    ["explain", "abc"],
    ["scheduler", "run", "--once"],
    [
        "host",
        "run",
        "--host-id",
        "h1",
        "--token",
        "t" * 64,
        "--device",
        "d1:android",
        "--command",
        "echo {goal}",
    ],
]
BAD_URLS = {
    "127.0.0.1:6430": "must start with redis://",
    "localhost": "must start with redis://",
    "": "empty",
    "http://127.0.0.1:6379/0": "must start with redis://",
    "redis://127.0.0.1:notaport/0": "Port could not be cast",
    "redis://127.0.0.1:99999/0": "Port out of range",
    "redis://127.0.0.1:6379/zero": "database",
    "redis://[::1/0": "Invalid IPv6",
}


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_every_command_reports_a_malformed_url_in_one_line(args: list[str]) -> None:
    for url, reason in BAD_URLS.items():
        line = one_line_error(cli(url, *args))
        assert "invalid Redis URL" in line or "URL is empty" in line, line
        assert reason in line, line


def test_a_malformed_url_never_shows_its_password() -> None:
    from deviceq.core.redis_urls import check_redis_url, redact_url

    for url in (":s3cret@127.0.0.1:6379", "redis://user:s3cret@127.0.0.1:notaport/0"):
        line = one_line_error(cli(url, "status"))
        assert "s3cret" not in line and "***" in line, line
    assert redact_url("rediss://me:pw@h:1/0") == "rediss://me:***@h:1/0"
    assert redact_url("redis://:pw@h/0") == "redis://:***@h/0"
    assert redact_url("pw@h") == "***@h"
    assert redact_url("redis://h:1/0") == "redis://h:1/0"
    for good in ("redis://h", "redis://h:1/0", "rediss://u:p@h:6380/3", "unix:///tmp/r.sock?db=2"):
        assert check_redis_url(good) == good
    with pytest.raises(ConfigError):
        Client("127.0.0.1:6430", "p")  # the Python API: a typed error, not redis-py's ValueError


# ``host run`` is left out: its daemon (worker.py) waits for an unreachable Redis at start,
# retrying (as the scheduler daemon does); ``scheduler run --once`` fails.
@pytest.mark.parametrize(
    "args", [c for c in COMMANDS if c[:2] != ["host", "run"]], ids=lambda a: " ".join(a[:2])
)
def test_every_command_reports_an_unreachable_redis_in_one_line(args: list[str]) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    line = one_line_error(cli(url, *args))
    assert line.startswith(f"error: cannot reach Redis at {url}"), line


@pytest.fixture(scope="module")
def locked_redis() -> Iterator[RedisServer]:
    with RedisServer(password="0123abcd" * 4) as server:
        yield server


def test_a_wrong_or_missing_password_is_one_line(locked_redis: RedisServer) -> None:
    """Said at once: a password Redis refused (or none given) is not tried again (one
    connection per command, counted by the server)."""
    port = locked_redis.port
    admin = redis.Redis.from_url(locked_redis.url)

    def connections() -> int:
        return int(admin.info("stats")["total_connections_received"])

    for args in (["status"], ["submit", "g"], ["scheduler", "run"], ["scheduler", "run", "--once"]):
        before = connections()
        wrong = one_line_error(cli(f"redis://:wr0ng-pw@127.0.0.1:{port}/0", *args))
        assert "refused the credentials" in wrong and "wr0ng-pw" not in wrong, wrong
        missing = one_line_error(cli(f"redis://127.0.0.1:{port}/0", *args))
        assert "requires a password" in missing, missing
        # each command: its durability check (it goes on when that fails) and the command
        assert connections() - before <= 4, (args, connections() - before)
    ok = cli(locked_redis.url, "status")
    assert ok.exit_code == 0, ok.stderr


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never answers (a hung Redis)."""
    srv = socket.create_server(("127.0.0.1", 0))
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conns.append(srv.accept()[0])

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join(5)
    for c in conns:
        c.close()
    srv.close()


def test_a_redis_that_does_not_answer_is_one_line(silent_server: int) -> None:
    url = f"redis://127.0.0.1:{silent_server}/0?socket_timeout=0.2"
    line = one_line_error(cli(url, "status"))
    assert "did not answer in time" in line, line


def test_commands_without_redis_ignore_a_bad_url() -> None:
    res = cli("not a url", "scheduler", "strategies")
    assert res.exit_code == 0 and "fifo_match (default)" in res.stdout


def test_a_real_process_prints_one_line_for_a_url_without_scheme() -> None:
    for args in (["status"], ["submit", "g"], ["scheduler", "run"]):
        res = subprocess.run(
            [DEVICEQ, "--redis-url", "127.0.0.1:6430", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        line = one_line_error(res)
        assert line == (
            "error: ConfigError: invalid Redis URL '127.0.0.1:6430': it must start with "
            "redis://, rediss://, unix:// or redis+sentinel:// (e.g. 'redis://127.0.0.1:6430/0')"
        )
        assert res.stdout == ""
    env = {**os.environ, "DEVICEQ_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    res = subprocess.run(
        [DEVICEQ, "task", "list"], capture_output=True, text=True, timeout=60, env=env
    )
    assert "cannot reach Redis" in one_line_error(res)


# -- 4. register_strategy sets the name ----------------------------------------------------------
@pytest.fixture
def registry() -> Iterator[None]:
    before = dict(S._REGISTRY)
    yield
    S._REGISTRY.clear()
    S._REGISTRY.update(before)


def test_register_strategy_sets_the_name(registry: None) -> None:
    @register_strategy("hardening_unnamed")
    class Unnamed:
        def propose(self, snapshot: Any) -> list[tuple[str, str]]:
            return []

    assert Unnamed.name == "hardening_unnamed"  # type: ignore[attr-defined]
    assert get_strategy("hardening_unnamed").name == "hardening_unnamed"

    @register_strategy("hardening_renamed")
    class Misnamed:
        name = "something_else"

        def propose(self, snapshot: Any) -> list[tuple[str, str]]:
            return []

    assert Misnamed.name == "hardening_renamed"
    assert get_strategy("hardening_renamed").name == "hardening_renamed"

    # one class under two names: each name's instances carry their own
    register_strategy("hardening_alias")(Misnamed)
    assert get_strategy("hardening_renamed").name == "hardening_renamed"
    assert get_strategy("hardening_alias").name == "hardening_alias"

    # a factory's instances and a ready object
    register_strategy("hardening_factory")(lambda: Unnamed())
    assert get_strategy("hardening_factory").name == "hardening_factory"
    obj = Misnamed()
    register_strategy("hardening_obj")(obj)
    assert obj.name == "hardening_obj" and get_strategy("hardening_obj") is obj

    with pytest.raises(ConfigError):
        register_strategy("hardening_broken")(object())
    assert "hardening_broken" not in S.registered_strategies()


# -- 5. the docs' examples, run verbatim -----------------------------------------------------
def readme_blocks(section: str, lang: str = "python") -> list[str]:
    """The ``lang`` code blocks under the docs heading ``section`` (one page has it), verbatim."""
    _, body = docs_pages.section(section)
    return re.findall(rf"^```{lang}\n(.*?)^```$", body, re.M | re.S)


def test_readme_strategy_example_assigns_the_newest_task(fleet: Any, registry: None) -> None:
    (block,) = readme_blocks("Writing a strategy")
    namespace: dict[str, Any] = {"__name__": "readme_writing_a_strategy"}
    exec(compile(block, "docs (Writing a strategy)", "exec"), namespace)
    cls = namespace["NewestFirst"]
    assert cls.name == "newest_first"  # set by register_strategy
    fleet.add_host("h1", ("d1", "android", ()))
    ids = [fleet.client.submit(f"t{i}", driver_type="android") for i in range(5)]
    res = TaskScheduler(fleet.admin, strategy="newest_first").assign()
    assert [(t, d) for t, d, _ in res.assignments] == [(ids[-1], "d1")]
    assert fleet.client.get(ids[-1]).status.value == "assigned"
    assert {fleet.client.get(i).status.value for i in ids[:-1]} == {"queued"}


def test_the_strategies_docstring_example_is_the_readme_one() -> None:
    (block,) = readme_blocks("Writing a strategy")
    doc = S.__doc__ or ""
    example = doc[doc.index("Registering a strategy::") :].split("\n\n", 1)[1]
    code = "\n".join(line[4:] for line in example.splitlines())
    assert code.startswith(block.rstrip("\n")), code


@pytest.fixture
def daemons(redis_url: str, pool: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A scheduler and a host ``lab-1`` (an android device with a camera, the ``command`` runner
    echoing the goal) as real processes; yields the environment the docs' code runs in."""
    env = {**os.environ, "DEVICEQ_REDIS_URL": redis_url, "DEVICEQ_POOL": pool}
    token = tmp_path / "lab-1.token"
    token.write_text(PoolAdmin(redis_url, pool).add_host("lab-1"))
    procs = [
        subprocess.Popen(
            [DEVICEQ, "scheduler", "run"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [DEVICEQ, "host", "run", "--host-id", "lab-1", "--token-file", str(token),
             "--device", "pixel-7:android:camera,wifi", "--goal-runner", "command",
             "--command", "echo {goal}"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
    ]  # fmt: skip
    try:
        yield env
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


@pytest.mark.slow
def test_readme_python_api_example_runs(daemons: dict[str, str], redis_url: str, pool: str) -> None:
    (block,) = readme_blocks("Python API")
    res = subprocess.run(
        [sys.executable, "-c", block], env=daemons, capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stderr
    # print(task.status, task.result, outcomes); the result is the echo's output, newline kept
    assert " ".join(res.stdout.split()) == "done open the camera ['done']", res.stdout
    client, admin = Client(redis_url, pool), PoolAdmin(redis_url, pool)
    first = client.submit("open the camera", idempotency_key="build-4711-camera")  # the same task
    assert client.get(first).status.value == "done" and client.get(first).device_id == "pixel-7"
    counts = client.counts()
    # the camera task, the browser cases, the workflow run, team-a's "flash" and the release
    # smoke test of the release-blocker class
    assert sum(counts.values()) == 1 + 1000 + 1 + 1 + 1 and counts["cancelled"] == 1
    flash = client.find(TaskFilter(tenant="team-a")).tasks
    assert [(t.goal, t.retry_backoff) for t in flash] == [("flash", "exponential:2:120")]
    assert [(t.tenant, t.weight, t.max_devices) for t in admin.tenants()] == [("team-a", 3, 10)]
    assert counts["queued"] >= 999  # the browser cases: no browser device (the workflow may run)
    assert client.list_workflows() == ["smoke"]
    assert {h.host_id: h.draining for h in admin.hosts()} == {"lab-1": False, "lab-2": True}
    assert float(admin.get_config("lease_ttl")["lease_ttl"]) == 120


def test_readme_runner_example_returns_outcomes() -> None:
    """The runner block names the user's own agent (``my_agent``); it is given a stand-in, the
    rest (Task, Outcome, the cancel event) is deviceq's."""
    (block,) = readme_blocks("Writing a runner")
    calls = []

    class Agent:
        def __init__(self, ok: bool) -> None:
            self.ok = ok

        def run(self, goal: str, serial: str, should_stop: Callable[[], bool]) -> tuple[bool, str]:
            calls.append((goal, serial, should_stop()))
            return self.ok, f"ran {goal} on {serial}"

    for ok in (True, False):
        namespace: dict[str, Any] = {"__name__": "mylab.runners", "my_agent": Agent(ok)}
        exec(compile(block, "docs (Writing a runner)", "exec"), namespace)
        task = Task(goal="open settings", task_id="t1", device_id="pixel-7", driver_type="android")
        out = namespace["adb_goal"](task)
        assert out == Outcome(ok, "ran open settings on pixel-7")
    assert calls == [("open settings", "pixel-7", False)] * 2


# -- 6. the metrics endpoint binds where it is told ---------------------------------------------
def listening(port: int) -> set[str]:
    """The local addresses a TCP socket listens on for ``port`` (from /proc/net/tcp[6])."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            for line in list(f)[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, _, hexport = local.partition(":")
                if int(hexport, 16) != port or state != "0A":  # 0A: LISTEN
                    continue
                raw = bytes.fromhex(addr)
                if width == 8:
                    found.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
                else:
                    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                    found.add(socket.inet_ntop(socket.AF_INET6, words))
    return found


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def other_local_address() -> str | None:
    """An address of this machine that is not loopback (None if it has none)."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("10.255.255.255", 1))  # no packet is sent; picks the outgoing interface
        addr = str(s.getsockname()[0])
        return None if addr.startswith("127.") else addr
    return None


def test_serve_metrics_listens_on_loopback_by_default(real_fleet: Any) -> None:
    port = free_port()
    server = serve_metrics(real_fleet.admin, port, lambda: True)
    try:
        assert server.addr == "127.0.0.1"
        assert listening(port) == {"127.0.0.1"}  # not 0.0.0.0
        assert "deviceq_leader" in get(f"http://127.0.0.1:{port}/metrics")
        other = other_local_address()
        if other is not None:
            with pytest.raises(OSError):
                socket.create_connection((other, port), timeout=2).close()
    finally:
        server.stop()


def wait_for_endpoint(url: str, proc: subprocess.Popen[bytes], timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return get(url)
        except (urllib.error.URLError, OSError):
            assert proc.poll() is None, "the scheduler died"
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.parametrize("host", [None, "127.0.0.2"])
def test_scheduler_run_metrics_host(redis_url: str, pool: str, host: str | None) -> None:
    port = free_port()
    args = ["--metrics-port", str(port)] + (["--metrics-host", host] if host else [])
    env = {**os.environ, "DEVICEQ_REDIS_URL": redis_url, "DEVICEQ_POOL": pool}
    proc = subprocess.Popen(
        [DEVICEQ, "scheduler", "run", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        where = host or "127.0.0.1"
        text = wait_for_endpoint(f"http://{where}:{port}/metrics", proc)
        assert f'deviceq_redis_up{{pool="{pool}"}} 1.0' in text
        assert listening(port) == {where}
        if host is not None:  # told 127.0.0.2: nothing on 127.0.0.1
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


def test_a_metrics_host_that_cannot_be_bound_is_one_line(redis_url: str, pool: str) -> None:
    for host in ("no-such-host.invalid", "192.0.2.1"):  # unknown; not an address of this machine
        res = cli(redis_url, "scheduler", "run", "--once", "--metrics-port", str(free_port()),
                  "--metrics-host", host, pool=pool)  # fmt: skip
        assert f"cannot serve metrics on {host}:" in one_line_error(res)
