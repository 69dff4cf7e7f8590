"""``deviceq schedule add|list|remove|pause|resume``: tasks submitted periodically at the times
of a cron expression (UTC) by the leading scheduler (`deviceq.services.schedules`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from ..core.errors import InvalidInput
from .app import main
from .context import Ctx, pass_ctx
from .options import parse_role_options
from .render import echo_json
from .submit_cmds import submit as _submit_cmd
from .submit_cmds import warn_unknown_constraints

SUBMIT_OPTIONS = (
    "workflow_name", "driver_type", "tags", "priority", "max_attempts", "queue_timeout",
    "timeout", "reject_unmatched", "tenant", "retry_on", "retry_backoff", "roles", "where",
    "priority_class",
)  # fmt: skip
"""The options of ``deviceq submit`` that ``schedule add`` takes too (the same objects)."""

if TYPE_CHECKING:
    from ..services.schedules import ScheduleStore


def _store(ctx: Ctx) -> ScheduleStore:
    from ..services.schedules import ScheduleStore  # (croniter, pydantic: not to start the CLI)

    return ScheduleStore(ctx.admin.redis, ctx.admin.keys)


def _now(ctx: Ctx) -> float:
    from ..services.schedules import redis_now

    return redis_now(ctx.admin.redis)


def _bad_input(exc: InvalidInput) -> click.UsageError:
    """Bad input as a one-line usage error (exit code 2)."""
    return click.UsageError(str(exc))


@main.group()
def schedule() -> None:
    """Schedules: a task submitted at the times of a cron expression (UTC), once per run, by
    the leading scheduler (`deviceq scheduler run`); a run missed while no scheduler led is
    submitted once when one leads again."""


@schedule.command("add")
@click.argument("name")
@click.argument("goal", required=False)
@click.option(
    "--cron",
    required=True,
    metavar="EXPR",
    help='When it runs, in UTC: five cron fields (minute hour day month weekday, e.g. "0 2 * '
    '* *" at 02:00 every day) or @hourly, @daily, @weekly, @monthly, @yearly.',
)
@click.option("--json", "as_json", is_flag=True, help="Print the schedule as JSON.")
@pass_ctx
def schedule_add(
    ctx: Ctx, name: str, goal: str | None, cron: str, as_json: bool, **opts: Any
) -> None:
    """Add schedule NAME: submit GOAL (or --workflow NAME) with the given submit options at
    each time of --cron. Each run's task has the idempotency key schedule.NAME.RUN_TIME.

    \b
    Example:
      deviceq schedule add nightly-soak --cron "0 2 * * *" "run the soak" --driver-type android
      deviceq schedule add smoke --cron @hourly --workflow smoke-suite --priority 5
    """
    spec: dict[str, Any] = {
        "goal": goal,
        "workflow": opts.pop("workflow_name"),
        "tags": [t for value in opts.pop("tags") for t in value.split(",") if t],
        "roles": parse_role_options(opts.pop("roles")) or None,
        "where": list(opts.pop("where")),
        **opts,
    }
    try:
        s = _store(ctx).add(name, cron, spec)
    except InvalidInput as exc:
        raise _bad_input(exc) from None
    warn_unknown_constraints(ctx, spec.get("driver_type"), spec["tags"])  # (as submit does)
    from ..core.fleet import where_keys
    from ..core.models import spec_where_texts
    from .submit_cmds import warn_unknown_attributes

    warn_unknown_attributes(ctx, where_keys(spec_where_texts(spec)))
    if spec.get("priority"):
        from ..core.connection import priority_ignored

        if line := priority_ignored(ctx.admin.redis, ctx.admin.keys):
            click.echo(f"warning: {line}", err=True)
    row = s.public(None, _now(ctx))
    if as_json:
        echo_json(row)
    else:
        click.echo(f"schedule {s.name} added: {s.cron} (UTC), next run {row['next_run_iso']}")


schedule_add.params.extend(p for p in _submit_cmd.params if p.name in SUBMIT_OPTIONS)


def _what(row: dict[str, Any]) -> str:
    return f"workflow {row['workflow']}" if row["workflow"] else str(row["goal"])


def _last(row: dict[str, Any]) -> str:
    last = row["last_run"]
    if last is None:
        return "-"
    what = last["task_id"] or (f"error: {last['error']}" if last["error"] else "pending")
    return f"{row['last_run_iso']} ({what})"


@schedule.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_ctx
def schedule_list(ctx: Ctx, as_json: bool) -> None:
    """List the pool's schedules: cron, next run, last run (and its task), paused, goal.

    \b
    Example:
      deviceq schedule list --json
    """
    store = _store(ctx)
    now = _now(ctx)
    lasts = store.last_runs()
    rows = [s.public(lasts.get(s.name), now) for s in store.all()]
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo('no schedules (add one with: deviceq schedule add NAME --cron "0 2 * * *" GOAL)')
        return
    table = [("NAME", "CRON", "NEXT RUN", "LAST RUN", "PAUSED", "GOAL")]
    table += [(r["name"], r["cron"], r["next_run_iso"] or "-", _last(r),
               "yes" if r["paused"] else "no", _what(r)) for r in rows]  # fmt: skip
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]) - 1)]
    for line in table:
        cells = [c.ljust(w) for c, w in zip(line, widths, strict=False)]
        click.echo("  ".join([*cells, line[-1]]))


def _named(ctx: Ctx, name: str, action: str) -> None:
    store = _store(ctx)
    try:
        if action == "remove":
            store.remove(name)
            click.echo(f"schedule {name} removed")
            return
        changed = store.set_paused(name, action == "pause")
    except InvalidInput as exc:
        raise _bad_input(exc) from None
    if action == "pause":
        click.echo(f"schedule {name} paused" if changed else f"schedule {name} was already paused")
    else:
        click.echo(
            f"schedule {name} resumed (runs due while paused are skipped)"
            if changed
            else f"schedule {name} was not paused"
        )


@schedule.command("remove")
@click.argument("name")
@pass_ctx
def schedule_remove(ctx: Ctx, name: str) -> None:
    """Remove a schedule (tasks it submitted stay).

    \b
    Example:
      deviceq schedule remove nightly-soak
    """
    _named(ctx, name, "remove")


@schedule.command("pause")
@click.argument("name")
@pass_ctx
def schedule_pause(ctx: Ctx, name: str) -> None:
    """Stop submitting a schedule's runs until `deviceq schedule resume`.

    \b
    Example:
      deviceq schedule pause nightly-soak
    """
    _named(ctx, name, "pause")


@schedule.command("resume")
@click.argument("name")
@pass_ctx
def schedule_resume(ctx: Ctx, name: str) -> None:
    """Submit a paused schedule's runs again, from its next time on (runs due while it was
    paused are not caught up).

    \b
    Example:
      deviceq schedule resume nightly-soak
    """
    _named(ctx, name, "resume")
