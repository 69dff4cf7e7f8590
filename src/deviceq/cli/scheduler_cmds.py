"""Scheduler commands: ``scheduler run``, ``scheduler strategies``, ``explain``, ``dispatch``
(``host drain/undrain`` are in `host_cmds`)."""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING, Any

import click

from ..core.errors import ConfigError
from .app import main, scheduler
from .context import Ctx, pass_ctx
from .lazy import DurationRange, Lazy
from .render import echo_json
from .tracing_option import otel_option

if TYPE_CHECKING:
    from ..scheduler.task_scheduler import TaskScheduler

DEFAULT_METRICS_HOST = (
    "127.0.0.1"  # = deviceq.services.metrics.DEFAULT_METRICS_HOST (imported lazily)
)


@scheduler.command("run")
@click.option(
    "--strategy",
    default=Lazy("deviceq.scheduler.strategies:DEFAULT_STRATEGY"),
    show_default=True,
    help="Registered AssignmentStrategy name (see `deviceq scheduler strategies`).",
)
@click.option(
    "--once",
    is_flag=True,
    help="Take the leader lease, run one pass, exit (says so on stderr, naming the leader, "
    "when another scheduler leads and the pass was skipped).",
)
@click.option(
    "--force-pass",
    is_flag=True,
    help="Dry run, read-only: plan one pass now, leader or not, and print what it would "
    "assign (TASK -> DEVICE); writes nothing (no lease, no expiry, no assignment).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="With --force-pass: print the plan as JSON.",
)
@click.option(
    "--tick",
    type=DurationRange(min=0, min_open=True),
    default=Lazy("deviceq.scheduler.daemon:DEFAULT_TICK"),
    show_default=True,
    help="Seconds between passes when nothing wakes it (expiry).",
)
@click.option("--owner", help="Scheduler identity in the leader lease (default HOST-PID-RAND).")
@click.option(
    "--batch",
    type=click.IntRange(1, 10000),
    default=Lazy("deviceq.scheduler.task_scheduler:DEFAULT_BATCH"),
    show_default=True,
    help="Most assignments committed per pass.",
)
@click.option(
    "--plan-ahead",
    is_flag=True,
    help="Next-task hints: choose each busy device's next task ahead, so the report that frees "
    "it starts that task at once (no pass, no wake-up in between); a task submitted since "
    "waits for the device's next choice. Idle devices are still served first; a hint "
    "reserves nothing and is checked again when used. Not for multi-device tasks.",
)
@click.option(
    "--metrics-port", type=click.IntRange(1, 65535), help="Serve Prometheus metrics on this port."
)
@click.option(
    "--metrics-host",
    default=DEFAULT_METRICS_HOST,
    show_default=True,
    help="Address the metrics endpoint listens on (0.0.0.0: every interface, e.g. in a "
    "container whose port is published).",
)
@otel_option("deviceq-scheduler")
@pass_ctx
def scheduler_run(
    ctx: Ctx,
    strategy: str,
    once: bool,
    force_pass: bool,
    as_json: bool,
    tick: float,
    owner: str | None,
    batch: int,
    plan_ahead: bool,
    metrics_port: int | None,
    metrics_host: str,
) -> None:
    """Run the scheduler daemon: match queued tasks to idle devices.

    Several may run on one pool: one holds the leader lease and works, the others stand by and
    take over when it dies. One process may serve several pools (--pool a --pool b, e.g.
    pools spread over the shards of a Redis Cluster): one scheduler per pool in the process,
    each with its own connection and its own leader lease. Woken by submissions, reports and
    heartbeats; every TICK seconds it also expires overdue leases. SIGTERM stops it between
    passes and releases the lease. A wrong or missing Redis password fails at start; an
    unreachable Redis fails a --once run and is waited for (with warnings) by the daemon.
    --metrics-port serves Prometheus metrics on --metrics-host (127.0.0.1 unless told
    otherwise; one pool only). --plan-ahead also chooses each busy device's next task ahead of
    time, so the report that frees the device starts it at once (lower latency per task
    for a backlog; a task submitted since waits for the device's next choice).

    \b
    Example:
      deviceq --pool lab scheduler run --strategy priority_match
      deviceq --pool lab scheduler run --once     # one pass, e.g. from cron or a test
      deviceq --pool lab scheduler run --metrics-port 9108 --metrics-host 10.0.0.5
      deviceq --pool lab scheduler run --plan-ahead    # busy devices' next tasks ahead
      deviceq --pool lab-a --pool lab-b --pool lab-c scheduler run
      deviceq --pool lab scheduler run --force-pass   # what would it assign? (read-only)
    """
    from ..core.logs import configure
    from ..scheduler.task_scheduler import TaskScheduler

    if as_json and not force_pass:
        raise click.UsageError("--json goes with --force-pass")
    if force_pass:
        if metrics_port is not None:
            raise click.UsageError("--force-pass is a read-only dry run: no --metrics-port")
        force_pass_cmd(ctx, strategy, batch, as_json)
        return
    configure(ctx.log_format, ctx.log_level.upper())
    if len(ctx.pools) > 1:
        if metrics_port is not None:
            raise ConfigError(
                "--metrics-port serves one pool: run a scheduler per pool to get metrics"
            )
        run_many(ctx, strategy, once, tick, owner, batch, plan_ahead)
        return
    sched = TaskScheduler(
        ctx.admin, strategy=strategy, owner=owner, batch=batch, plan_ahead=plan_ahead
    )
    # before anything it serves: a SIGTERM from then on stops it cleanly (between passes)
    sched.install_signal_handlers()
    ctx.preflight(need_reachable=once)
    if metrics_port is not None:
        try:
            from ..services.metrics import serve_metrics
        except ModuleNotFoundError as exc:
            raise ConfigError(
                f"--metrics-port needs the deviceq.metrics module, which is missing ({exc})"
            ) from None
        try:
            serve_metrics(ctx.admin, metrics_port, lambda: sched.is_leader, addr=metrics_host)
        except OSError as exc:  # address in use, unknown host, not an address of this machine
            raise ConfigError(
                f"cannot serve metrics on {metrics_host}:{metrics_port}: {exc.strerror or exc}"
            ) from None
    if once:
        ctx.warn_if_unknown_pool()
    else:  # the pool's webhooks, schedules and suites, served while this process leads
        from ..producer.client import Client
        from ..services.schedules import start_firer
        from ..services.suite_watch import start_watcher
        from ..services.webhooks import start_deliverer

        start_deliverer(ctx.admin, lambda: sched.is_leader)
        start_firer(ctx.admin, lambda: sched.epoch)
        start_watcher(Client(ctx.admin.redis, ctx.admin.pool), lambda: sched.epoch)
    passes = sched.run(tick=tick, once=once)
    if once and not passes:
        say_standby(sched)


