"""``deviceq demo``: a whole fleet on one machine, in well under a minute.

The demo starts an embedded Redis (a private ``redis-server`` on a free port in a temporary
directory, or an in-process fakeredis TCP server when no ``redis-server`` binary exists), then
runs the real daemons as subprocesses of the ``deviceq`` command line:

* one scheduler (``deviceq scheduler run``),
* two hosts (``deviceq host run``) with several ``sim`` devices of two driver types and tags,

submits a stream of goal and workflow tasks, SIGKILLs one host mid-way so that lease expiry and
retry happen for real, shows a live view while it runs, and prints a summary at the end (tasks
done / failed / retried, submit-to-dispatch latency percentiles). Everything it started is
stopped and every file it wrote is removed, whatever happens. With ``redis_url`` it runs against
that Redis instead, in a fresh pool whose keys it deletes at the end.
"""

from __future__ import annotations

import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .client import Client
from .embedded import RedisServer
from .events import Event, last_event_id, read_events
from .models import TaskStatus, WorkflowDefinition, WorkflowStep
from .pool import PoolAdmin

# -- the fleet -------------------------------------------------------------------------------

#: host id -> devices (device_id, driver_type, tags). Every constraint the demo submits can be
#: met by ``lab-a`` alone, so the work of the killed host always has somewhere to go.
DEMO_HOSTS: dict[str, list[tuple[str, str, tuple[str, ...]]]] = {
    "lab-a": [
        ("a-pixel-1", "android", ("wifi", "camera")),
        ("a-pixel-2", "android", ("wifi",)),
        ("a-chrome-1", "browser", ("headless",)),
        ("a-chrome-2", "browser", ("headless", "gpu")),
        ("a-chrome-3", "browser", ("headless",)),
    ],
    "lab-b": [
        ("b-pixel-1", "android", ("wifi", "camera")),
        ("b-pixel-2", "android", ("wifi", "nfc")),
        ("b-chrome-1", "browser", ("headless", "gpu")),
        ("b-chrome-2", "browser", ("headless",)),
    ],
}
KILLED_HOST = "lab-b"

#: short timings so that a killed host's work is requeued within seconds
DEMO_CONFIG: dict[str, float | int] = {
    "lease_ttl": 3.0,
    "claim_ttl": 3.0,
    "host_timeout": 3.0,
    "leader_ttl": 3.0,
    "max_attempts": 4,
    "quarantine_after": 0,
}

#: (goal, driver_type, tags) of the goal tasks, submitted round-robin
DEMO_GOALS: list[tuple[str, str | None, tuple[str, ...]]] = [
    ("open the settings app and enable wifi", "android", ("wifi",)),
    ("take a photo and check it uploads", "android", ("camera",)),
    ("load the landing page", "browser", ()),
    ("render the WebGL product viewer", "browser", ("gpu",)),
    ("read the battery level", None, ()),
]

DEMO_WORKFLOW = WorkflowDefinition(
    name="checkout-flow",
    description="log in, add an item to the cart, pay (demo)",
    steps=[
        WorkflowStep(name="login", goal="log in as the demo user"),
        WorkflowStep(name="cart", goal="add the first product to the cart"),
        WorkflowStep(name="pay", goal="pay with the test card"),
    ],
)
WORKFLOW_EVERY = 4  # every 4th task is a workflow task (browser, headless)

#: simulated run time of one goal (a workflow step too), for the ``sim`` runner
SIM_MIN_S, SIM_MAX_S = 0.3, 0.9
SIM_DURATION = f"uniform:{SIM_MIN_S},{SIM_MAX_S}"
#: the host is killed while a run it claimed is surely still going: at most this long after
#: the claim, minus this margin for the time the kill takes
KILL_MARGIN_MS = 100

#: events the live view keeps in view longer than the rest
INCIDENTS = frozenset({"expired", "requeued", "failed", "released", "device_quarantined",
                       "leader_elected", "host_killed"})  # fmt: skip

