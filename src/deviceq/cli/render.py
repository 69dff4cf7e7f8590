"""How the commands print things: times and ages, a task and an event as JSON or one line, the
last lines of a long text, a new host token, the tenants table, plain-text tables (no rich,
for commands that must start fast). Shared by the command modules (nothing here reads
Redis)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import click

from .files import write_output_file

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from ..core.events import Event
    from ..core.models import ScheduledTask


_NAMED = {0x00: "\\0", 0x07: "\\a", 0x08: "\\b", 0x0B: "\\v", 0x0C: "\\f", 0x0D: "\\r",
          0x1B: "\\e"}  # fmt: skip
_VISIBLE = {
    **{c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c not in (9, 10)},
    **_NAMED,
    # bidirectional overrides and isolates reorder what a terminal shows
    **{c: f"\\u{c:04x}" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))},
}


def visible(text: str) -> str:
    """``text`` as it is safe to write to a terminal: every control character but newline and
    tab shown as an escape (ESC as ``\\e``, so ``ESC]52;...`` is ``\\e]52;...``; CR ``\\r``, BEL
    ``\\a``, others ``\\xNN``; C1 controls ``\\xNN``; bidirectional overrides ``\\uNNNN``), so
    what a run printed cannot set the title, the clipboard (OSC 52), move the cursor or
    rewrite a line; printable text (UTF-8 included) is left as it is. ``--raw`` skips it."""
    return text.translate(_VISIBLE)


def task_json(t: ScheduledTask) -> dict[str, object]:
    return t.model_dump(mode="json")


def fmt_ms(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def print_token(host_id: str, token: str, as_json: bool, output: str | None) -> None:
    """A new token on stdout, or into ``output`` (written only now, after success)."""
    if as_json:
        text = json.dumps({"host_id": host_id, "token": token}, indent=2, sort_keys=True)
    else:
        text = token
    if output is None:
        click.echo(text)
        return
    write_output_file(output, text + "\n")
    click.echo(f"token of host {host_id} written to {output}", err=True)


def fmt_age(ms: int | None) -> str:
    """A duration in ms as a short human string (``850ms``, ``12.3s``, ``4m05s``, ``2h10m``)."""
    if ms is None:
        return "-"
    neg, ms = ms < 0, abs(ms)
    if ms < 1000:
        text = f"{ms}ms"
    elif ms < 60_000:
        text = f"{ms / 1000:.1f}s"
    elif ms < 3_600_000:
        text = f"{ms // 60_000}m{(ms // 1000) % 60:02d}s"
    else:
        text = f"{ms // 3_600_000}h{(ms // 60_000) % 60:02d}m"
    return f"-{text}" if neg else text


def event_json(e: Event) -> dict[str, Any]:
    """An event as printed by ``events --json``: the typed model (`Event.as_dict`)."""
    return e.as_dict()


def event_line(e: Event) -> str:
    """An event on one line; its fields' control characters shown (`visible`)."""
    fields = " ".join(f"{k}={v}" for k, v in e.fields.items() if v != "")
    return visible(f"{fmt_ms(e.ms)}  {e.id:<18} {e.type:<20} {fields}")


def tenant_table(rows: list[dict[str, Any]]) -> Table:
    """Tenants: weight, cap, devices held (a tenant at its cap in bold), tasks queued."""
    from rich.table import Table

    t = Table(title="tenants", title_justify="left")
    for col in ("tenant", "weight", "max devices", "held", "queued"):
        t.add_column(col, justify="left" if col == "tenant" else "right")
    for x in rows:
        cap = x["max_devices"]
        held = str(x["held"])
        if cap and x["held"] >= cap:
            held = f"[bold]{held} (at cap)[/]"
        t.add_row(x["tenant"], str(x["weight"]), str(cap or "-"), held, str(x["queued"]))
    return t


SHOW_LINES = 20  # lines of a result or error ``task show`` prints


