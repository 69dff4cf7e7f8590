"""The ``deviceq device`` group: list, show, remove, quarantine, unquarantine, set-attr,
unset-attr."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from .app import device
from .context import Ctx, actor, pass_ctx
from .lazy import LazyChoice, resolve
from .options import usage_checked, usage_ids
from .render import console_for_tables, echo_json, fmt_ms


@device.command("list")
@click.option("--host", "host_id", help="Only devices of this host.")
@click.option(
    "--state",
    type=LazyChoice(lambda: resolve("deviceq.ops.status:DEVICE_STATES")),
    help="Only devices in this state.",
)
@click.option(
    "--attr",
    "attr_names",
    metavar="NAMES",
    help="Add a column per attribute (comma separated, e.g. battery,sdk); '-' where a device "
    "has none.",
)
@click.option(
    "--where",
    "where",
    multiple=True,
    metavar="EXPR",
    help="Only devices whose attributes satisfy EXPR (repeatable, and-ed; e.g. 'sdk>=33', "
    "'model in (Pixel 7, Pixel 8)', 'has(gps)').",
)
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_ctx
def device_list(
    ctx: Ctx,
    host_id: str | None,
    state: str | None,
    attr_names: str | None,
    where: tuple[str, ...],
    as_json: bool,
) -> None:
    """List devices with their effective state and why: idle, reserved (a lease holds it: the
    table shows "running" once its host runs the task, "assigned" before), busy,
    offline, draining (its host is drained: shown as "idle (draining)"), suspect (a lease on
    it expired), held (its host refused an assignment), quarantined, or host_dead (its host
    stopped heartbeating), or booked (reserved for a person with `deviceq reserve`: the why
    column says by whom and until when), checking (its host's health check runs on it) or
    unhealthy (its last health check failed: the why column has the reason). A device of a
    draining host that still runs work shows e.g. "running (draining)"; JSON has
    "host_draining": true|false, "reservation": null or {"reserved_by": NOTE,
    "reserved_until": MS, "reserved_at": MS} (the top-level "reserved_by" is the task whose
    lease holds the device) and the health fields (see `device show`), and "attributes" (name
    -> value: numbers, booleans, versions and strings as text).

    \b
    Example:
      deviceq device list --state quarantined
      deviceq device list --host lab-1 --json
      deviceq device list --attr battery,sdk --where 'sdk>=33'
    """
    from rich.table import Table

    from ..core.attributes import as_json as attr_json
    from ..core.attributes import check_key
    from ..core.attributes import shown as shown_value
    from ..core.where import matches_all, parse_all
    from ..ops import status as st

    usage_ids(host_id=host_id)
    names = [n.strip() for n in (attr_names or "").split(",") if n.strip()]
    columns = _checked(lambda: [check_key(n) for n in dict.fromkeys(names)])
    clauses = _checked(lambda: parse_all(where))
    ctx.warn_if_unknown_pool()
    hosts, devices = st.hosts_and_devices(ctx.admin)
    booked = ctx.admin.reservations()
    draining = {h.host_id for h in hosts if h.draining or h.stopping}
    rows = [
        (d, s)
        for d, s in devices
        if (host_id is None or d.host_id == host_id) and (state is None or s == state)
    ]
    attrs = {d: a for d, (a, _) in ctx.admin.attributes([d.device_id for d, _ in rows]).items()}
    if clauses:
        rows = [(d, s) for d, s in rows if matches_all(clauses, attrs[d.device_id])]
        _warn_unknown_attributes(clauses, attrs.values())
    if as_json:
        echo_json(
            [
                {**st.device_json(d, s, d.host_id in draining, booked.get(d.device_id)),
                 "attributes": {k: attr_json(v) for k, v in attrs[d.device_id].items()}}
                for d, s in rows
            ]
        )  # fmt: skip
        return
    table = Table()
    statuses = lease_statuses(ctx, [d for d, _ in rows])
    for col in ("device", "host", "driver", "tags", "state", "task", "failures", "why", *columns):
        table.add_column(col)
    for d, s in rows:
        color = {"idle": "green", "reserved": "cyan", "busy": "cyan", "booked": "magenta",
                 "checking": "cyan"}.get(s, "bold red")  # fmt: skip
        if s == "draining":
            color, shown = "yellow", f"{d.state.value} (draining)"
        elif d.host_id in draining and s != "host_dead":
            shown = f"{shown_state(d, s, statuses)} (draining)"  # finishes, then gets none
        else:
            shown = shown_state(d, s, statuses)
        table.add_row(d.device_id, d.host_id, d.driver_type, ",".join(d.tags) or "-",
                      f"[{color}]{shown}[/]", d.reserved_by or "-", str(d.consecutive_failures),
                      st.device_reason(d, s, booked.get(d.device_id)) or "-",
                      *(shown_value(attrs[d.device_id][c]) if c in attrs[d.device_id] else "-"
                        for c in columns))  # fmt: skip
    console_for_tables().print(table)


def _warn_unknown_attributes(clauses: Any, seen: Any) -> None:
    """Warn (stderr) about an attribute no listed device has: likely a typo."""
    have: set[str] = set()
    for a in seen:
        have.update(a)
    for key in sorted({c.key for c in clauses} - have):
        click.echo(f"warning: no device has attribute {key!r} (a typo?)", err=True)


T = TypeVar("T")


def _checked(fn: Callable[[], T]) -> T:
    """``fn()``'s value; its InvalidInput is a usage error (one line, exit 2)."""
    out: list[T] = []
    usage_checked(lambda: out.append(fn()))
    return out[0]


def lease_statuses(ctx: Ctx, devices: list[Any]) -> dict[str, str]:
    """The status of the task whose lease holds each of ``devices`` (one round trip)."""
    held = [d.reserved_by for d in devices if d.reserved_by]
    if not held:
        return {}
    pipe = ctx.admin.redis.pipeline(transaction=False)
    for task_id in held:
        pipe.hget(ctx.admin.keys.task(task_id), "status")
    return {t: str(s or "") for t, s in zip(held, pipe.execute(), strict=True)}


def shown_state(d: Any, state: str, statuses: dict[str, str]) -> str:
    """The state word a table shows: a device a lease holds (effective state ``reserved``,
    as JSON says) is ``running`` once its host started the task (dispatched), else
    ``assigned`` (waiting for its host to claim it)."""
    if state != "reserved":
        return state
    return "running" if statuses.get(d.reserved_by or "") == "dispatched" else "assigned"


@device.command("show")
@click.argument("device_id")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_ctx
def device_show(ctx: Ctx, device_id: str, as_json: bool) -> None:
    """One device: host, driver type, tags, state and why, the task holding it, its
    reservation and its health (the host's health check, `host run --health-check`). JSON:
    "reserved_by" is the note of a person's reservation and "reserved_until" its end (ms since
    the epoch), both null when it is not reserved; "task_id" is the task whose lease holds the
    device; "health" is healthy, unhealthy, checking or null (never checked), with
    "health_checked_at" (ms), "health_output" (the last check's output tail) and
    "health_reason" (why it is unhealthy); "recent_attempts" are the last 20 attempts that
    ended on it (task, attempt, outcome, failure_kind, when); "attributes" (name -> value)
    with "attributes_at" (name -> when it was last sent, ms: a host sends a value when it
    changes, its heartbeats confirm it meanwhile) and "attributes_by" (name -> host or
    operator: an operator's value wins until it is unset); "history" its last 20
    quarantine, health check and booking changes (event, when, and e.g. reason, by, result),
    both newest first, "when" in ms since the epoch.

    \b
    Example:
      deviceq device show pixel-7 --json | jq '{reserved_by, reserved_until}'
    """
    from ..core.attributes import as_json as attr_json
    from ..core.attributes import shown
    from ..core.fleet import effective_state, operator_attributes
    from ..ops import status as st

    usage_ids(device_id=device_id)
    admin = ctx.admin
    d = admin.device(device_id)
    host = next((h for h in admin.hosts() if h.host_id == d.host_id), None)
    resv = admin.reservation(device_id)
    state = effective_state(d, host)
    draining = bool(host and (host.draining or host.stopping))
    data = st.device_show_json(d, state, draining, resv, admin.device_past(device_id))
    values, times = admin.attributes([device_id], with_times=True)[device_id]
    data["attributes"] = {k: attr_json(v) for k, v in values.items()}
    data["attributes_at"] = {k: times.get(k) for k in values}
    by_op = operator_attributes(admin, device_id)
    data["attributes_by"] = {k: "operator" if k in by_op else "host" for k in values}
    if as_json:
        echo_json(data)
        return
    rows = [
        ("device", d.device_id),
        ("host", d.host_id + (" (draining)" if draining else "")),
        ("driver type", d.driver_type),
        ("tags", ",".join(d.tags) or "-"),
        ("state", shown_state(d, state, lease_statuses(ctx, [d]))),
        ("why", data["why"] or "-"),
        ("task", d.reserved_by or "-"),
        ("reserved by", resv.reserved_by if resv else "-"),
        ("reserved until", fmt_ms(resv.reserved_until) if resv else "-"),
        ("failures", str(d.consecutive_failures)),
        ("health", d.health or "-"),
        ("health checked", fmt_ms(d.health_checked_at) if d.health_checked_at else "-"),
        ("health reason", d.health_reason or "-"),
    ]
    for name, value in rows:
        click.echo(f"{name:15} {value}")
    if d.health_output:
        click.echo("health output (tail):")
        for line in d.health_output.rstrip("\n").splitlines():
            click.echo(f"  {line}")
    if values:  # (its attributes, when it has any: its host's or an operator's)
        click.echo("attributes:")
    for k, v in values.items():
        how = "set by operator" if k in by_op else "reported"
        click.echo(f"  {k:15} {shown(v):20} {how} {fmt_ms(times.get(k))}")
    _show_past(data["recent_attempts"], data["history"])


def _show_past(recent: list[dict[str, Any]], history: list[dict[str, Any]]) -> None:
    """``device show``'s recent attempts and change history, newest first."""
    click.echo("recent attempts:" if recent else "recent attempts: none")
    for e in recent:
        kind = f" ({e['failure_kind']})" if e.get("failure_kind") else ""
        click.echo(
            f"  {fmt_ms(e.get('when'))}  {e.get('task')} attempt {e.get('attempt')}: "
            f"{e.get('outcome')}{kind}"
        )
    click.echo("history:" if history else "history: none")
    for e in history:
        rest = " ".join(
            f"{k}={v}" for k, v in sorted(e.items()) if k not in ("event", "when") and v != ""
        )
        click.echo(f"  {fmt_ms(e.get('when'))}  {e.get('event')}  {rest}".rstrip())


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
    from ..core.validation import validate_id

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


def _quarantine(ctx: Ctx, device_id: str, flag: bool, as_json: bool, reason: str = "") -> None:
    from ..ops.admin import check_reason

    usage_ids(device_id=device_id)
    usage_checked(lambda: check_reason(reason))
    res = ctx.admin.quarantine(device_id, flag, reason, actor())
    if as_json:
        echo_json({"device_id": device_id, "result": res})
    elif flag:
        click.echo(f"{device_id} quarantined: it gets no new work")
    elif res == "not_quarantined":
        click.echo(f"{device_id} was not quarantined: nothing changed")
    else:
        click.echo(f"{device_id} released from quarantine (failure count reset)")


@device.command("quarantine")
@click.argument("device_id")
@click.option(
    "--reason",
    default="",
    metavar="TEXT",
    help="Why (at most 200 bytes, no control characters): shown by device list/show and the "
    "dashboard, carried in the device_quarantined event. Default: operator.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_ctx
def device_quarantine(ctx: Ctx, device_id: str, reason: str, as_json: bool) -> None:
    """Take a device out of service: no new assignments (a running task finishes). Quarantining
    a device that is quarantined already changes nothing (its reason stays).

    \b
    Example:
      deviceq device quarantine pixel-7 --reason "cracked screen"
    """
    _quarantine(ctx, device_id, True, as_json, reason)


@device.command("unquarantine")
@click.argument("device_id")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_ctx
def device_unquarantine(ctx: Ctx, device_id: str, as_json: bool) -> None:
    """Put a quarantined device back into service and reset its failure count.

    \b
    Example:
      deviceq device unquarantine pixel-7
    """
    _quarantine(ctx, device_id, False, as_json)


@device.command("set-attr")
@click.argument("device_id")
@click.argument("pairs", nargs=-1, required=True, metavar="KEY=VALUE...")
@pass_ctx
def device_set_attr(ctx: Ctx, device_id: str, pairs: tuple[str, ...]) -> None:
    """Set attributes of a device: what an operator knows (its hosts report the rest: see
    `host run --discover`). A value is typed by its text: true/false a boolean, 34 or -1.5 a
    number, 14.1.2 a version, anything else a string (quote it, 'model="34"', to keep digits a
    string). Names: 1-32 of a-z 0-9 _ starting with a letter; values at most 64 bytes; a device
    has at most 32 attributes. An operator's value wins over what the device's host reports
    for that name until `device unset-attr` removes it (then the host's value is back).

    \b
    Example:
      deviceq device set-attr pixel-7 model="Pixel 7" storage_gb=128 gps=true
    """
    from ..core.attributes import parse_assignments

    usage_ids(device_id=device_id)
    values = _checked(lambda: parse_assignments(pairs))
    changed = ctx.admin.set_attributes(device_id, values, actor())
    click.echo(f"{device_id}: " + ("attributes set" if changed else "nothing changed"))


@device.command("unset-attr")
@click.argument("device_id")
@click.argument("names", nargs=-1, required=True, metavar="KEY...")
@pass_ctx
def device_unset_attr(ctx: Ctx, device_id: str, names: tuple[str, ...]) -> None:
    """Remove attributes of a device (a name it does not have is no change). A value an
    operator set gives way to what the host reports for that name, if it reports one; a value
    only the host reports is gone until the host sends it again.

    \b
    Example:
      deviceq device unset-attr pixel-7 storage_gb
    """
    from ..core.attributes import check_key

    usage_ids(device_id=device_id)
    _checked(lambda: [check_key(n) for n in names])
    changed = ctx.admin.unset_attributes(device_id, names, actor())
    click.echo(f"{device_id}: " + ("attributes removed" if changed else "nothing changed"))