EMBEDDED_CHOICES = ("auto", "redis-server", "fakeredis")


# -- results ---------------------------------------------------------------------------------


@dataclass
class DemoResult:
    """What the demo did; ``ok`` is true when every submitted task ended ``done``."""

    backend: str
    redis_url: str
    pool: str
    submitted: int = 0
    goal_tasks: int = 0
    workflow_tasks: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    retried: int = 0
    lease_expiries: int = 0
    requeued: int = 0
    killed_host: str | None = None
    killed_at_s: float | None = None
    tasks_on_killed_host: int = 0  # runs the killed host had claimed and not finished
    latency_ms: dict[str, float | int | None] = field(default_factory=dict)
    retry_latency_ms: dict[str, float | int | None] = field(default_factory=dict)
    wall_s: float = 0.0
    ok: bool = False
    problem: str | None = None
    detail: str = ""  # e.g. the log tail of a daemon that died

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: list[int], q: float) -> int | None:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def latency_stats(values: list[int]) -> dict[str, float | int | None]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "max": max(values) if values else None,
    }


# -- the embedded Redis ----------------------------------------------------------------------


@dataclass
class Backend:
    """Where the demo's Redis is, and how to stop it."""

    kind: str  # redis-server | fakeredis | external
    url: str
    description: str
    stop: Callable[[], None]


class FakeRedisTcp:
    """An in-process fakeredis server reachable over TCP on 127.0.0.1 (for subprocesses)."""

    def __init__(self) -> None:
        try:
            from fakeredis import TcpFakeServer
        except ImportError as exc:  # fakeredis too old
            raise RuntimeError(
                "the fakeredis fallback needs fakeredis with TcpFakeServer (>= 2.34); "
                "install redis-server or upgrade fakeredis"
            ) from exc
        from . import fakeredis_compat

        fakeredis_compat.enable()  # redis.sha1hex, which the scripts use, as real Redis has
        self.server = TcpFakeServer(("127.0.0.1", 0), server_type="redis")
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True,
            name="fakeredis-tcp",
        )  # fmt: skip
        self.thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (for output)."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hostport}"))


def start_backend(embedded: str, redis_url: str | None) -> Backend:
    """Start the demo's Redis: ``redis_url`` if given, else by ``embedded``: ``auto`` (a
    private redis-server when the binary exists, else fakeredis), ``redis-server`` or
    ``fakeredis``."""
    if redis_url:
        shown = redact_url(redis_url)
        return Backend("external", redis_url, f"Redis at {shown}", lambda: None)
    if embedded not in EMBEDDED_CHOICES:
        raise ValueError(f"embedded must be one of {', '.join(EMBEDDED_CHOICES)}")
    if embedded == "redis-server" or (embedded == "auto" and shutil.which("redis-server")):
        server = RedisServer().start()
        return Backend(
            "redis-server", server.url, f"private redis-server on port {server.port}", server.stop
        )
    fake = FakeRedisTcp()
    return Backend("fakeredis", fake.url, f"in-process fakeredis on port {fake.port}", fake.stop)


# -- daemons ---------------------------------------------------------------------------------


def deviceq_argv() -> list[str]:
    """How to run the ``deviceq`` command of this very installation."""
    script = Path(sys.executable).parent / "deviceq"
    if script.exists():
        return [str(script)]
    found = shutil.which("deviceq")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from deviceq.cli import main; sys.exit(main())"]


