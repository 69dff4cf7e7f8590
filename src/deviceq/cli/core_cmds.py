"""Commands of the core: task show/list/cancel/wait, host add, config get/set (``submit`` is
in `submit_cmds`)."""

from __future__ import annotations

import sys
from collections import Counter

import click

from ..core.vocabulary import LEASED_STATUSES
from .app import (
    Ctx,
    check_output_path,
    config,
    console_for_tables,
    echo_json,
    host,
    output_option,
    pass_ctx,
    task,
)
from .options import (
    LIMIT_OPTION,
    YES_OPTION,
    build_filter,
    filter_given,
    filter_options,
    targets,
    usage_ids,
)
from .render import fmt_ms, last_lines, print_token, task_json
from .via_api import (
    cancel_via_api,
    list_via_api,
    show_via_api,
    via_api,
    wait_via_api,
)


@task.command("show")
@via_api(show_via_api)
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_ctx
def task_show(ctx: Ctx, task_id: str, as_json: bool) -> None:
    """Show every field of a task and its attempt history.

    \b
    Example:
      deviceq task show 3f2a9c0d1e2b4a5f --json
    """
    from rich.table import Table

    from ..core.models import validate_id

    validate_id(task_id, "task id")  # bad input: one error line, before any warning
    ctx.warn_if_unknown_pool()
    t = ctx.client.get(task_id)
    if as_json:
        echo_json(task_json(t))
        return
    console = console_for_tables()
    grid = Table.grid(padding=(0, 2))
    hide = {"attempts", "roles"} | (set() if t.gang else {"gang", "role", "leader"})
    for name, value in t.model_dump(mode="json", exclude=hide).items():
        if name.endswith("_at") or name in ("lease_expires_at", "queue_deadline"):
            value = fmt_ms(value)
        if name in ("result", "error") and value:
            value, before = last_lines(str(value))
            if before:
                value = f"({before} earlier lines not shown)\n{value}"
        grid.add_row(f"[bold]{name}[/]", "-" if value in (None, "", []) else str(value))
    console.print(grid)
    if t.attempt:
        console.print(f"the whole output: deviceq task logs {t.id}", markup=False)
    if t.roles:
        roles = Table(title="roles")
        for col in ("role", "driver_type", "tags", "device", "host", "status"):
            roles.add_column(col)
        for name, r in t.roles.items():
            roles.add_row(
                name + (" (leader)" if name == next(iter(t.roles)) else ""),
                r.driver_type or "any",
                ",".join(r.tags) or "-",
                r.device_id or "-",
                r.host_id or "-",
                r.status or "-",
            )
        console.print(roles)
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
@via_api(list_via_api)
@filter_options
@click.option(
    "--since",
    metavar="WHEN",
    help="Only tasks submitted since WHEN: a duration ago (10m, 2h, 1d) or an ISO time "
    "(2026-12-01T08:00:00Z).",
)
@click.option(
    "--device",
    "device_id",
    help="Only tasks assigned to (or last run on) this device (combines with the other "
    "filters; see also device show's recent attempts).",
)
@click.option("--limit", type=click.IntRange(1, 10000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_ctx
def task_list(
    ctx: Ctx,
    statuses: tuple[str, ...],
    driver_type: str | None,
    tags: tuple[str, ...],
    host_id: str | None,
    tenant: str | None,
    older_than: str | None,
    since: str | None,
    device_id: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List tasks: queued/active oldest first, finished newest first. Filters read the
    status indexes page by page (bounded), never the whole keyspace.

    \b
    Example:
      deviceq task list --status queued --limit 20
      deviceq task list --host lab-1 --since 1h
      deviceq task list --device pixel-7 --status failed
      deviceq task list --status failed --driver-type android --older-than 1d --json
    """
    from rich.table import Table

    usage_ids(device_id=device_id, host_id=host_id)
    ctx.warn_if_unknown_pool()
    if (
        since is None
        and device_id is None
        and not filter_given(statuses, driver_type, tags, host_id, tenant, older_than)
    ):
        tasks = ctx.client.list(None, limit=limit)
    elif (
        since is None
        and device_id is None
        and len(statuses) == 1
        and not (driver_type or tags or host_id or tenant or older_than)
    ):
        tasks = ctx.client.list(statuses[0], limit=limit)
    else:
        flt = build_filter(
            ctx, statuses, driver_type, tags, host_id, tenant, older_than, since=since,
            device_id=device_id,
        )  # fmt: skip
        res = ctx.client.find(flt, limit=limit)
        if res.truncated:
            click.echo(
                f"warning: stopped after examining {res.examined} index entries; more tasks "
                "may match",
                err=True,
            )
        tasks = res.tasks
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


CANCELLABLE = ("queued", *LEASED_STATUSES)


@task.command("cancel")
@via_api(cancel_via_api)
@click.argument("task_ids", nargs=-1, metavar="[TASK_ID]...")
@click.option("--reason", default="cancelled by user", show_default=True)
@filter_options
@YES_OPTION
@LIMIT_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print {task_id: answer} as JSON.")
@pass_ctx
def task_cancel(
    ctx: Ctx,
    task_ids: tuple[str, ...],
    reason: str,
    statuses: tuple[str, ...],
    driver_type: str | None,
    tags: tuple[str, ...],
    host_id: str | None,
    tenant: str | None,
    older_than: str | None,
    yes: bool,
    limit: int,
    as_json: bool,
) -> None:
    """Cancel tasks: queued/assigned ones at once, running ones via their host. Give ids, or
    a filter (queued, assigned and dispatched tasks; --status narrows it): the matching
    count is shown and confirmed first (--yes skips the question; required when stdin is
    not a terminal).

    \b
    Example:
      deviceq task cancel 3f2a9c0d1e2b4a5f 9b1c2d3e4f5a6b7c
      deviceq task cancel --status queued --driver-type android --older-than 2h --yes
    """
    ids, flt = targets(ctx, task_ids, statuses, driver_type, tags, host_id, tenant, older_than,
                       allowed=CANCELLABLE, done="cancelled", verb="cancel",
                       yes=yes, limit=limit)  # fmt: skip
    if not ids:
        if as_json:
            echo_json({})
        return
    answers = ctx.client.cancel_many(ids, reason)
    if as_json:
        echo_json(answers)
        return
    messages = {
        "cancelled": "{} cancelled",
        "requested": "{} is running: cancel requested, its host will stop it",
    }
    for task_id, res in answers.items():
        default = f"{{}} already {res.split(':', 1)[-1]}: nothing to do"
        click.echo(messages.get(res, default).format(task_id))
    if len(answers) > 1:
        n = Counter("already" if a.startswith("already") else a for a in answers.values())
        click.echo(
            f"{n['cancelled']} cancelled, {n['requested']} cancel requested, "
            f"{n['already']} already finished",
            err=True,
        )


WAITABLE = ("queued", *LEASED_STATUSES)


@task.command("wait")
@via_api(wait_via_api)
@click.argument("task_ids", nargs=-1, metavar="[TASK_ID]...")
@click.option("--timeout", type=float, default=None, help="Give up after SECONDS (exit 124).")
@filter_options
@YES_OPTION
@LIMIT_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the finished task(s) as JSON.")
@pass_ctx
def task_wait(
    ctx: Ctx,
    task_ids: tuple[str, ...],
    timeout: float | None,
    statuses: tuple[str, ...],
    driver_type: str | None,
    tags: tuple[str, ...],
    host_id: str | None,
    tenant: str | None,
    older_than: str | None,
    yes: bool,
    limit: int,
    as_json: bool,
) -> None:
    """Block until tasks finish: one, several ids, or the unfinished tasks a filter selects
    (confirmed like `task cancel`). Exit 0 when all are done, 1 when one failed or was
    cancelled, 124 on timeout. Prints a line per task (a JSON object for one id, a list
    otherwise, with --json).

    \b
    Example:
      deviceq task wait 3f2a9c0d1e2b4a5f --timeout 300 && echo passed
      deviceq task wait 3f2a9c0d1e2b4a5f 9b1c2d3e4f5a6b7c --timeout 600
      deviceq task wait --tag nightly --yes
    """
    from ..core.models import TaskStatus

    ids, flt = targets(ctx, task_ids, statuses, driver_type, tags, host_id, tenant, older_than,
                       allowed=WAITABLE, done="waited for", verb="wait for",
                       yes=yes, limit=limit)  # fmt: skip
    if not ids:
        if as_json:
            echo_json([])
        return
    try:
        if len(ids) == 1 and flt is None:
            done = [ctx.client.wait(ids[0], timeout=timeout)]
        else:
            done = ctx.client.wait_many(ids, timeout=timeout)
    except TimeoutError as exc:
        click.echo(f"error: timed out: {exc}", err=True)
        sys.exit(124)
    if as_json:
        echo_json(task_json(done[0]) if len(ids) == 1 and flt is None else
                  [task_json(t) for t in done])  # fmt: skip
    else:
        for t in done:
            detail = f" ({t.failure_kind.value}: {t.error})" if t.failure_kind else ""
            click.echo(f"{t.id} {t.status.value}{detail}")
    sys.exit(0 if all(t.status == TaskStatus.done for t in done) else 1)


@host.command("add")
@click.argument("host_id")
@click.option("--json", "as_json", is_flag=True, help="Print {host_id, token} as JSON.")
@output_option("the token")
@pass_ctx
def host_add(ctx: Ctx, host_id: str, as_json: bool, output: str | None) -> None:
    """Create a host and print its secret token once (only a digest is stored).

    \b
    Example:
      deviceq host add lab-1 -o lab-1.token     # no file at all if it fails
      deviceq host add lab-1 --pool lab --redis-url redis://redis.lab:6379/0
    """
    if output is not None:
        check_output_path(output)
    print_token(host_id, ctx.admin.add_host(host_id), as_json, output)


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


@config.command("set", context_settings={"ignore_unknown_options": True})  # VALUE may be -1
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
