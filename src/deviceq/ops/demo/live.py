"""The demo's live view (a rich ``Live`` group) and its one-line progress for non-terminals."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sized
from typing import Any, Protocol

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ...core.events import Event
from ...core.vocabulary import TaskStatus
from ...producer.client import Client
from ..admin import PoolAdmin
from .backend import Backend


class DemoProgress(Protocol):
    """What the live view reads of a running demo (`run.Demo`)."""

    @property
    def pool(self) -> str: ...
    @property
    def t0(self) -> float: ...
    @property
    def task_ids(self) -> Sized: ...
    @property
    def event_counts(self) -> Mapping[str, int]: ...
    @property
    def running(self) -> Mapping[str, Iterable[str]]: ...
    @property
    def incidents(self) -> Iterable[Text]: ...
    @property
    def recent(self) -> Iterable[Text]: ...
    @property
    def opt(self) -> Any: ...


def event_line(e: Event) -> Text:
    """One event as a short coloured line for the live view."""
    f = e.fields
    style = {
        "done": "green",
        "failed": "bold red",
        "expired": "bold yellow",
        "requeued": "yellow",
        "host_killed": "bold red",
        "dispatched": "cyan",
        "assigned": "blue",
        "released": "yellow",
        "leader_elected": "magenta",
    }.get(e.type, "dim")
    keys = ("task", "host", "device", "attempt", "failure_kind", "owner")
    parts = [f"{k}={f[k]}" for k in keys if f.get(k)]
    if e.type == "dispatched" and f.get("since_submit_ms"):
        parts.append(f"waited={f['since_submit_ms']}ms")
    stamp = time.strftime("%H:%M:%S", time.localtime(e.ms / 1000))
    return Text.assemble((f"{stamp} ", "dim"), (f"{e.type:<18}", style), " ".join(parts))


def render(demo: DemoProgress, backend: Backend, client: Client, admin: PoolAdmin) -> Group:
    """The live view: task counts, devices with their state, incidents and recent events."""
    counts = client.counts()
    head = Text.assemble(
        ("deviceq demo ", "bold"), f"— {backend.description}, pool {demo.pool} — ",
        f"{time.monotonic() - demo.t0:4.1f}s — submitted {len(demo.task_ids)}/{demo.opt.tasks}",
    )  # fmt: skip
    status = Table(title="tasks", title_justify="left", expand=False)
    colours = {"queued": "yellow", "assigned": "blue", "dispatched": "cyan", "done": "green",
               "failed": "red", "cancelled": "magenta"}  # fmt: skip
    for st in TaskStatus:
        status.add_column(st.value, justify="right", style=colours.get(st.value))
    status.add_column("retried", justify="right", style="yellow")
    status.add_row(
        *[str(counts.get(st.value, 0)) for st in TaskStatus], str(demo.event_counts["requeued"])
    )
    hosts = {h.host_id: h for h in admin.hosts()}
    devices = Table(title="devices", title_justify="left")
    for col in ("device", "host", "driver", "tags", "state", "task"):
        devices.add_column(col)
    for d in admin.devices():
        h = hosts.get(d.host_id)
        host_text = Text(d.host_id, style="green" if h and h.alive else "bold red")
        if h and not h.alive:
            host_text.append(" (dead)")
        state = d.state.value
        if d.quarantined:
            state = "quarantined"
        elif h and not h.alive:
            state = "offline"
        elif d.reserved_by:
            running = any(d.reserved_by in r for r in demo.running.values())
            state = "running" if running else "assigned"
        devices.add_row(
            d.device_id, host_text, d.driver_type, ",".join(d.tags), state, d.reserved_by or "-"
        )
    parts: list[Any] = [head, status, devices]
    for title, lines in (("incidents", demo.incidents), ("recent events", demo.recent)):
        table = Table(title=title, title_justify="left", show_header=False, box=None)
        table.add_column("event")
        for line in lines:
            table.add_row(line)
        parts.append(table)
    return Group(*parts)


def progress_line(demo: DemoProgress, client: Client) -> str:
    """One line of progress (when the output is not a terminal)."""
    c = client.counts()
    active = ", ".join(f"{k} {v}" for k, v in c.items() if v)
    return (
        f"[{time.monotonic() - demo.t0:5.1f}s] submitted {len(demo.task_ids)}/"
        f"{demo.opt.tasks}: {active or 'nothing yet'}; expired leases "
        f"{demo.event_counts['expired']}, requeued {demo.event_counts['requeued']}"
    )
