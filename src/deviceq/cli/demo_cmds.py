"""``deviceq demo``: a self-contained fleet (scheduler, two hosts, a killed host, live view)."""

from __future__ import annotations

import sys

import click
from click.core import ParameterSource

from .app import main
from .context import Ctx
from .lazy import DurationRange, LazyChoice, resolve
from .render import echo_json


@main.command()
@click.option(
    "--redis-url",
    "demo_redis_url",
    default=None,
    help="Run against this Redis (in a fresh pool, deleted afterwards) instead of an embedded "
    "one. The global --redis-url (deviceq --redis-url URL demo) does the same; "
    "DEVICEQ_REDIS_URL is not used.",
)
@click.option(
    "--embedded",
    type=LazyChoice(lambda: resolve("deviceq.ops.demo.scenario:EMBEDDED_CHOICES")),
    default="auto",
    show_default=True,
    envvar="DEVICEQ_DEMO_EMBEDDED",
    help="Embedded Redis: a private redis-server if installed (auto), or force one of them "
    "(env DEVICEQ_DEMO_EMBEDDED).",
)
@click.option(
    "--tasks",
    type=click.IntRange(1, 2000),
    default=40,
    show_default=True,
    help="How many tasks to submit (every 4th is a workflow task).",
)
@click.option(
    "--duration",
    type=DurationRange(min=2, max=300),
    default=20.0,
    show_default=True,
    help="Seconds of the scenario: tasks are submitted over the first half, a host "
    "is killed at about a third.",
)
@click.option("--no-live", is_flag=True, help="Print progress lines instead of the live view.")
@click.option(
    "--keep-pool", is_flag=True, help="With --redis-url: keep the demo pool's keys for inspection."
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the summary as JSON on stdout (progress goes to stderr).",
)
@click.pass_context
def demo(
    ctx: click.Context,
    demo_redis_url: str | None,
    embedded: str,
    tasks: int,
    duration: float,
    no_live: bool,
    keep_pool: bool,
    as_json: bool,
) -> None:
    """Run a whole fleet on this machine (about 15 s) and summarise it.

    Starts a private redis-server on a free port (or an in-process fakeredis server when
    redis-server is not installed), a scheduler and two hosts with simulated devices as real
    `deviceq` processes, submits goal and workflow tasks, SIGKILLs one host mid-way so that
    lease expiry and retry happen, and prints done/failed/retried counts and submit→dispatch
    latency, then what to try next. Stops every process and removes every file it made. Exit
    0 when every task ended done, 1 otherwise.

    \b
    Example:
      deviceq demo
      deviceq demo --tasks 100 --duration 30 --no-live
      deviceq demo --redis-url redis://localhost:6379/0 --json
    """
    from rich.console import Console

    from ..ops.demo import Demo, DemoOptions, next_steps, summary_table

    console = Console(stderr=as_json)
    demo_redis_url = demo_redis_url or _global_redis_url(ctx)
    options = DemoOptions(
        redis_url=demo_redis_url,
        embedded=embedded,
        tasks=tasks,
        duration=duration,
        live=not no_live and not as_json,
        keep_pool=keep_pool,
    )
    result = Demo(options, console).run()
    if as_json:
        echo_json(result.as_dict())
    else:
        console.print(summary_table(result))
    if result.ok:
        for line in next_steps(result, kept_pool=keep_pool):
            console.print(line, highlight=False, soft_wrap=True)
    if not result.ok:
        if result.detail:
            click.echo(result.detail, err=True)
        click.echo(f"error: demo failed: {result.problem}", err=True)
    sys.exit(0 if result.ok else 1)


def _global_redis_url(ctx: click.Context) -> str | None:
    """The root's ``--redis-url`` when typed on the command line (``deviceq --redis-url URL
    demo``): the demo runs against it as with its own option (TLS options applied). Its
    default and ``DEVICEQ_REDIS_URL`` are not used: the demo brings its own Redis."""
    root = ctx.find_root()
    if root.get_parameter_source("redis_url") is not ParameterSource.COMMANDLINE:
        return None
    obj = ctx.find_object(Ctx)
    return obj.redis_url if obj is not None else None