@dataclass
class Daemon:
    """A deviceq daemon run as a subprocess in a process group of its own, logging to a file."""

    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    killed: bool = False

    def start(self, env: dict[str, str]) -> None:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,
            )  # fmt: skip

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal_group(self, sig: int) -> None:
        if self.proc is None:
            return
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the whole process group (no clean shutdown: leases are left to expire)."""
        self.killed = True
        self.signal_group(signal.SIGKILL)
        if self.proc is not None:
            with suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)

    def stop(self, grace: float) -> None:
        """SIGTERM, wait up to ``grace`` seconds, then SIGKILL the group."""
        stop_all([self], grace)

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def stop_all(daemons: list[Daemon], grace: float) -> None:
    """SIGTERM every daemon at once (hosts drain, the scheduler lets go of its lease), wait up
    to ``grace`` seconds for all of them, then SIGKILL each process group (the daemon and
    anything it left in its group) and reap."""
    for d in daemons:
        if d.running:
            d.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(d.running for d in daemons) and time.monotonic() < deadline:
        time.sleep(0.05)
    for d in daemons:
        d.signal_group(signal.SIGKILL)
        if d.proc is not None:
            with suppress(subprocess.TimeoutExpired):
                d.proc.wait(10)


def scheduler_argv(base: list[str]) -> list[str]:
    # lru_device spreads the work over both hosts (fifo_match would favour the first by id)
    return [*base, "scheduler", "run", "--tick", "0.5", "--strategy", "lru_device"]


def host_argv(base: list[str], host_id: str, token_file: Path) -> list[str]:
    argv = [*base, "host", "run", "--host-id", host_id, "--token-file", str(token_file)]
    for device_id, driver, tags in DEMO_HOSTS[host_id]:
        argv += ["--device", f"{device_id}:{driver}:{','.join(tags)}"]
    argv += ["--goal-runner", "sim", "--sim-duration", SIM_DURATION, "--workflow-runner", "steps"]
    argv += ["--heartbeat-interval", "0.5", "--grace", "2"]
    return argv


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """Let SIGTERM unwind the demo like Ctrl-C, so its cleanup always runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not stop the cleanup
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- the run ---------------------------------------------------------------------------------


@dataclass
class DemoOptions:
    """Knobs of ``deviceq demo``."""

    redis_url: str | None = None
    embedded: str = "auto"
    tasks: int = 40
    duration: float = 20.0
    live: bool = True
    keep_pool: bool = False


def event_line(e: Event) -> Text:
    """One event as a short coloured line for the live view."""
    f = e.fields
    style = {
        "done": "green",
        "failed": "bold red",
        "expired": "bold yellow",
        "requeued": "yellow",
        "host_killed": "bold red",
        "dispatched": "cyan",
        "assigned": "blue",
        "released": "yellow",
        "leader_elected": "magenta",
    }.get(e.type, "dim")
    keys = ("task", "host", "device", "attempt", "failure_kind", "owner")
    parts = [f"{k}={f[k]}" for k in keys if f.get(k)]
    if e.type == "dispatched" and f.get("since_submit_ms"):
        parts.append(f"waited={f['since_submit_ms']}ms")
    stamp = time.strftime("%H:%M:%S", time.localtime(e.ms / 1000))
    return Text.assemble((f"{stamp} ", "dim"), (f"{e.type:<18}", style), " ".join(parts))