def say_standby(sched: TaskScheduler) -> None:
    """A ``--once`` run that skipped its pass because another scheduler leads: say so."""
    cur = sched.leader()
    who = f"{cur[0]} (epoch {cur[1]})" if cur else "another scheduler"
    click.echo(
        f"scheduler run --once: {who} leads pool {sched.pool!r}; this run did nothing "
        "(the leader assigns; `--force-pass` shows what a pass would assign, read-only)",
        err=True,
    )


def force_pass_cmd(ctx: Ctx, strategy: str, batch: int, as_json: bool) -> None:
    """``scheduler run --force-pass``: read the snapshot and plan as a pass would, print the
    pairs, write nothing. Expiry is not run (it writes), so leases due now are not freed."""
    from ..scheduler.task_scheduler import TaskScheduler

    ctx.warn_if_unknown_pool()
    sched = TaskScheduler(ctx.admin, strategy=strategy, owner="dry-run", batch=batch)
    base, want, heads = sched.reader.read()
    buckets, pairs, dropped = sched.plan_deep(base, want, heads)
    hosts = {d.device_id: d.host_id for d in base.devices}
    cur = sched.leader()
    plan_rows = [{"task_id": t, "device_id": d, "host_id": hosts.get(d)} for t, d in pairs]
    if as_json:
        echo_json(
            {
                "pool": ctx.pool,
                "strategy": sched.strategy_name,
                "leader": {"owner": cur[0], "epoch": cur[1]} if cur else None,
                "idle_devices": len(base.devices),
                "queued_heads": sum(len(b.heads) for b in buckets),
                "dropped": dropped,
                "would_assign": plan_rows,
            }
        )
        return
    lead = f"leader {cur[0]} (epoch {cur[1]})" if cur else "no leader"
    click.echo(
        f"dry run on pool {ctx.pool} ({sched.strategy_name}, {lead}): {len(pairs)} "
        f"assignment(s) would be made; nothing written",
        err=True,
    )
    for row in plan_rows:
        click.echo(f"{row['task_id']} -> {row['device_id']} (host {row['host_id']})")