def last_lines(text: str, n: int = SHOW_LINES) -> tuple[str, int]:
    """The last ``n`` lines of ``text`` and how many lines came before them."""
    lines = text.rstrip("\n").split("\n")
    return "\n".join(lines[-n:]), max(0, len(lines) - n)


def plain_fields(rows: list[tuple[str, str]]) -> str:
    """Name/value rows as two columns (two spaces apart); a value's further lines start
    under its first."""
    width = max((len(name) for name, _ in rows), default=0) + 2
    out = []
    for name, value in rows:
        first, *rest = value.split("\n")
        out.append(f"{name:<{width}}{first}".rstrip())
        out += [(" " * width + line).rstrip() for line in rest]
    return "\n".join(out)


def plain_table(title: str, header: list[str], rows: list[list[str]]) -> str:
    """A titled table of columns two spaces apart, each as wide as its widest cell."""
    widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]
    lines = [title]
    for row in (header, *rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


TIME_FIELDS = ("lease_expires_at", "queue_deadline")


def progress_line(p: dict[str, Any] | None, with_time: bool = False) -> str:
    """A task's progress as one line: ``40% step 3/7`` (``-`` for none); ``with_time``
    adds when it was said."""
    if not p:
        return "-"
    text = f"{int(float(p['fraction']) * 100)}%"
    if p.get("text"):
        text += f" {p['text']}"
    if with_time and p.get("at"):
        text += f" (at {fmt_ms(p['at'])})"
    return text


def task_text(data: dict[str, Any]) -> str:
    """``task show``'s text of a task given as its JSON (`task_json`): every field (times in
    UTC, the last lines of a result or error), then its roles and attempts as tables."""
    hide = {"attempts", "roles"} | (set() if data.get("gang") else {"gang", "role", "leader"})
    rows = []
    for name, value in data.items():
        if name in hide:
            continue
        if name.endswith("_at") or name in TIME_FIELDS:
            value = fmt_ms(value)
        if name == "progress" and value:
            value = progress_line(value, with_time=True)
        if name in ("result", "error") and value:
            value, before = last_lines(str(value))
            if before:
                value = f"({before} earlier lines not shown)\n{value}"
        rows.append((name, "-" if value in (None, "", []) else str(value)))
    parts = [plain_fields(rows)]
    if data.get("preempted_by"):
        stopping = data.get("status") in ("assigned", "dispatched")
        parts[0] += f"\n{'being preempted' if stopping else 'preempted'} by {data['preempted_by']}"
    if data.get("attempt"):
        parts[0] += f"\nthe whole output: deviceq task logs {data['id']}"
    roles = data.get("roles") or {}
    if roles:
        header = ["role", "driver_type", "tags", "device", "host", "status"]
        leader = next(iter(roles))
        parts.append(plain_table("roles", header, [
            [name + (" (leader)" if name == leader else ""), r.get("driver_type") or "any",
             ",".join(r.get("tags") or ()) or "-", r.get("device_id") or "-",
             r.get("host_id") or "-", r.get("status") or "-"]
            for name, r in roles.items()
        ]))  # fmt: skip
    if data.get("attempts"):
        header = ["#", "lease", "host", "device", "assigned", "ended", "outcome", "kind"]
        parts.append(plain_table("attempts", header, [
            [str(a["attempt"]), a["lease_id"], a["host_id"], a["device_id"],
             fmt_ms(a["assigned_at"]), fmt_ms(a["ended_at"]), a["outcome"],
             a.get("failure_kind") or "-"]
            for a in data["attempts"]
        ]))  # fmt: skip
    return "\n\n".join(parts)


PIPE_WIDTH = 10_000  # columns when not a terminal: tables are never cut or wrapped


def console_for_tables() -> Console:
    """The console for a command's tables: the terminal's width on a terminal; when piped or
    redirected, plain text wide enough that no column is cut (``task list | grep ...``)."""
    from rich.console import Console

    c = Console()
    if c.is_terminal:
        return c
    return Console(width=PIPE_WIDTH, no_color=True, highlight=False)


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))
