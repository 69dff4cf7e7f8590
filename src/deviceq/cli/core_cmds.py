"""Commands of the core: submit, task show/list/cancel/wait, host add, config get/set."""

from __future__ import annotations

import sys
from datetime import UTC, datetime

import click
from rich.table import Table

from ..core.models import ScheduledTask, TaskStatus
from .app import Ctx, config, console_for_tables, echo_json, host, main, pass_ctx, task


def task_json(t: ScheduledTask) -> dict[str, object]:
    return t.model_dump(mode="json")


def fmt_ms(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


@main.command()
@click.argument("goal", required=False)
@click.option("--workflow", "workflow_name", help="Run this stored workflow instead of a goal.")
@click.option("--driver-type", help="Only devices of this driver type may run it.")
@click.option(
    "--tag",
    "tags",
    multiple=True,
    help="Required device capability (repeatable; a comma list also works: --tag wifi,camera).",
)
@click.option(
    "--priority",
    type=click.IntRange(0, 9),
    default=0,
    show_default=True,
    help="Higher runs first under the priority_match strategy.",
)
@click.option("--max-attempts", type=click.IntRange(1, 1000), help="Attempts before failing.")
@click.option("--idempotency-key", help="A retried submit with the same key returns the same id.")
@click.option(
    "--queue-timeout",
    type=click.FloatRange(min=0, min_open=True),
    help="Fail as unschedulable after waiting this many seconds queued.",
)
@click.option(
    "--reject-unmatched",
    is_flag=True,
    default=None,
    help="Refuse it now if no registered device could ever run it.",
)
@click.option(
    "--file",
    "tasks_file",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Bulk: submit every task of a JSONL file (one TaskSpec object a line).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the task as JSON.")
@pass_ctx
def submit(
    ctx: Ctx,
    goal: str | None,
    workflow_name: str | None,
    driver_type: str | None,
    tags: tuple[str, ...],
    priority: int,
    max_attempts: int | None,
    idempotency_key: str | None,
    queue_timeout: float | None,
    reject_unmatched: bool | None,
    tasks_file: str | None,
    as_json: bool,
) -> None:
    """Submit a task (a GOAL or --workflow NAME) and print its id; or, with --file, every task
    of a JSONL file (all lines validated first) and print their ids.

    \b
    Example:
      deviceq submit "open the camera" --driver-type android --tag camera --tag wifi
      deviceq submit --workflow smoke-suite --max-attempts 5 --json
      deviceq submit --file tasks.jsonl   # {"goal": "open settings", "tags": ["wifi"]} a line
    """
    if tasks_file is not None:
        from .ops_cmds import submit_file

        submit_file(ctx, tasks_file, as_json, reject_unmatched)
        return
    task_id = ctx.client.submit(
        goal,
        workflow=workflow_name,
        driver_type=driver_type,
        # the command line is where a comma list is split (the Python API refuses a bare str)
        tags=[t for value in tags for t in value.split(",")],
        priority=priority,
        max_attempts=max_attempts,
        idempotency_key=idempotency_key,
        queue_timeout=queue_timeout,
        reject_unmatched=reject_unmatched,
    )
    if as_json:
        echo_json(task_json(ctx.client.get(task_id)))
    else:
        click.echo(task_id)


@task.command("show")
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_ctx
def task_show(ctx: Ctx, task_id: str, as_json: bool) -> None:
    """Show every field of a task and its attempt history.

    \b
    Example:
      deviceq task show 3f2a9c0d1e2b4a5f --json
    """
    t = ctx.client.get(task_id)
    if as_json:
        echo_json(task_json(t))
        return
    console = console_for_tables()
    grid = Table.grid(padding=(0, 2))
    for name, value in t.model_dump(mode="json", exclude={"attempts"}).items():
        if name.endswith("_at") or name in ("lease_expires_at", "queue_deadline"):
            value = fmt_ms(value)
        grid.add_row(f"[bold]{name}[/]", "-" if value in (None, "", []) else str(value))
    console.print(grid)
    if t.attempts:
        table = Table(title="attempts")
        for col in ("#", "lease", "host", "device", "assigned", "ended", "outcome", "kind"):
            table.add_column(col, no_wrap=col == "lease")
        for a in t.attempts:
            table.add_row(
                str(a.attempt),
                a.lease_id,
                a.host_id,
                a.device_id,
                fmt_ms(a.assigned_at),
                fmt_ms(a.ended_at),
                a.outcome,
                a.failure_kind or "-",
            )
        console.print(table)


@task.command("list")
@click.option(
    "--status", type=click.Choice([s.value for s in TaskStatus]), help="Only this status."
)
@click.option("--limit", type=click.IntRange(1, 10000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_ctx
def task_list(ctx: Ctx, status: str | None, limit: int, as_json: bool) -> None:
    """List tasks: queued/active oldest first, finished newest first.

    \b
    Example:
      deviceq task list --status queued --limit 20
    """
    tasks = ctx.client.list(status, limit=limit)
    if as_json:
        echo_json([task_json(t) for t in tasks])
        return
    con = console_for_tables()
    cut = 40 if con.is_terminal else None  # piped: whole goals
    table = Table()
    table.add_column("id", no_wrap=True, min_width=16)  # ids stay whole: they get copied
    for col in ("status", "goal/workflow", "constraints", "attempt", "device", "failure"):
        goal = col == "goal/workflow"
        table.add_column(col, overflow="ellipsis", no_wrap=not goal, min_width=12 if goal else None)
    for t in tasks:
        what = t.goal if t.kind == "goal" else f"workflow:{t.workflow}"
        cons = " ".join(filter(None, [t.driver_type or "", *t.tags])) or "-"
        table.add_row(
            t.id,
            t.status.value,
            (what or "")[:cut],
            cons,
            f"{t.attempt}/{t.max_attempts}",
            t.device_id or "-",
            t.failure_kind.value if t.failure_kind else "-",
        )
    con.print(table)


@task.command("cancel")
@click.argument("task_id")
@click.option("--reason", default="cancelled by user", show_default=True)
@pass_ctx
def task_cancel(ctx: Ctx, task_id: str, reason: str) -> None:
    """Cancel a task: queued/assigned ones at once, running ones via their host.

    \b
    Example:
      deviceq task cancel 3f2a9c0d1e2b4a5f
    """
    res = ctx.client.cancel(task_id, reason)
    messages = {
        "cancelled": f"{task_id} cancelled",
        "requested": f"{task_id} is running: cancel requested, its host will stop it",
    }
    click.echo(messages.get(res, f"{task_id} already {res.split(':', 1)[-1]}: nothing to do"))


@task.command("wait")
@click.argument("task_id")
@click.option("--timeout", type=float, default=None, help="Give up after SECONDS (exit 124).")
@click.option("--json", "as_json", is_flag=True, help="Print the finished task as JSON.")
@pass_ctx
def task_wait(ctx: Ctx, task_id: str, timeout: float | None, as_json: bool) -> None:
    """Block until a task finishes. Exit 0 when done, 1 when failed or cancelled, 124 on
    timeout.

    \b
    Example:
      deviceq task wait 3f2a9c0d1e2b4a5f --timeout 300 && echo passed
    """
    try:
        t = ctx.client.wait(task_id, timeout=timeout)
    except TimeoutError as exc:
        click.echo(f"error: timed out: {exc}", err=True)
        sys.exit(124)
    if as_json:
        echo_json(task_json(t))
    else:
        detail = f" ({t.failure_kind.value}: {t.error})" if t.failure_kind else ""
        click.echo(f"{t.id} {t.status.value}{detail}")
    sys.exit(0 if t.status == TaskStatus.done else 1)


@host.command("add")
@click.argument("host_id")
@click.option("--json", "as_json", is_flag=True, help="Print {host_id, token} as JSON.")
@pass_ctx
def host_add(ctx: Ctx, host_id: str, as_json: bool) -> None:
    """Create a host and print its secret token once (only a digest is stored).

    \b
    Example:
      deviceq host add lab-1 > lab-1.token
    """
    token = ctx.admin.add_host(host_id)
    if as_json:
        echo_json({"host_id": host_id, "token": token})
    else:
        click.echo(token)


@config.command("get")
@click.argument("key", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_ctx
def config_get(ctx: Ctx, key: str | None, as_json: bool) -> None:
    """Print one setting, or every setting with its value, marking those at their default.

    \b
    Example:
      deviceq config get lease_ttl
      deviceq config get            # every setting; "(default)" where the pool set none
    """
    values = ctx.admin.get_config(key)
    if as_json:
        echo_json(values)
    elif key:
        click.echo(values[key])
    else:
        stored = ctx.admin.stored_settings()
        width = max(map(len, values))
        for k, v in values.items():
            click.echo(f"{k:<{width}}  {v}" + ("" if k in stored else "  (default)"))


@config.command("set")
@click.argument("key")
@click.argument("value")
@pass_ctx
def config_set(ctx: Ctx, key: str, value: str) -> None:
    """Change a setting (validated; durations in seconds).

    \b
    Example:
      deviceq config set max_queue_depth 50000
    """
    stored = ctx.admin.set_config(key, value)
    click.echo(f"{key} {stored}")