def run_many(
    ctx: Ctx,
    strategy: str,
    once: bool,
    tick: float,
    owner: str | None,
    batch: int,
    plan_ahead: bool = False,
) -> None:
    """One `TaskScheduler` per pool of ``ctx.pools``, each in a thread of its own; SIGTERM
    stops them all. The first error (a --once run with Redis unreachable, say) is raised
    once every scheduler has stopped."""
    from ..scheduler.task_scheduler import TaskScheduler

    ctxs = [ctx.for_pool(p) for p in ctx.pools]
    scheds = [
        TaskScheduler(c.admin, strategy=strategy, owner=owner, batch=batch, plan_ahead=plan_ahead)
        for c in ctxs
    ]
    for c in ctxs:
        c.preflight(need_reachable=once)
    if not once:
        from ..producer.client import Client
        from ..services.schedules import start_firer
        from ..services.suite_watch import start_watcher
        from ..services.webhooks import start_deliverer

        for c, s in zip(ctxs, scheds, strict=True):
            start_deliverer(c.admin, lambda s=s: s.is_leader)  # type: ignore[misc]
            start_firer(c.admin, lambda s=s: s.epoch)  # type: ignore[misc]
            client = Client(c.admin.redis, c.admin.pool)
            start_watcher(client, lambda s=s: s.epoch)  # type: ignore[misc]
    errors: list[BaseException] = []

    def run(sched: TaskScheduler) -> None:
        try:
            sched.run(tick=tick, once=once)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
            for other in scheds:
                other.stop(wake=True)

    def stop_all(signum: int, frame: Any) -> None:
        for sched in scheds:
            sched.stop()

    signal.signal(signal.SIGTERM, stop_all)
    signal.signal(signal.SIGINT, stop_all)
    if not once:
        from ..core import heap

        heap.settle()
    threads = [
        threading.Thread(target=run, args=(s,), name=f"scheduler-{s.pool}", daemon=True)
        for s in scheds
    ]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.5)  # the main thread stays free for the signal handlers
    if errors:
        raise errors[0]


@scheduler.command("strategies")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def scheduler_strategies(as_json: bool) -> None:
    """List the registered assignment strategies (built-in and entry points).

    \b
    Example:
      deviceq scheduler strategies
    """
    from ..scheduler.strategies import DEFAULT_STRATEGY, registered_strategies

    names = registered_strategies()
    if as_json:
        echo_json(names)
    else:
        for n in names:
            click.echo(n + (" (default)" if n == DEFAULT_STRATEGY else ""))


@main.command("explain")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print the explanation as JSON.")
@pass_ctx
def explain_cmd(ctx: Ctx, task_id: str, as_json: bool) -> None:
    """Say why a task is not running (or where it runs / how it ended).

    For a queued task, counts the pool's devices: of its driver type, lacking its tags, and the
    matching ones by what holds them (reserved, quarantined, dead or draining host, offline,
    busy).

    \b
    Example:
      deviceq explain 3f2a9c0d1e2b4a5f
      deviceq explain 3f2a9c0d1e2b4a5f --json | jq .counts
    """
    from ..core.validation import validate_id
    from ..ops.explain import explain

    validate_id(task_id, "task id")  # bad input: one error line, before any warning
    ctx.warn_if_unknown_pool()
    exp = explain(ctx.admin, task_id)
    if as_json:
        echo_json(exp.as_dict())
        return
    click.echo(exp.text())
    if exp.counts:
        click.echo("  counts: " + " ".join(f"{k}={v}" for k, v in exp.counts.items()))


@main.command("dispatch")
@click.argument("task_id")
@click.option("--device", "device_id", required=True, help="Idle device to bind the task to.")
@click.option("--json", "as_json", is_flag=True, help="Print {task_id, device_id, lease_id}.")
@pass_ctx
def dispatch_cmd(ctx: Ctx, task_id: str, device_id: str, as_json: bool) -> None:
    """Manually bind a queued task to a named idle device (same atomic, validated commit as
    the scheduler: lease, reservation and the host's inbox). Works without a scheduler.

    \b
    Example:
      deviceq dispatch 3f2a9c0d1e2b4a5f --device pixel-7-a
    """
    from ..core.validation import validate_id

    validate_id(task_id, "task id")
    validate_id(device_id, "device id")
    ctx.warn_if_unknown_pool()
    lease = ctx.admin.dispatch(task_id, device_id)
    if as_json:
        echo_json({"task_id": task_id, "device_id": device_id, "lease_id": lease})
    else:
        click.echo(f"{task_id} assigned to {device_id} (lease {lease})")
