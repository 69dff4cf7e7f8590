"""Gates: ``deviceq gate add|list|remove``: hold devices out of new work while their
attributes say so (a low battery, a hot phone)."""

from __future__ import annotations

import click

from .app import main
from .context import Ctx, pass_ctx
from .options import usage_checked
from .render import console_for_tables, echo_json


@main.group()
def gate() -> None:
    """Gates: hold devices out of new work while their attributes say so."""


@gate.command("add")
@click.argument("name")
@click.option(
    "--when",
    "when",
    multiple=True,
    metavar="EXPR",
    help="Hold a device while this holds of its attributes (repeatable, and-ed; the --where "
    "language: 'battery<20', 'temperature>=45'). With --cooldown: only devices it holds of.",
)
@click.option(
    "--cooldown",
    type=int,
    default=None,
    metavar="S",
    help="Hold a device S seconds after each run on it ends, whatever its outcome (1 to 86400; "
    "no --until). The scheduler lets it go when the time is up.",
)
@click.option(
    "--until",
    "until",
    multiple=True,
    metavar="EXPR",
    help="Let a held device go only once this holds (repeatable, and-ed; e.g. 'battery>=80'). "
    "Default: as soon as --when no longer holds.",
)
@click.option("--driver-type", default=None, help="Only devices of this driver type.")
@click.option("--json", "as_json", is_flag=True, help="Print the gate as JSON.")
@pass_ctx
def gate_add(
    ctx: Ctx,
    name: str,
    when: tuple[str, ...],
    until: tuple[str, ...],
    driver_type: str | None,
    cooldown: int | None,
    as_json: bool,
) -> None:
    """Add a gate. A device it holds takes no new work (the task it runs finishes), shows
    "gated (NAME: battery 15)" in device list, device show, explain and status, and is never
    quarantined or counted as failing for it; events device_gated / device_ungated. Gates are
    checked whenever a device's attributes change (its host reports them: see `host run
    --discover`; `device set-attr`) and over every device when a gate is added or removed. At
    most 16 gates a pool; a device is held by one gate at a time (the first by name).

    A cooldown gate (--cooldown S) holds a device S seconds after each run on it ends
    ("gated (NAME: cooling 42 s)"); the scheduler lets it go when the time is up.

    \b
    Example:
      deviceq gate add low-battery --when 'battery<20' --until 'battery>=80'
      deviceq gate add hot --when 'temperature>=45' --driver-type android
      deviceq gate add settle --cooldown 60 --driver-type android
    """
    from ..core.gates import make_gate
    from ..ops.gates import add_gate

    usage_checked(lambda: make_gate(name, when, until, driver_type, cooldown))
    ctx.warn_if_unknown_pool()
    g, held = add_gate(ctx.admin, name, when, until, driver_type, cooldown)
    if as_json:
        echo_json({**g.as_json(), "held": held})
        return
    click.echo(f"gate {g.name} added; it holds {held} device(s) now")


@gate.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_ctx
def gate_list(ctx: Ctx, as_json: bool) -> None:
    """List gates: their rules and the devices each holds now. JSON: a list of {name, when,
    until, driver_type, created_at, devices}.

    \b
    Example:
      deviceq gate list --json | jq '.[].devices'
    """
    from rich.table import Table

    from ..ops.gates import gates, held_devices

    found, held = gates(ctx.admin), held_devices(ctx.admin)
    if as_json:
        echo_json([{**g.as_json(), "devices": held.get(g.name, [])} for g in found])
        return
    if not found:
        click.echo("no gates")
        return
    table = Table()
    for col in ("gate", "when", "until", "driver type", "holds"):
        table.add_column(col)
    for g in found:
        devs = held.get(g.name, [])
        shown = ", ".join(devs[:5]) + (f" (+{len(devs) - 5})" if len(devs) > 5 else "")
        when_text = " and ".join(map(str, g.when))
        if g.cooldown:
            when_text = f"{g.cooldown} s after each run" + (f" if {when_text}" if when_text else "")
        until_text = " and ".join(map(str, g.until)) or (
            "(its time is up)" if g.cooldown else "(when no longer holds)"
        )
        table.add_row(g.name, when_text, until_text,
                      g.driver_type or "any", shown or "-")  # fmt: skip
    console_for_tables().print(table)


@gate.command("remove")
@click.argument("name")
@pass_ctx
def gate_remove(ctx: Ctx, name: str) -> None:
    """Remove a gate: the devices it held take work again (unless another gate holds them).

    \b
    Example:
      deviceq gate remove low-battery
    """
    from ..core.validation import validate_id
    from ..ops.gates import remove_gate

    usage_checked(lambda: validate_id(name, "gate name"))
    freed = remove_gate(ctx.admin, name)
    click.echo(f"gate {name} removed; {freed} device(s) released")
