"""Operator commands: status (live; its views are in `status_view`), events, device/host/workflow
listings, host remove and token rotation, workflows, task retry (``submit --file`` is in
`task_files`)."""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from ..core.errors import InvalidInput, NotFound
from .app import (
    Ctx,
    check_output_path,
    console_for_tables,
    device,
    echo_json,
    host,
    main,
    nesting_guard,
    output_option,
    pass_ctx,
    task,
    workflow,
)
from .lazy import LazyChoice, resolve
from .options import LIMIT_OPTION, YES_OPTION, filter_options, targets, usage_ids
from .render import event_json, event_line, fmt_age, fmt_ms, print_token
from .status_view import render_all_pools, render_status
from .via_api import events_via_api, retry_via_api, via_api

if TYPE_CHECKING:
    from ..core.events import Event


@main.command("status")
@click.option("--watch", is_flag=True, help="Keep refreshing until Ctrl-C.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
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


# -- events ------------------------------------------------------------------------------------


def _backlog(
    ctx: Ctx, since: str | None, wanted: Callable[[Event], bool] | None, limit: int, all_after: bool
) -> tuple[list[Event], str]:
    """Past events to show first, and the stream cursor to follow from."""
    from ..core.events import Event, read_events

    r, keys = ctx.client.redis, ctx.client.keys
    if since is None and wanted is None:
        newest: list[tuple[str, dict[str, str]]] = r.xrevrange(  # type: ignore[assignment]
            keys.events, count=limit
        )
        events = [
            Event(
                id=str(i),
                type=f.get("type", "?"),
                fields={k: v for k, v in f.items() if k != "type"},
            )
            for i, f in reversed(newest)
        ]
        return events, events[-1].id if events else "0-0"
    cursor = since or "0-0"
    keep: collections.deque[Event] | list[Event]
    keep = [] if since is not None else collections.deque(maxlen=limit)
    while True:
        cursor, batch = read_events(r, keys, cursor, block_ms=None)
        if not batch:
            return list(keep), cursor
        for e in batch:
            if wanted is None or wanted(e):
                keep.append(e)
                if since is not None and not all_after and len(keep) >= limit:
                    return list(keep), e.id


@main.command("events")
@via_api(events_via_api)
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events until Ctrl-C.")
@click.option("--task", "task_id", help="Only events of this task.")
@click.option("--device", "device_id", help="Only events naming this device (its device field).")
@click.option("--host", "host_id", help="Only events naming this host (its host field).")
@click.option(
    "--type",
    "types",
    multiple=True,
    metavar="TYPE",
    help="Only events of this type (repeatable), e.g. failed, expired, assigned.",
)
@click.option("--since", help="Start after this event id (e.g. 0-0 for the whole stream).")
@click.option(
    "--limit",
    type=click.IntRange(1, 100_000),
    default=100,
    show_default=True,
    help="Past events to print: the newest N, or the first N after --since "
    "(with --follow everything after --since is printed).",
)
@click.option(
    "--json", "as_json", is_flag=True, help="JSON: a list, or with --follow one object per line."
)
@pass_ctx
def events_cmd(
    ctx: Ctx,
    follow: bool,
    task_id: str | None,
    device_id: str | None,
    host_id: str | None,
    types: tuple[str, ...],
    since: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Print the pool's transitions (submitted, assigned, dispatched, expired, requeued, done,
    failed, ...) oldest first, from the capped event stream.

    \b
    Example:
      deviceq events --task 3f2a9c0d1e2b4a5f
      deviceq events --type failed --type expired --limit 20
      deviceq events --device pixel-7 --follow
      deviceq events --follow --json | jq -c 'select(.type == "failed")'
    """
    from ..core.models import validate_id

    if task_id is not None:
        validate_id(task_id, "task id")
    usage_ids(device_id=device_id, host_id=host_id)
    wanted: Callable[[Event], bool] | None = None
    if task_id is not None or device_id is not None or host_id is not None or types:

        def wanted(e: Event) -> bool:
            return (
                (task_id is None or e.task == task_id)
                and (device_id is None or e.fields.get("device") == device_id)
                and (host_id is None or e.fields.get("host") == host_id)
                and (not types or e.type in types)
            )

    ctx.warn_if_unknown_pool()
    past, cursor = _backlog(ctx, since, wanted, limit, all_after=follow)
    if as_json and not follow:
        echo_json([event_json(e) for e in past])
        return

    def show(e: Event) -> None:
        line = json.dumps(event_json(e), sort_keys=True) if as_json else event_line(e)
        click.echo(line)

    for e in past:
        show(e)
    if not follow:
        return
    try:
        for e in ctx.client.events(since=cursor, task=task_id, follow=True):
            if wanted is None or wanted(e):
                show(e)
    except KeyboardInterrupt:
        return


# -- devices and hosts -------------------------------------------------------------------------
@device.command("list")
@click.option("--host", "host_id", help="Only devices of this host.")
@click.option(
    "--state",
    type=LazyChoice(lambda: resolve("deviceq.ops.status:DEVICE_STATES")),
    help="Only devices in this state.",
)
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_ctx
def device_list(ctx: Ctx, host_id: str | None, state: str | None, as_json: bool) -> None:
    """List devices with their effective state and why: idle, reserved (holds a lease), busy,
    offline, draining (its host is drained: shown as "idle (draining)"), suspect (a lease on
    it expired), held (its host refused an assignment), quarantined, or host_dead (its host
    stopped heartbeating), or booked (reserved for a person with `deviceq reserve`: the why
    column says by whom and until when), checking (its host's health check runs on it) or
    unhealthy (its last health check failed: the why column has the reason). A device of a
    draining host that still runs work shows e.g. "reserved (draining)"; JSON has
    "host_draining": true|false, "reservation": null or {"reserved_by": NOTE,
    "reserved_until": MS, "reserved_at": MS} (the top-level "reserved_by" is the task whose
    lease holds the device) and the health fields (see `device show`).

    \b
    Example:
      deviceq device list --state quarantined
      deviceq device list --host lab-1 --json
    """
    from rich.table import Table

    from ..ops import status as st

    ctx.warn_if_unknown_pool()
    hosts, devices = st.hosts_and_devices(ctx.admin)
    booked = ctx.admin.reservations()
    draining = {h.host_id for h in hosts if h.draining or h.stopping}
    rows = [
        (d, s)
        for d, s in devices
        if (host_id is None or d.host_id == host_id) and (state is None or s == state)
    ]
    if as_json:
        echo_json(
            [st.device_json(d, s, d.host_id in draining, booked.get(d.device_id)) for d, s in rows]
        )
        return
    table = Table()
    for col in ("device", "host", "driver", "tags", "state", "task", "failures", "why"):
        table.add_column(col)
    for d, s in rows:
        color = {"idle": "green", "reserved": "cyan", "busy": "cyan", "booked": "magenta",
                 "checking": "cyan"}.get(s, "bold red")  # fmt: skip
        if s == "draining":
            color, shown = "yellow", f"{d.state.value} (draining)"
        elif d.host_id in draining and s != "host_dead":
            shown = f"{s} (draining)"  # finishes its work, then gets none
        else:
            shown = s
        table.add_row(d.device_id, d.host_id, d.driver_type, ",".join(d.tags) or "-",
                      f"[{color}]{shown}[/]", d.reserved_by or "-", str(d.consecutive_failures),
                      st.device_reason(d, s, booked.get(d.device_id)) or "-")  # fmt: skip
    console_for_tables().print(table)


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
    from ..core.models import validate_id

    validate_id(host_id, "host id")
    ctx.warn_if_unknown_pool()
    n = ctx.admin.remove_host(host_id, force=force)
    click.echo(f"removed host {host_id} and {n} device(s)")


@device.command("remove")
@click.argument("device_id")
@click.option(
    "--force",
    is_flag=True,
    help="Hand back the task it runs (no attempt spent: it is queued again; its host stops "
    "the run) and remove it even while its host still reports it.",
)
@pass_ctx
def device_remove(ctx: Ctx, device_id: str, force: bool) -> None:
    """Delete a device: retired, replaced, or a ghost its host no longer reports. Refused
    while it runs a task and while its live host still reports it (take it out of the host's
    --device list or --devices-file first), unless --force; a host that still reports it
    registers it again at its next heartbeat.

    \b
    Example:
      deviceq device remove pixel-3
      deviceq device remove pixel-3 --force   # its running task goes back to the queue
    """
    from ..core.models import validate_id

    validate_id(device_id, "device id")
    ctx.warn_if_unknown_pool()
    res = ctx.admin.remove_device(device_id, force=force)
    click.echo(
        f"removed device {device_id} of host {res.host_id}"
        + (f"; task {res.handed_back} handed back to the queue" if res.handed_back else "")
    )
    if res.still_reported:
        click.echo(
            f"warning: host {res.host_id} still reports {device_id}: it is registered again at "
            "the host's next heartbeat unless it leaves the host's device list",
            err=True,
        )


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


# -- workflows ---------------------------------------------------------------------------------
def _load_definitions(text: str, source: str) -> list[dict[str, Any]]:
    import yaml

    try:
        with nesting_guard(source):
            data = yaml.safe_load(text)  # JSON is YAML too
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0]
        raise InvalidInput(f"{source}: not valid YAML or JSON: {first}") from None
    items = data if isinstance(data, list) else [data]
    if not items or not all(isinstance(x, dict) for x in items):
        raise InvalidInput(f"{source}: expected a workflow mapping (name, steps) or a list of them")
    return items


@workflow.command("put")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--json", "as_json", is_flag=True, help="Print the stored names as JSON.")
@pass_ctx
def workflow_put(ctx: Ctx, file: str, as_json: bool) -> None:
    """Store (or replace) workflow definitions from a YAML or JSON FILE ('-' for stdin): one
    mapping with `name`, optional `description` and `steps` (each a `goal`, optional `name`), or
    a list of them. All are validated before any is stored.

    \b
    Example:
      deviceq workflow put smoke.yaml
    \b
      # smoke.yaml
      name: smoke-suite
      steps:
        - {name: launch, goal: "open the app"}
        - {name: login, goal: "log in as the test user"}
    """
    from pydantic import ValidationError

    from ..core.models import WorkflowDefinition
    from .task_files import read_text

    items = _load_definitions(read_text(file), "<stdin>" if file == "-" else file)
    defs = []
    for i, item in enumerate(items, 1):
        try:
            defs.append(WorkflowDefinition.model_validate(item))
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err.get("loc", ()))
            what = f"workflow {i}" if len(items) > 1 else "workflow"
            raise InvalidInput(
                f"{file}: {what}: {where + ': ' if where else ''}"
                f"{str(err['msg']).removeprefix('Value error, ')}"
            ) from None
    names = [ctx.client.put_workflow(d) for d in defs]
    if as_json:
        echo_json([{"name": d.name, "steps": len(d.steps)} for d in defs])
    else:
        for d, name in zip(defs, names, strict=True):
            click.echo(f"stored workflow {name} ({len(d.steps)} steps)")


@workflow.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_ctx
def workflow_list(ctx: Ctx, as_json: bool) -> None:
    """List stored workflows with their number of steps.

    \b
    Example:
      deviceq workflow list --json
    """
    from rich.table import Table

    names: list[str] = ctx.client.list_workflows()
    defs = [ctx.client.get_workflow(n) for n in names]
    if as_json:
        echo_json(
            [{"name": d.name, "description": d.description, "steps": len(d.steps)} for d in defs]
        )
        return
    table = Table()
    for col in ("name", "steps", "description"):
        table.add_column(col)
    for d in defs:
        table.add_row(d.name, str(len(d.steps)), d.description or "-")
    console_for_tables().print(table)


@workflow.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_ctx
def workflow_show(ctx: Ctx, name: str, as_json: bool) -> None:
    """Print a stored workflow (YAML, or JSON with --json; either can be fed back to `put`).

    \b
    Example:
      deviceq workflow show smoke-suite > smoke.yaml
    """
    import yaml

    data = ctx.client.get_workflow(name).model_dump(mode="json", exclude_none=True)
    if as_json:
        echo_json(data)
    else:
        click.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip())


# -- task retry --------------------------------------------------------------------------------
RETRYABLE = ("failed", "cancelled")


@task.command("retry")
@via_api(retry_via_api)
@click.argument("task_ids", nargs=-1, metavar="[TASK_ID]...")
@filter_options
@YES_OPTION
@LIMIT_OPTION
@click.option(
    "--rerun",
    is_flag=True,
    help="Done tasks too: run a passing task again (a new task; to check a flaky test).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print {id, retry_of, task} as JSON (a list of them for several tasks or a filter).",
)
@pass_ctx
def task_retry(
    ctx: Ctx,
    task_ids: tuple[str, ...],
    statuses: tuple[str, ...],
    driver_type: str | None,
    tags: tuple[str, ...],
    host_id: str | None,
    tenant: str | None,
    older_than: str | None,
    yes: bool,
    limit: int,
    rerun: bool,
    as_json: bool,
) -> None:
    """Submit failed or cancelled tasks again, each as a new task with the same goal or
    workflow, constraints, priority, max_attempts, tenant and retry policy (the old task
    is not changed). Give ids, or a filter (failed and cancelled tasks; --status narrows
    it), confirmed like `task cancel`. Prints each new id and the id it came from. Every id
    is checked before any is submitted.

    \b
    Example:
      deviceq task retry 3f2a9c0d1e2b4a5f
      deviceq task retry --status failed --driver-type android --older-than 1h --yes
      deviceq task retry --rerun 3f2a9c0d1e2b4a5f      # a done task, run again
    """
    allowed = RETRYABLE + (("done",) if rerun else ())
    ids, flt = targets(ctx, task_ids, statuses, driver_type, tags, host_id, tenant, older_than,
                       allowed=allowed, done="retried", verb="retry",
                       yes=yes, limit=limit)  # fmt: skip
    if not ids:
        if as_json:
            echo_json([])
        return
    olds = {t.id: t for t in ctx.client.get_many(ids)}
    for task_id in ids:  # all checked before the first is submitted
        if task_id not in olds:
            raise NotFound(f"no task {task_id} in pool {ctx.pool}")
        if olds[task_id].status not in allowed:
            hint = " (a done task with --rerun)" if olds[task_id].status == "done" else ""
            raise InvalidInput(
                f"task {task_id} is {olds[task_id].status.value}: only failed or cancelled "
                f"tasks can be retried{hint}"
            )
    out = []
    for task_id in ids:
        old = olds[task_id]
        new_id = ctx.client.retry(task_id, rerun=rerun)
        if as_json:
            out.append(
                {
                    "id": new_id,
                    "retry_of": task_id,
                    "task": ctx.client.get(new_id).model_dump(mode="json"),
                }
            )
        else:
            kind = old.failure_kind.value if old.failure_kind else None
            why = f", {kind}" if kind and kind != old.status.value else ""
            click.echo(f"{new_id} (retry of {task_id}: {old.status.value}{why})")
    if as_json:
        echo_json(out[0] if len(ids) == 1 and flt is None else out)
