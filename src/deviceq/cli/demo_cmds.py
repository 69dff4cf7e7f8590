"""``deviceq demo``: a self-contained fleet (scheduler, two hosts, a killed host, live view)."""

from __future__ import annotations

import sys

import click

from .app import echo_json, main
from .lazy import LazyChoice, resolve


@main.command()
@click.option(
    "--redis-url",
    "demo_redis_url",
    default=None,
    help="Run against this Redis (in a fresh pool, deleted afterwards) instead of an embedded "
    "one. The global --redis-url is ignored by the demo.",
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
    type=click.FloatRange(2, 300),
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
def demo(
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
    latency. Stops every process and removes every file it made. Exit 0 when every task ended
    done, 1 otherwise.

    \b
    Example:
      deviceq demo
      deviceq demo --tasks 100 --duration 30 --no-live
      deviceq demo --redis-url redis://localhost:6379/0 --json
    """
    from rich.console import Console

    from ..ops.demo import Demo, DemoOptions, summary_table

    console = Console(stderr=as_json)
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
    if not result.ok:
        if result.detail:
            click.echo(result.detail, err=True)
        click.echo(f"error: demo failed: {result.problem}", err=True)
    sys.exit(0 if result.ok else 1)
