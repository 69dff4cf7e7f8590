"""Reservations: ``deviceq reserve`` takes an idle device for a person for a while,
``deviceq release`` ends it early (``device show``, in `device_cmds`, shows a device with its
reservation)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ..core.errors import InvalidInput
from .app import main
from .context import Ctx, login_name, pass_ctx
from .options import parse_duration_ms
from .render import echo_json, fmt_ms

if TYPE_CHECKING:
    from ..ops.admin import Reservation


def _print(r: Reservation, verb: str, now_ms: int, as_json: bool) -> None:
    if as_json:
        echo_json(r.as_dict())
        return
    left = (r.reserved_until - now_ms) / 1000
    click.echo(
        f"{r.device_id} (host {r.host_id}) {verb} for {r.reserved_by!r} until "
        f"{fmt_ms(r.reserved_until)} ({left:.0f}s from now)"
    )


@main.command("reserve")
@click.argument("device_id", required=False)
@click.option(
    "--for",
    "duration",
    required=True,
    metavar="DURATION",
    help="How long: 90s, 30m, 2h, 1d (at most 7d). With --extend: how much longer.",
)
@click.option("--note", help="Who it is for and why (shown as reserved_by) [default: your login].")
@click.option("--driver-type", help="No DEVICE_ID: reserve an idle device of this driver type.")
@click.option("--tag", "tags", multiple=True, help="No DEVICE_ID: the device must have this tag "
              "(repeatable).")  # fmt: skip
@click.option("--where", "where", multiple=True, metavar="EXPR",
              help="The device's attributes must satisfy this (repeatable, and-ed: 'sdk>=33'; "
              "see submit --where). With DEVICE_ID: refused unless that device does.")  # fmt: skip
@click.option("--extend", is_flag=True, help="The device is reserved already: end it DURATION "
              "later (the end at most 7 days from now; --note replaces the note).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the reservation as JSON.")
@pass_ctx
def reserve(
    ctx: Ctx,
    device_id: str | None,
    duration: str,
    note: str | None,
    driver_type: str | None,
    tags: tuple[str, ...],
    where: tuple[str, ...],
    extend: bool,
    as_json: bool,
) -> None:
    """Reserve a device for a person: it leaves the scheduler's candidates for the duration
    (queued tasks wait; `deviceq explain` says until when), then comes back by itself.

    Only an idle device is taken (no lease, not quarantined or held, its host alive): a
    running task is never interrupted, and a busy device is refused with the reason (nothing
    is left pending: try again, or name other constraints). Reserving a reserved device is
    refused; --extend moves its end out instead.

    \b
    Example:
      deviceq reserve pixel-7 --for 2h --note "alice: flashing a new build"
      deviceq reserve --driver-type android --tag camera --for 30m --note bob
      deviceq reserve --driver-type android --where 'sdk>=34' --for 1h --note carol
      deviceq reserve pixel-7 --extend --for 1h
      deviceq release pixel-7
    """
    from ..core.validation import validate_id
    from ..core.where import parse_all
    from ..ops.admin import MAX_RESERVATION_MS
    from .options import usage_checked

    usage_checked(lambda: parse_all(list(where)))  # (a malformed one: one line, exit 2)
    clauses = parse_all(list(where))
    ms = parse_duration_ms(duration, "--for")
    if ms > MAX_RESERVATION_MS:
        raise InvalidInput(
            f"--for: {duration} is longer than 7 days (the most a reservation lasts)"
        )
    if ms < 1000:
        raise InvalidInput(f"--for: {duration} is shorter than 1s")
    if device_id is not None and (driver_type or tags):
        raise InvalidInput("give a DEVICE_ID or --driver-type/--tag, not both")
    ctx.warn_if_unknown_pool()
    admin = ctx.admin
    if extend:
        if where:
            raise InvalidInput("--where is for a new reservation, not --extend")
        if device_id is None:
            raise InvalidInput("--extend needs the DEVICE_ID of the reservation")
        r = admin.extend(validate_id(device_id, "device id"), ms, note or "")
        _print(r, "reservation extended", admin.server_time_ms(), as_json)
        return
    text = note if note is not None else login_name()
    if not text:
        raise InvalidInput("--note is required (who is the device for?)")
    if clauses:
        from .submit_cmds import warn_unknown_attributes

        warn_unknown_attributes(ctx, {c.key for c in clauses})
    if device_id is not None:
        r = admin.reserve(validate_id(device_id, "device id"), ms, text, where)
    elif driver_type or tags or where:
        r = admin.reserve_matching(driver_type, tags, ms, text, where)
    else:
        raise InvalidInput(
            "name a DEVICE_ID, or --driver-type/--tag/--where to take any matching device"
        )
    _print(r, "reserved", admin.server_time_ms(), as_json)


@main.command("release")
@click.argument("device_id")
@pass_ctx
def release(ctx: Ctx, device_id: str) -> None:
    """End a device's reservation now: it is a scheduling candidate again (if it is idle, not
    quarantined and not held).

    \b
    Example:
      deviceq release pixel-7
    """
    from ..core.validation import validate_id

    validate_id(device_id, "device id")
    ctx.warn_if_unknown_pool()
    host_id = ctx.admin.release(device_id)
    click.echo(f"{device_id} (host {host_id}) released: back among the scheduling candidates")