class Demo:
    """One demo run. ``run()`` always cleans up and returns a DemoResult."""

    def __init__(self, options: DemoOptions, console: Console | None = None) -> None:
        if options.tasks < 1:
            raise ValueError("tasks must be at least 1")
        if options.duration <= 0:
            raise ValueError("duration must be positive")
        self.opt = options
        self.console = console or Console()
        self.pool = "demo" if not options.redis_url else f"demo-{secrets.token_hex(4)}"
        self.daemons: dict[str, Daemon] = {}
        self.recent: deque[Text] = deque(maxlen=8)
        self.incidents: deque[Text] = deque(maxlen=6)  # kills, expiries, retries, failures
        self.event_counts: Counter[str] = Counter()
        self.first_dispatch_ms: dict[str, int] = {}
        self.retry_dispatch_ms: list[int] = []
        self.task_ids: list[str] = []
        self.kind_of: dict[str, str] = {}
        self.running: dict[str, dict[str, int]] = {h: {} for h in DEMO_HOSTS}  # task -> ms
        self.cursor = "0-0"
        self.t0 = time.monotonic()

    # -- setup ------------------------------------------------------------------------------
    def _setup_pool(self, client: Client, admin: PoolAdmin, tmp: Path) -> dict[str, Path]:
        for key, value in DEMO_CONFIG.items():
            admin.set_config(key, value)
        tokens: dict[str, Path] = {}
        for host_id in DEMO_HOSTS:
            path = tmp / f"{host_id}.token"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(admin.add_host(host_id) + "\n")
            tokens[host_id] = path
        client.put_workflow(DEMO_WORKFLOW)
        return tokens

    def _start_daemons(self, url: str, tokens: dict[str, Path], tmp: Path) -> None:
        base = [*deviceq_argv(), "--pool", self.pool]
        # the URL goes by environment, not argv: a password in it must not show in `ps`
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "DEVICEQ_LOG_FORMAT": "text"}
        env["DEVICEQ_REDIS_URL"] = url
        self.daemons["scheduler"] = Daemon("scheduler", scheduler_argv(base), tmp / "scheduler.log")
        for host_id, token in tokens.items():
            self.daemons[host_id] = Daemon(
                host_id, host_argv(base, host_id, token), tmp / f"{host_id}.log"
            )
        for d in self.daemons.values():
            d.start(env)

    def _check_daemons(self) -> None:
        for d in self.daemons.values():
            if not d.killed and not d.running:
                code = d.proc.returncode if d.proc else None
                raise DemoError(f"{d.name} exited early (code {code})", d.tail())

    def _wait_ready(self, admin: PoolAdmin, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._check_daemons()
            hosts = {h.host_id: h for h in admin.hosts()}
            if all(h in hosts and hosts[h].alive for h in DEMO_HOSTS):
                return
            if time.monotonic() > deadline:
                raise DemoError(f"hosts did not come up within {timeout:.0f}s")
            time.sleep(0.1)

    # -- the stream of work ------------------------------------------------------------------
    def _spec(self, i: int) -> dict[str, Any]:
        if i % WORKFLOW_EVERY == WORKFLOW_EVERY - 1:
            return {"workflow": DEMO_WORKFLOW.name, "driver_type": "browser", "tags": ["headless"]}
        goal, driver, tags = DEMO_GOALS[i % len(DEMO_GOALS)]
        return {"goal": f"{goal} #{i + 1}", "driver_type": driver, "tags": list(tags)}

    def _submit_due(self, client: Client, elapsed: float, window: float) -> None:
        due = min(self.opt.tasks, math.ceil(self.opt.tasks * min(1.0, elapsed / window)))
        start = len(self.task_ids)
        if due > start:
            specs = [self._spec(i) for i in range(start, due)]
            ids = client.submit_many(specs)
            self.task_ids += ids
            for task_id, spec in zip(ids, specs, strict=True):
                self.kind_of[task_id] = "workflow" if spec.get("workflow") else "goal"

    def _poll_events(self, r: redis.Redis, client: Client) -> None:
        while True:
            self.cursor, batch = read_events(r, client.keys, self.cursor, block_ms=None, count=500)
            for e in batch:
                self._on_event(e)
            if len(batch) < 500:
                return

    def _on_event(self, e: Event) -> None:
        self.event_counts[e.type] += 1
        f = e.fields
        if e.task and e.type in ("done", "failed", "cancelled", "released", "expired"):
            for running in self.running.values():
                running.pop(e.task, None)
        if e.type == "dispatched" and e.task:
            self.running.setdefault(f.get("host", ""), {})[e.task] = e.ms
            waited = int(f.get("since_submit_ms") or 0)
            if f.get("attempt") == "1":
                self.first_dispatch_ms.setdefault(e.task, waited)
            else:
                self.retry_dispatch_ms.append(waited)
        if e.type in ("submitted", "device_state", "heartbeat"):
            return
        line = event_line(e)
        self.recent.append(line)
        if e.type in INCIDENTS:
            self.incidents.append(line)

    # -- live view ---------------------------------------------------------------------------
    def _render(self, backend: Backend, client: Client, admin: PoolAdmin) -> Group:
        counts = client.counts()
        head = Text.assemble(
            ("deviceq demo ", "bold"), f"— {backend.description}, pool {self.pool} — ",
            f"{time.monotonic() - self.t0:4.1f}s — submitted {len(self.task_ids)}/{self.opt.tasks}",
        )  # fmt: skip
        status = Table(title="tasks", title_justify="left", expand=False)
        colours = {"queued": "yellow", "assigned": "blue", "dispatched": "cyan", "done": "green",
                   "failed": "red", "cancelled": "magenta"}  # fmt: skip
        for st in TaskStatus:
            status.add_column(st.value, justify="right", style=colours.get(st.value))
        status.add_column("retried", justify="right", style="yellow")
        status.add_row(
            *[str(counts.get(st.value, 0)) for st in TaskStatus], str(self.event_counts["requeued"])
        )
        hosts = {h.host_id: h for h in admin.hosts()}
        devices = Table(title="devices", title_justify="left")
        for col in ("device", "host", "driver", "tags", "state", "task"):
            devices.add_column(col)
        for d in admin.devices():
            h = hosts.get(d.host_id)
            host_text = Text(d.host_id, style="green" if h and h.alive else "bold red")
            if h and not h.alive:
                host_text.append(" (dead)")
            state = d.state.value
            if d.quarantined:
                state = "quarantined"
            elif h and not h.alive:
                state = "offline"
            elif d.reserved_by:
                running = any(d.reserved_by in r for r in self.running.values())
                state = "running" if running else "assigned"
            devices.add_row(
                d.device_id, host_text, d.driver_type, ",".join(d.tags), state, d.reserved_by or "-"
            )
        parts: list[Any] = [head, status, devices]
        for title, lines in (("incidents", self.incidents), ("recent events", self.recent)):
            table = Table(title=title, title_justify="left", show_header=False, box=None)
            table.add_column("event")
            for line in lines:
                table.add_row(line)
            parts.append(table)
        return Group(*parts)

    def _progress_line(self, client: Client) -> str:
        c = client.counts()
        active = ", ".join(f"{k} {v}" for k, v in c.items() if v)
        return (
            f"[{time.monotonic() - self.t0:5.1f}s] submitted {len(self.task_ids)}/"
            f"{self.opt.tasks}: {active or 'nothing yet'}; expired leases "
            f"{self.event_counts['expired']}, requeued {self.event_counts['requeued']}"
        )

    # -- main --------------------------------------------------------------------------------
    def run(self) -> DemoResult:
        """Start everything, run the scenario, stop everything, return the result."""
        self.t0 = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix="deviceq-demo-"))
        backend: Backend | None = None
        result = DemoResult(backend="?", redis_url="", pool=self.pool)
        r: redis.Redis | None = None
        client: Client | None = None
        verdict: str | None = "not run"
        with _terminate_as_interrupt():
            try:
                backend = start_backend(self.opt.embedded, self.opt.redis_url)
                result.backend, result.redis_url = backend.kind, redact_url(backend.url)
                self.console.print(
                    f"deviceq demo: {backend.description}, pool {self.pool}",
                    highlight=False,
                    soft_wrap=True,
                )
                client = Client(backend.url, self.pool)
                admin = PoolAdmin(client.redis, self.pool)
                r = client.redis
                self.cursor = last_event_id(r, client.keys)
                tokens = self._setup_pool(client, admin, tmp)
                self._start_daemons(backend.url, tokens, tmp)
                self._wait_ready(admin, timeout=30)
                self._scenario(backend, client, admin, result)
            except DemoError as exc:
                result.problem, result.detail = str(exc), exc.detail
            except KeyboardInterrupt:
                result.problem = "interrupted"
            except (redis.RedisError, OSError, RuntimeError, ValueError) as exc:
                result.problem = f"{type(exc).__name__}: {exc}"
            finally:
                if client is not None:
                    with suppress(redis.RedisError, OSError):
                        verdict = self._summarise(client, result)
                self._cleanup(backend, r, tmp)
        result.problem = result.problem or verdict
        result.wall_s = round(time.monotonic() - self.t0, 1)
        result.ok = result.problem is None
        return result

    def _scenario(
        self, backend: Backend, client: Client, admin: PoolAdmin, result: DemoResult
    ) -> None:
        dur = self.opt.duration
        start = time.monotonic()
        window = dur * 0.5  # tasks are submitted over the first half
        kill_earliest, kill_latest = dur * 0.25, dur * 0.6
        deadline = start + dur + 25.0
        live: Live | None = None
        if self.opt.live and self.console.is_terminal:
            live = Live(console=self.console, refresh_per_second=4, transient=False)
            live.start()
        last_line = 0.0
        try:
            while True:
                now = time.monotonic()
                elapsed = now - start
                self._submit_due(client, elapsed, window)
                self._poll_events(client.redis, client)
                if result.killed_host is None and (
                    elapsed >= kill_latest
                    or (elapsed >= kill_earliest and self._surely_running(admin, KILLED_HOST))
                ):
                    self._kill(KILLED_HOST, result)
                self._check_daemons()
                counts = client.counts()
                finished = sum(counts[s.value] for s in TaskStatus if s.terminal)
                if (
                    len(self.task_ids) == self.opt.tasks
                    and result.killed_host
                    and (
                        finished >= self.opt.tasks
                        and not any(counts[s.value] for s in TaskStatus if not s.terminal)
                    )
                ):
                    break
                if now > deadline:
                    raise DemoError(
                        f"the fleet did not finish within {dur + 25:.0f}s: "
                        + ", ".join(f"{k} {v}" for k, v in counts.items() if v)
                    )
                if now - last_line >= (0.25 if live is not None else 2.0):
                    last_line = now
                    if live is not None:
                        live.update(self._render(backend, client, admin))
                    else:
                        self.console.print(
                            self._progress_line(client), highlight=False, soft_wrap=True
                        )
                time.sleep(0.05 if result.killed_host is None else 0.25)
            self._poll_events(client.redis, client)
            if live is not None:
                live.update(self._render(backend, client, admin))
        finally:
            if live is not None:
                live.stop()

    def _surely_running(self, admin: PoolAdmin, host_id: str) -> bool:
        """True when the host runs a task claimed so recently that it cannot have finished
        (the shortest simulated run is SIM_MIN_S per goal or workflow step), so a kill now is
        sure to leave a lease to expire."""
        running = self.running.get(host_id)
        if not running:
            return False
        now = admin.server_time_ms()
        for task_id, dispatched_ms in running.items():
            steps = len(DEMO_WORKFLOW.steps) if self.kind_of.get(task_id) == "workflow" else 1
            if now - dispatched_ms < steps * SIM_MIN_S * 1000 - KILL_MARGIN_MS:
                return True
        return False

    def _kill(self, host_id: str, result: DemoResult) -> None:
        self.daemons[host_id].kill()
        result.tasks_on_killed_host = len(self.running.get(host_id, {}))
        result.killed_host = host_id
        result.killed_at_s = round(time.monotonic() - self.t0, 1)
        line = Text.assemble(
            (time.strftime("%H:%M:%S "), "dim"), (f"{'host_killed':<18}", "bold red"),
            f"host={host_id} SIGKILL: its leases will expire and its tasks be retried",
        )  # fmt: skip
        self.recent.append(line)
        self.incidents.append(line)
        if not (self.opt.live and self.console.is_terminal):
            self.console.print(
                f"[{time.monotonic() - self.t0:5.1f}s] killed {host_id} "
                "(SIGKILL): its leases will expire and its tasks be retried",
                highlight=False,
                soft_wrap=True,
            )

    def _summarise(self, client: Client, result: DemoResult) -> str | None:
        """Fill in the result's figures; return what went wrong, if anything."""
        tasks = client.get_many(self.task_ids)
        result.submitted = len(self.task_ids)
        result.workflow_tasks = sum(1 for t in tasks if t.kind == "workflow")
        result.goal_tasks = result.submitted - result.workflow_tasks
        result.counts = dict(Counter(t.status.value for t in tasks))
        result.retried = sum(1 for t in tasks if t.attempt > 1)
        result.lease_expiries = self.event_counts["expired"]
        result.requeued = self.event_counts["requeued"]
        result.latency_ms = latency_stats(list(self.first_dispatch_ms.values()))
        result.retry_latency_ms = latency_stats(self.retry_dispatch_ms)
        not_done = [t for t in tasks if t.status is not TaskStatus.done]
        if len(tasks) != self.opt.tasks:
            return f"{self.opt.tasks - len(tasks)} of {self.opt.tasks} tasks were not submitted"
        if not_done:
            t = not_done[0]
            return (
                f"{len(not_done)} task(s) did not end done, e.g. {t.id} "
                f"{t.status.value} ({t.failure_kind or '-'}: {t.error or '-'})"
            )
        return None

    def _cleanup(self, backend: Backend | None, r: redis.Redis | None, tmp: Path) -> None:
        stop_all(list(self.daemons.values()), grace=3.0)
        external = backend is not None and backend.kind == "external"
        if external and r is not None and not self.opt.keep_pool:
            with suppress(redis.RedisError):
                delete_pool(r, self.pool)
        if r is not None:
            r.close()
        if backend is not None:
            backend.stop()
        shutil.rmtree(tmp, ignore_errors=True)


