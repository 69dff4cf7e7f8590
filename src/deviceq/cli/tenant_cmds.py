"""Tenants: ``deviceq tenant set|list|remove``: each tenant's fair-share weight and
its cap on devices held at once. Tasks name their tenant with ``deviceq submit --tenant``."""

from __future__ import annotations

import click

from .app import main
from .context import Ctx, pass_ctx
from .render import console_for_tables, echo_json, tenant_table


@main.group()
def tenant() -> None:
    """Tenants: fair-share weights and device caps (used by --strategy fair_share)."""


@tenant.command("set")
@click.argument("name")
@click.option(
    "--weight",
    type=click.IntRange(1, 1000),
    default=1,
    show_default=True,
    help="Share of contended devices relative to other tenants (3 gets three devices for "
    "every one a tenant of weight 1 gets, while both have work waiting).",
)
@click.option(
    "--max-devices",
    type=click.IntRange(0, 1_000_000),
    default=0,
    show_default=True,
    help="Most devices the tenant's tasks may hold at once (0 = no cap). Enforced when a task "
    "is assigned, whatever the strategy.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the tenant as JSON.")
@pass_ctx
def tenant_set(ctx: Ctx, name: str, weight: int, max_devices: int, as_json: bool) -> None:
    """Set a tenant's weight and device cap (replacing earlier values).

    \b
    Example:
      deviceq tenant set team-a --weight 3
      deviceq tenant set team-b --weight 1 --max-devices 4
    """
    t = ctx.admin.set_tenant(name, weight=weight, max_devices=max_devices)
    if as_json:
        echo_json(t.as_dict())
    else:
        cap = f", at most {t.max_devices} device(s)" if t.max_devices else ", no device cap"
        click.echo(f"tenant {t.tenant}: weight {t.weight}{cap} (holds {t.held} now)")


@tenant.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_ctx
def tenant_list(ctx: Ctx, as_json: bool) -> None:
    """List tenants: weight, cap, devices held now and tasks queued.

    \b
    Example:
      deviceq tenant list --json
    """
    from ..ops import status as st
    from ..ops.status import tenant_summary

    ctx.warn_if_unknown_pool()
    rows = tenant_summary(ctx.admin, st.pool_queues(ctx.admin))
    if as_json:
        echo_json(rows)
    elif not rows:
        click.echo("no tenants (set one with: deviceq tenant set NAME --weight W)")
    else:
        console_for_tables().print(tenant_table(rows))


@tenant.command("remove")
@click.argument("name")
@pass_ctx
def tenant_remove(ctx: Ctx, name: str) -> None:
    """Forget a tenant's weight and cap (its tasks then weigh 1, uncapped).

    \b
    Example:
      deviceq tenant remove team-b
    """
    if ctx.admin.remove_tenant(name):
        click.echo(f"tenant {name}: removed (weight 1, no cap)")
    else:
        raise click.ClickException(f"tenant {name} has no weight or cap set")
