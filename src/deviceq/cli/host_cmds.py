"""The ``deviceq host`` group but ``host run`` (in `host_run_cmds`): add (prints a token),
list, drain, undrain, remove, rotate-token."""

from __future__ import annotations

import click

from .app import host
from .context import Ctx, actor, pass_ctx
from .files import check_output_path, output_option
from .render import console_for_tables, echo_json, fmt_age, fmt_ms, print_token


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


@host.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON (never includes tokens).")
@pass_ctx
def host_list(ctx: Ctx, as_json: bool) -> None:
    """List hosts: alive (heartbeat within host_timeout), draining, last heartbeat, devices.

    \b
    Example:
      deviceq host list --json
    """
    from rich.table import Table

    from ..ops import status as st

    ctx.warn_if_unknown_pool()
    now = ctx.admin.server_time_ms()
    hosts = [st.host_json(h, now) for h in ctx.admin.hosts()]
    if as_json:
        echo_json(hosts)
        return
    table = Table()
    for col in ("host", "alive", "draining", "last heartbeat", "devices"):
        table.add_column(col)
    for x in hosts:
        table.add_row(
            x["host_id"],
            "[green]yes[/]" if x["alive"] else "[bold red]no[/]",
            "[yellow]yes[/]" if x["draining"] else "no",
            f"{fmt_ms(x['last_heartbeat'])} ({fmt_age(x['heartbeat_age_ms'])} ago)"
            if x["last_heartbeat"]
            else "never",
            ", ".join(x["devices"]) or "-",
        )
    console_for_tables().print(table)


@host.command("remove")
@click.argument("host_id")
@click.option(
    "--force",
    is_flag=True,
    help="Hand back the tasks its devices run (no attempt spent: they are queued again) "
    "and remove it anyway.",
)
@pass_ctx
def host_remove(ctx: Ctx, host_id: str, force: bool) -> None:
    """Delete a host, its token and its devices. Refused while one of its devices runs a task
    (drain it first and let the work finish) unless --force.

    \b
    Example:
      deviceq host drain lab-1 && deviceq host remove lab-1
      deviceq host remove lab-1 --force    # its running tasks go back to the queue
    """
    from ..core.validation import validate_id

    validate_id(host_id, "host id")
    ctx.warn_if_unknown_pool()
    n = ctx.admin.remove_host(host_id, force=force)
    click.echo(f"removed host {host_id} and {n} device(s)")


@host.command("rotate-token")
@click.argument("host_id")
@click.option("--json", "as_json", is_flag=True, help="Print {host_id, token} as JSON.")
@output_option("the new token")
@pass_ctx
def host_rotate_token(ctx: Ctx, host_id: str, as_json: bool, output: str | None) -> None:
    """Give a host a new secret token and print it once; the old token stops working at once
    (restart the host's daemon with the new one).

    \b
    Example:
      deviceq host rotate-token lab-1 -o lab-1.token   # replaced only if it succeeds
    """
    if output is not None:
        check_output_path(output)
    print_token(host_id, ctx.admin.rotate_token(host_id), as_json, output)


@host.command("drain")
@click.argument("host_id")
@pass_ctx
def host_drain(ctx: Ctx, host_id: str) -> None:
    """Stop new assignments to a host; work already assigned or running continues.

    \b
    Example:
      deviceq host drain lab-1
    """
    from ..core.validation import validate_id

    validate_id(host_id, "host id")
    ctx.warn_if_unknown_pool()
    state = ctx.admin.drain(host_id, True, actor())
    click.echo(f"{host_id} {state}")


@host.command("undrain")
@click.argument("host_id")
@pass_ctx
def host_undrain(ctx: Ctx, host_id: str) -> None:
    """Resume new assignments to a drained host (wakes the scheduler).

    \b
    Example:
      deviceq host undrain lab-1
    """
    from ..core.validation import validate_id

    validate_id(host_id, "host id")
    ctx.warn_if_unknown_pool()
    state = ctx.admin.drain(host_id, False, actor())
    click.echo(f"{host_id} {state}")
