"""The ``deviceq task`` group's core: show, list, cancel, wait, retry (``submit`` is in
`submit_cmds`; ``task logs``, ``task artifacts`` and ``task set-priority`` have modules of
their own)."""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import replace

import click

from ..core.errors import InvalidInput, NotFound
from ..core.vocabulary import LEASED_STATUSES
from .app import task
from .context import Ctx, actor, pass_ctx
from .lazy import DurationRange
from .options import (
    LIMIT_OPTION,
    YES_OPTION,
    TaskFilterArgs,
    build_filter,
    filter_options,
    targets,
    usage_ids,
)
from .render import console_for_tables, echo_json, progress_line, task_json, task_text, visible
from .via_api import (
    cancel_via_api,
    list_via_api,
    retry_via_api,
    show_via_api,
    via_api,
    wait_via_api,
)


@task.command("show")
@via_api(show_via_api)
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@click.option("--raw", is_flag=True,
              help="Print the result and error as they are, terminal control sequences "
              "included (by default they are shown as escapes: \\e[31m, \\r).")  # fmt: skip
@pass_ctx
def task_show(ctx: Ctx, task_id: str, as_json: bool, raw: bool) -> None:
    """Show every field of a task and its attempt history (control characters shown as
    escapes unless --raw).

    \b
    Example:
      deviceq task show 3f2a9c0d1e2b4a5f --json
    """
    from ..core.task_record import read_task
    from ..core.task_record import task_json as stored_json
    from ..core.validation import validate_id

    validate_id(task_id, "task id")  # bad input: one error line, before any warning
    ctx.warn_if_unknown_pool()
    conn = ctx.reader  # a plain task is printed from its keys, without building the models
    found = read_task(conn.redis, conn.keys, task_id)
    if found is None:
        raise NotFound(f"no task {task_id} in pool {conn.pool}")
    data = stored_json(*found)
    if data is None:  # a multi-device task: its parts are read through the client
        data = task_json(ctx.client.get(task_id))
    if as_json:
        echo_json(data)
    else:
        click.echo(task_text(data) if raw else visible(task_text(data)))


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
    filters: TaskFilterArgs,
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

    usage_ids(device_id=device_id, host_id=filters.host_id)
    ctx.warn_if_unknown_pool()
    plain = since is None and device_id is None
    if plain and not filters.given():
        tasks = ctx.client.list(None, limit=limit)
    elif plain and len(filters.statuses) == 1 and not replace(filters, statuses=()).given():
        tasks = ctx.client.list(filters.statuses[0], limit=limit)
    else:
        flt = build_filter(ctx, filters, since=since, device_id=device_id)
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
    shown = any(t.progress for t in tasks)  # (a progress column when any task has one)
    cols = ("status", "goal/workflow", "constraints", "attempt", "device")
    for col in (*cols, *(("progress",) if shown else ()), "failure"):
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
            *((progress_line(t.progress)[:cut],) if shown else ()),
            t.failure_kind.value if t.failure_kind else "-",
        )
    con.print(table)


CANCELLABLE = ("queued", *LEASED_STATUSES)


