"""``deviceq limit list``: the pool's declared limits on leases held at once (each limit's
bound is a pool setting, ``deviceq config set``, or a tenant's ``max_devices``)."""

from __future__ import annotations

import click

from .app import main
from .context import Ctx, pass_ctx
from .render import echo_json


@main.group()
def limit() -> None:
    """Limits on leases held at once: per host, per tenant, per tenant on a host."""


@limit.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_ctx
def limit_list(ctx: Ctx, as_json: bool) -> None:
    """List each declared limit: its name, scope, the setting holding its bound, the bound
    set now (0 = none) and the highest counts it holds.

    \b
    Example:
      deviceq config set max_tasks_per_host 2
      deviceq limit list
    """
    from ..ops.limits import limit_summary

    ctx.warn_if_unknown_pool()
    rows = limit_summary(ctx.admin)
    if as_json:
        echo_json(rows)
        return
    for row in rows:
        where = row["setting"] or "each tenant's max_devices (deviceq tenant set)"
        bound = "per tenant" if row["bound"] is None else (row["bound"] or "none")
        click.echo(
            f"{row['name']}: by {' x '.join(row['scope'])}; bound {bound} ({where}); "
            f"{row['held']} lease(s) counted"
        )
        for top in row["highest"]:
            at = ", ".join(f"{k} {v}" for k, v in top["key"].items())
            cap = f" of {top['bound']}" if top["bound"] else ""
            click.echo(f"  {at}: {top['held']}{cap}")
