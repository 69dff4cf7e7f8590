"""Priority classes: ``deviceq priority-class add|list|remove``. Tasks name one with
``deviceq submit --class NAME``; a class that preempts takes devices from running tasks of a
lower, preemptible class when no idle device matches its task."""

from __future__ import annotations

import click

from ..core.errors import InvalidInput
from .app import main
from .context import Ctx, pass_ctx
from .render import echo_json


@main.group("priority-class")
def priority_class() -> None:
    """Priority classes: a named priority, and who may preempt whom.

    \b
    A task submitted with --class NAME gets the class's priority (0-9). When a task of a
    class that --preempts matches no idle device, the scheduler stops the shortest-running
    task of a strictly lower priority and a preemptible class on a matching device (its
    host stops the run with its runner's stop signal, then kills it after the class's
    --grace), queues that task again at its original place without using up an attempt,
    and gives the device to the urgent task once the run has stopped. A task without a class
    neither preempts nor is preempted.
    """


@priority_class.command("add")
@click.argument("name")
@click.option(
    "--priority",
    type=click.IntRange(0, 9),
    required=True,
    help="The priority its tasks get (0-9, higher first under priority strategies).",
)
@click.option(
    "--preempts",
    is_flag=True,
    help="Its tasks may preempt running tasks of a strictly lower priority when no idle "
    "device matches them.",
)
@click.option(
    "--preemptible/--not-preemptible",
    default=True,
    show_default=True,
    help="Whether its running tasks may be preempted by tasks of a higher class.",
)
@click.option(
    "--grace",
    type=click.FloatRange(0, 3600),
    default=30.0,
    show_default=True,
    help="Seconds a preempted run of this class gets after its runner's stop signal (e.g. "
    "SIGTERM for a command) before it is killed.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the class as JSON.")
@pass_ctx
def class_add(
    ctx: Ctx,
    name: str,
    priority: int,
    preempts: bool,
    preemptible: bool,
    grace: float,
    as_json: bool,
) -> None:
    """Add a priority class (or replace the one of that name).

    \b
    Example:
      deviceq priority-class add nightly --priority 1 --grace 10
      deviceq priority-class add release-blocker --priority 9 --preempts --not-preemptible
    """
    try:
        c = ctx.admin.add_priority_class(
            name, priority, preempts=preempts, preemptible=preemptible, grace=grace
        )
    except InvalidInput as exc:  # bad input: one line, exit 2, nothing written
        raise click.UsageError(str(exc)) from None
    if as_json:
        echo_json(c.as_dict())
    else:
        click.echo(
            f"priority class {c.name}: {describe(c.priority, c.preempts, c.preemptible, c.grace)}"
        )


def describe(priority: int, preempts: bool, preemptible: bool, grace: float) -> str:
    what = [f"priority {priority}"]
    what.append("preempts lower priorities" if preempts else "does not preempt")
    what.append(f"preemptible (grace {grace:g}s)" if preemptible else "not preemptible")
    return ", ".join(what)


@priority_class.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_ctx
def class_list(ctx: Ctx, as_json: bool) -> None:
    """List priority classes, highest priority first.

    \b
    Example:
      deviceq priority-class list --json
    """
    classes = ctx.admin.priority_classes()
    if as_json:
        echo_json([c.as_dict() for c in classes])
    elif not classes:
        click.echo(
            "no priority classes (add one with: deviceq priority-class add NAME --priority N)"
        )
    else:
        width = max(len(c.name) for c in classes)
        click.echo(f"{'NAME':<{width}}  PRIORITY  PREEMPTS  PREEMPTIBLE  GRACE")
        for c in classes:
            click.echo(
                f"{c.name:<{width}}  {c.priority:<8}  {'yes' if c.preempts else 'no':<8}  "
                f"{'yes' if c.preemptible else 'no':<11}  {c.grace:g}s"
            )


@priority_class.command("remove")
@click.argument("name")
@pass_ctx
def class_remove(ctx: Ctx, name: str) -> None:
    """Remove a priority class. Its tasks keep their priority; while it is missing they
    neither preempt nor are preempted.

    \b
    Example:
      deviceq priority-class remove nightly
    """
    try:
        removed = ctx.admin.remove_priority_class(name)
    except InvalidInput as exc:
        raise click.UsageError(str(exc)) from None
    if removed:
        click.echo(f"priority class {name}: removed")
    else:
        raise click.ClickException(f"no priority class {name}")
