"""Commands of the core: submit, task show/list/cancel/wait, host add, config get/set."""

from __future__ import annotations

import sys
from collections import Counter

import click
import redis
from rich.table import Table

from ..core.models import MAX_TASK_TIMEOUT, TaskStatus, validate_id
from .app import (
    Ctx,
    check_output_path,
    config,
    console_for_tables,
    echo_json,
    host,
    main,
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
    parse_role_options,
    targets,
    usage_ids,
)
from .render import fmt_ms, last_lines, print_token, task_json
from .task_files import submit_file
from .via_api import (
    cancel_via_api,
    list_via_api,
    show_via_api,
    submit_via_api,
    via_api,
    wait_via_api,
)


@main.command()
@via_api(submit_via_api)
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
    "--timeout",
    type=click.FloatRange(min=0.001, max=MAX_TASK_TIMEOUT),
    metavar="SECONDS",
    help="Longest a run may take (up to 7 days): its host stops it then and the task fails "
    "with `timeout` (not counted against the device). The host's --task-timeout, when "
    "smaller, wins.",
)
@click.option(
    "--reject-unmatched",
    is_flag=True,
    default=None,
    help="Refuse it now if no registered device could ever run it.",
)
@click.option(
    "--tenant",
    help="Who the task is for: fair_share gives tenants devices by their weights "
    "(deviceq tenant set), and a tenant's cap on devices held applies.",
)
@click.option(
    "--retry-on",
    metavar="KINDS",
    help="Failure kinds after which it is retried while attempts are left (comma list of "
    "infrastructure, runner_error, timeout, runner_failed, lease_expired; or none). "
    "Default: the pool's retry_on.",
)
@click.option(
    "--retry-backoff",
    metavar="SPEC",
    help="Delay before a retry: none, fixed:SECONDS or exponential:BASE:MAX (doubling, "
    "jittered). Default: the pool's retry_backoff.",
)
@click.option(
    "--role",
    "roles",
    multiple=True,
    metavar="NAME=DRIVER[:TAG,TAG]",
    help="A multi-device task: one device per role, all placed at once (repeatable, up to "
    "8; the first role is the leader, whose runner runs the goal once every role's device "
    "is claimed). Replaces --driver-type and --tag.",
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
    timeout: float | None,
    reject_unmatched: bool | None,
    tenant: str | None,
    retry_on: str | None,
    retry_backoff: str | None,
    roles: tuple[str, ...],
    tasks_file: str | None,
    as_json: bool,
) -> None:
    """Submit a task (a GOAL or --workflow NAME) and print its id; or, with --file, every task
    of a JSONL file (all lines validated first) and print their ids.

    \b
    Example:
      deviceq submit "open the camera" --driver-type android --tag camera --tag wifi
      deviceq submit --workflow smoke-suite --max-attempts 5 --json
      deviceq submit "run the benchmark" --timeout 600   # fails `timeout` after 10 minutes
      deviceq submit "flash the board" --retry-on infrastructure,timeout --retry-backoff fixed:30
      deviceq submit --file tasks.jsonl   # {"goal": "open settings", "tags": ["wifi"]} a line
      deviceq submit "log in on both" --role phone=android:sim --role web=browser
    """
    if tasks_file is not None:
        submit_file(ctx, tasks_file, as_json, reject_unmatched)
        return
    tag_list = [t for value in tags for t in value.split(",")]
    task_id = ctx.client.submit(
        goal,
        workflow=workflow_name,
        driver_type=driver_type,
        # the command line is where a comma list is split (the Python API refuses a bare str)
        tags=tag_list,
        priority=priority,
        max_attempts=max_attempts,
        idempotency_key=idempotency_key,
        queue_timeout=queue_timeout,
        timeout=timeout,
        reject_unmatched=reject_unmatched,
        retry_on=retry_on,
        retry_backoff=retry_backoff,
        tenant=tenant,
        roles=parse_role_options(roles) if roles else None,
    )
    for line in unknown_constraints(ctx, driver_type, sorted(set(tag_list))):
        click.echo(f"warning: {line}", err=True)  # stderr: stdout stays the id (or --json)
    if as_json:
        echo_json(task_json(ctx.client.get(task_id)))
    else:
        click.echo(task_id)


def unknown_constraints(ctx: Ctx, driver_type: str | None, tags: list[str]) -> list[str]:
    """Why no registered device could run a task of ``driver_type`` and ``tags`` (most
    likely a typo), one line per driver type or tag that no device has, naming the ones that
    exist; read from the ``caps`` hash of device profiles (one HGETALL), nothing is scanned.
    Empty when some device has them, or when the caller may not read ``caps``."""
    from ..ops.status import device_profiles

    try:
        profiles = device_profiles(ctx.admin)
    except redis.ResponseError:  # an ACL user without HGETALL on caps: no warning
        return []
    drivers = sorted({d for d, _, _ in profiles})
    out: list[str] = []
    if driver_type and driver_type not in drivers:
        out.append(
            f"no device has driver type {driver_type!r} (known: {', '.join(drivers) or 'none'})"
        )
        driver_type = None  # its tags are checked against every device
    of = [t for d, t, _ in profiles if not driver_type or d == driver_type]
    known = sorted({t for ts in of for t in ts})
    where = f"known tags of {driver_type} devices" if driver_type else "known tags"
    for tag in tags:
        if tag not in known:
            out.append(f"no device has tag {tag!r} ({where}: {', '.join(known) or 'none'})")
    return out


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


CANCELLABLE = (TaskStatus.queued, TaskStatus.assigned, TaskStatus.dispatched)


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


WAITABLE = (TaskStatus.queued, TaskStatus.assigned, TaskStatus.dispatched)


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
