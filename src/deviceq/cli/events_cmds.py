"""``deviceq events``: the pool's event stream, past and followed, filtered."""

from __future__ import annotations

import collections
import json
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from .app import main
from .context import Ctx, pass_ctx
from .options import usage_ids
from .render import echo_json, event_json, event_line
from .via_api import events_via_api, via_api

if TYPE_CHECKING:
    from ..core.events import Event


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
    from ..core.validation import validate_id

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
