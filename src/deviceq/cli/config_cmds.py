"""The ``deviceq config`` group: get and set pool settings."""

from __future__ import annotations

import click

from .app import config
from .context import Ctx, pass_ctx
from .render import echo_json


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
