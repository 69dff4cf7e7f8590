"""The ``deviceq device`` group: list, show, remove, quarantine, unquarantine."""

from __future__ import annotations

from typing import Any

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
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_ctx
def device_list(ctx: Ctx, host_id: str | None, state: str | None, as_json: bool) -> None:
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
    statuses = lease_statuses(ctx, [d for d, _ in rows])
    for col in ("device", "host", "driver", "tags", "state", "task", "failures", "why"):
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
                      st.device_reason(d, s, booked.get(d.device_id)) or "-")  # fmt: skip
    console_for_tables().print(table)


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
    ended on it (task, attempt, outcome, failure_kind, when) and "history" its last 20
    quarantine, health check and booking changes (event, when, and e.g. reason, by, result),
    both newest first, "when" in ms since the epoch.

    \b
    Example:
      deviceq device show pixel-7 --json | jq '{reserved_by, reserved_until}'
    """
    from ..core.fleet import effective_state
    from ..ops import status as st

    usage_ids(device_id=device_id)
    admin = ctx.admin
    d = admin.device(device_id)
    host = next((h for h in admin.hosts() if h.host_id == d.host_id), None)
    resv = admin.reservation(device_id)
    state = effective_state(d, host)
    draining = bool(host and (host.draining or host.stopping))
    data = st.device_show_json(d, state, draining, resv, admin.device_past(device_id))
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
