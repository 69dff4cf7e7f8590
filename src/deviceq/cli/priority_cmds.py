"""``deviceq task set-priority``: change the priority of queued tasks."""

from __future__ import annotations

import sys

import click

from .app import task
from .context import Ctx, actor, pass_ctx, said_on_stderr
from .render import echo_json


@task.command("set-priority")
@click.argument("task_ids", nargs=-1, required=True, metavar="TASK_ID...")
@click.argument("priority", type=click.IntRange(0, 9))
@click.option("--json", "as_json", is_flag=True, help="Print {task_id: outcome} as JSON.")
@pass_ctx
def task_set_priority(ctx: Ctx, task_ids: tuple[str, ...], priority: int, as_json: bool) -> None:
    """Give queued tasks a new PRIORITY (0-9; higher runs first under priority_match). Each
    keeps its place in submission order among the tasks of its new priority. Exit 1 when a
    task could not be changed (not found, not queued, a part of a multi-device task).

    \b
    Example:
      deviceq task set-priority 3f2a9c0d1e2b4a5f 9
      deviceq task set-priority 3f2a9c0d1e2b4a5f 7d1e0b2c9a8f6e5d 0
    """
    from ..core.replies import parse
    from ..core.vocabulary import ReplyCode

    with said_on_stderr():  # (a priority the strategy in force ignores: one line)
        result = ctx.admin.set_priority(task_ids, priority, actor())
    replies = {tid: parse(r) for tid, r in result.items()}
    if as_json:
        echo_json(result)
    else:
        for tid, r in replies.items():
            if r.code is ReplyCode.ok:
                click.echo(f"{tid} priority {priority}")
            elif r.code is ReplyCode.same:
                click.echo(f"{tid} already has priority {priority}")
            else:
                click.echo(f"error: {tid}: {r.value.replace('_', ' ')}", err=True)
    changed = (ReplyCode.ok, ReplyCode.same)
    sys.exit(0 if all(r.code in changed for r in replies.values()) else 1)
