"""``deviceq status``: the pool at a glance, once or live (what it shows is in
`status_view`)."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from .app import main
from .context import Ctx, pass_ctx
from .lazy import DurationRange
from .render import console_for_tables, echo_json
from .status_view import render_all_pools, render_status


@main.command("status")
@click.option("--watch", is_flag=True, help="Keep refreshing until Ctrl-C.")
@click.option(
    "--interval",
    type=DurationRange(min=0.1),
    default=2.0,
    show_default=True,
    help="Seconds between refreshes with --watch.",
)
@click.option(
    "--count",
    type=click.IntRange(min=1),
    default=None,
    help="With --watch, stop after this many refreshes.",
)
@click.option(
    "--leases",
    "n_leases",
    type=click.IntRange(0, 1000),
    default=10,
    show_default=True,
    help="How many soonest-expiring leases to show.",
)
@click.option(
    "--failures",
    "n_failures",
    type=click.IntRange(0, 1000),
    default=10,
    show_default=True,
    help="How many recent failures to show.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print as JSON (with --watch: one JSON document per line).",
)
@click.option(
    "--all-pools",
    is_flag=True,
    help="One line per pool of the server (every shard of a Redis Cluster): tasks by status, "
    "hosts alive, devices, leader, the node serving it.",
)
@pass_ctx
def status_cmd(
    ctx: Ctx,
    watch: bool,
    interval: float,
    count: int | None,
    n_leases: int,
    n_failures: int,
    as_json: bool,
    all_pools: bool,
) -> None:
    """Show the pool at a glance: queue depth by constraints (flagging tasks no registered
    device could run), devices by state, hosts and their last heartbeat, leases about to
    expire, recent failures and the scheduler leader. --all-pools: every pool in a line.

    \b
    Example:
      deviceq status
      deviceq status --watch --interval 1
      deviceq status --json | jq '.queues[] | select(.unmatchable)'
      deviceq status --all-pools
    """
    from rich.console import Console
    from rich.live import Live

    from ..ops import status as st

    if not all_pools:
        ctx.warn_if_unknown_pool()
    if all_pools:
        from ..core.connection import connect
        from ..ops.pools import all_pools_status

        r = connect(ctx.redis_url)
        render: Any = render_all_pools

        def snapshot() -> dict[str, Any]:
            return all_pools_status(r)
    else:
        render = render_status

        def snapshot() -> dict[str, Any]:
            return st.pool_status(ctx.admin, leases=n_leases, failures=n_failures)

    if not watch:
        data = snapshot()
        if as_json:
            echo_json(data)
        else:
            console_for_tables().print(render(data))
        return
    shown = 0
    try:
        if as_json:
            while count is None or shown < count:
                if shown:
                    time.sleep(interval)
                click.echo(json.dumps(snapshot(), sort_keys=True, default=str))
                shown += 1
            return
        with Live(render(snapshot()), auto_refresh=False, console=Console()) as live:
            shown = 1
            while count is None or shown < count:
                time.sleep(interval)
                live.update(render(snapshot()), refresh=True)
                shown += 1
    except KeyboardInterrupt:
        return