class DemoError(Exception):
    """The demo could not complete: a one-line reason, and optional detail (a log tail)."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


def delete_pool(r: redis.Redis, pool: str) -> int:
    """Delete every key of ``pool`` (SCAN + UNLINK in batches); returns how many."""
    n = 0
    batch: list[str] = []
    for key in r.scan_iter(match=f"dq:{{{pool}}}:*", count=500):
        batch.append(key)
        if len(batch) >= 500:
            n += int(r.unlink(*batch))
            batch.clear()
    if batch:
        n += int(r.unlink(*batch))
    return n


def summary_table(result: DemoResult) -> Table:
    """The end-of-run summary as a rich table."""
    t = Table(title="deviceq demo summary", title_justify="left", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value")
    c = result.counts
    t.add_row("backend", f"{result.backend} ({result.redis_url}), pool {result.pool}")
    t.add_row(
        "tasks submitted",
        f"{result.submitted} ({result.goal_tasks} goal, {result.workflow_tasks} workflow)",
    )
    t.add_row(
        "done / failed / cancelled",
        f"{c.get('done', 0)} / {c.get('failed', 0)} / {c.get('cancelled', 0)}",
    )
    if result.killed_host:
        t.add_row(
            "host killed",
            f"{result.killed_host} (SIGKILL at {result.killed_at_s}s, "
            f"running {result.tasks_on_killed_host} task(s))",
        )
    t.add_row("lease expiries / retried tasks", f"{result.lease_expiries} / {result.retried}")

    def fmt(stats: dict[str, float | int | None]) -> str:
        if not stats.get("n"):
            return "-"
        return (
            f"p50 {stats['p50']} ms, p95 {stats['p95']} ms, max {stats['max']} ms (n={stats['n']})"
        )

    t.add_row("submit→dispatch (1st attempt)", fmt(result.latency_ms))
    t.add_row("submit→dispatch (retries)", fmt(result.retry_latency_ms))
    t.add_row("wall time", f"{result.wall_s} s")
    verdict = (
        Text("OK: every task done", style="bold green")
        if result.ok
        else Text(f"FAILED: {result.problem}", style="bold red")
    )
    t.add_row("result", verdict)
    return t