def _text_option(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A text option's value, refused (exit 2) unless it is UTF-8 text."""
    from ..core.errors import InvalidInput
    from ..core.validation import check_text

    try:
        return check_text(value, f"--{(param.name or 'value').replace('_', '-')}")
    except InvalidInput as exc:
        raise click.BadParameter(str(exc)) from None


@task.command("cancel")
@via_api(cancel_via_api)
@click.argument("task_ids", nargs=-1, metavar="[TASK_ID]...")
@click.option("--reason", default="cancelled by user", show_default=True, callback=_text_option)
@filter_options
@YES_OPTION
@LIMIT_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print {task_id: answer} as JSON.")
@pass_ctx
def task_cancel(
    ctx: Ctx,
    task_ids: tuple[str, ...],
    reason: str,
    filters: TaskFilterArgs,
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
    by = actor()  # checked before anything is asked or changed
    ids, flt = targets(
        ctx,
        task_ids,
        filters,
        allowed=CANCELLABLE,
        done="cancelled",
        verb="cancel",
        yes=yes,
        limit=limit,
    )
    if not ids:
        if as_json:
            echo_json({})
        return
    answers = ctx.client.cancel_many(ids, reason, by)
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
@click.option(
    "--timeout",
    type=DurationRange(min=0),
    default=None,
    help="Give up after DURATION (90, 90s, 5m; exit 124).",
)
@filter_options
@YES_OPTION
@LIMIT_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the finished task(s) as JSON.")
@pass_ctx
def task_wait(
    ctx: Ctx,
    task_ids: tuple[str, ...],
    timeout: float | None,
    filters: TaskFilterArgs,
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
    from ..core.vocabulary import TaskStatus

    ids, flt = targets(
        ctx,
        task_ids,
        filters,
        allowed=WAITABLE,
        done="waited for",
        verb="wait for",
        yes=yes,
        limit=limit,
    )
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
            click.echo(visible(f"{t.id} {t.status.value}{detail}"))
    sys.exit(0 if all(t.status == TaskStatus.done for t in done) else 1)


RETRYABLE = ("failed", "cancelled")


@task.command("retry")
@via_api(retry_via_api)
@click.argument("task_ids", nargs=-1, metavar="[TASK_ID]...")
@filter_options
@YES_OPTION
@LIMIT_OPTION
@click.option(
    "--rerun",
    is_flag=True,
    help="Done tasks too: run a passing task again (a new task; to check a flaky test).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print {id, retry_of, task} as JSON (a list of them for several tasks or a filter).",
)
@pass_ctx
def task_retry(
    ctx: Ctx,
    task_ids: tuple[str, ...],
    filters: TaskFilterArgs,
    yes: bool,
    limit: int,
    rerun: bool,
    as_json: bool,
) -> None:
    """Submit failed or cancelled tasks again, each as a new task with the same goal or
    workflow, constraints, priority, max_attempts, tenant and retry policy (the old task
    is not changed). Give ids, or a filter (failed and cancelled tasks; --status narrows
    it), confirmed like `task cancel`. Prints each new id and the id it came from. Every id
    is checked before any is submitted.

    \b
    Example:
      deviceq task retry 3f2a9c0d1e2b4a5f
      deviceq task retry --status failed --driver-type android --older-than 1h --yes
      deviceq task retry --rerun 3f2a9c0d1e2b4a5f      # a done task, run again
    """
    by = actor()  # checked before anything is asked or changed
    allowed = RETRYABLE + (("done",) if rerun else ())
    ids, flt = targets(
        ctx,
        task_ids,
        filters,
        allowed=allowed,
        done="retried",
        verb="retry",
        yes=yes,
        limit=limit,
    )
    if not ids:
        if as_json:
            echo_json([])
        return
    olds = {t.id: t for t in ctx.client.get_many(ids)}
    for task_id in ids:  # all checked before the first is submitted
        if task_id not in olds:
            raise NotFound(f"no task {task_id} in pool {ctx.pool}")
        if olds[task_id].status not in allowed:
            hint = " (a done task with --rerun)" if olds[task_id].status == "done" else ""
            raise InvalidInput(
                f"task {task_id} is {olds[task_id].status.value}: only failed or cancelled "
                f"tasks can be retried{hint}"
            )
    out = []
    for task_id in ids:
        old = olds[task_id]
        new_id = ctx.client.retry(task_id, rerun=rerun, by=by)
        if as_json:
            out.append(
                {
                    "id": new_id,
                    "retry_of": task_id,
                    "task": ctx.client.get(new_id).model_dump(mode="json"),
                }
            )
        else:
            kind = old.failure_kind.value if old.failure_kind else None
            why = f", {kind}" if kind and kind != old.status.value else ""
            click.echo(f"{new_id} (retry of {task_id}: {old.status.value}{why})")
    if as_json:
        echo_json(out[0] if len(ids) == 1 and flt is None else out)
