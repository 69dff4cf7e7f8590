"""``deviceq pause`` / ``deviceq resume``: stop and restart new assignments in the whole pool."""

from __future__ import annotations

import click

from .app import main
from .context import Ctx, actor, pass_ctx


@main.command()
@click.option("--reason", default="", help="Why (at most 200 bytes; shown by status).")
@pass_ctx
def pause(ctx: Ctx, reason: str) -> None:
    """Pause the pool: nothing new is assigned until `deviceq resume`. Running tasks go on
    and report; leases still expire and failed attempts are still retried (they wait queued);
    a manual `deviceq dispatch` still works.

    \b
    Example:
      deviceq pause --reason "lab power work until 14:00"
    """
    ctx.warn_if_unknown_pool()
    done = ctx.admin.pause(reason, actor())
    if done == "unchanged":
        click.echo(f"pool {ctx.pool} was already paused")
    else:
        click.echo(f"pool {ctx.pool} paused: nothing new is assigned (deviceq resume)")


@main.command()
@pass_ctx
def resume(ctx: Ctx) -> None:
    """Resume a paused pool: the scheduler assigns again at once.

    \b
    Example:
      deviceq resume
    """
    done = ctx.admin.resume(actor())
    if done == "unchanged":
        click.echo(f"pool {ctx.pool} was not paused")
    else:
        click.echo(f"pool {ctx.pool} resumed")
