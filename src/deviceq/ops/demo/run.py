"""The demo run (`Demo`): set up the pool, start the daemons, submit the task stream, kill a
host mid-way, watch the events, summarise, and clean up whatever happens."""

from __future__ import annotations

import math
import os
import secrets
import shutil
import tempfile
import time
from collections import Counter, deque
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ...core.events import Event, last_event_id, read_events
from ...core.redis_urls import redact_url
from ...core.vocabulary import TaskStatus
from ...producer.client import Client
from ..admin import PoolAdmin
from .backend import Backend, start_backend
from .daemons import (
    Daemon,
    _terminate_as_interrupt,
    deviceq_argv,
    host_argv,
    scheduler_argv,
    stop_all,
)
from .live import event_line, progress_line, render
from .scenario import (
    DEMO_CONFIG,
    DEMO_GOALS,
    DEMO_HOSTS,
    DEMO_WORKFLOW,
    INCIDENTS,
    KILL_MARGIN_MS,
    KILLED_HOST,
    SIM_MIN_S,
    WORKFLOW_EVERY,
    DemoResult,
    latency_stats,
)

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
                        live.update(render(self, backend, client, admin))
                    else:
                        self.console.print(
                            progress_line(self, client), highlight=False, soft_wrap=True
                        )
                time.sleep(0.05 if result.killed_host is None else 0.25)
            self._poll_events(client.redis, client)
            if live is not None:
                live.update(render(self, backend, client, admin))
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


def next_steps(result: DemoResult, kept_pool: bool = False) -> list[str]:
    """Three lines on what to try after a demo: the same fleet by hand on a Redis of one's
    own, and where to look next."""
    if result.backend != "external":
        first = (
            "Next: the demo on a Redis of your own: deviceq demo --redis-url "
            "redis://localhost:6379/0 --keep-pool (its pool is kept for redis-cli)"
        )
    elif kept_pool:
        first = f"Next: deviceq --redis-url URL --pool {result.pool} status shows the pool kept"
    else:
        first = "Next: --keep-pool keeps the demo's pool (deviceq --pool POOL status, redis-cli)"
    return [
        first,
        "  A fleet of your own: deviceq host add lab-1 -o lab-1.token; deviceq scheduler run & "
        "deviceq host run --host-id lab-1 --token-file lab-1.token --device phone-1:android "
        "--goal-runner sim &",
        "  then: deviceq submit 'open settings' --driver-type android; deviceq status "
        '(docs/getting-started.md, "A host and its first task")',
    ]
