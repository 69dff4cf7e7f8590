"""What ``deviceq status`` shows: the rich view of one pool's status (counts, queues, devices,
hosts, leases, tenants, reservations) and the one-line-per-pool view of ``--all-pools``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .render import fmt_age, fmt_ms, tenant_table

if TYPE_CHECKING:
    from rich.console import RenderableType


def _constraints(driver_type: str | None, tags: list[str] | tuple[str, ...]) -> str:
    return " ".join(filter(None, [driver_type or "*", *tags]))


def _strategy_shown(data: dict[str, Any]) -> bool:
    """The strategy in force is named when it is not the default, or when it ignores the
    priority of some queued task (``--json`` always has it)."""
    st = data.get("strategy")
    if not st:
        return False
    if st["recorded"] and st["name"] != "fifo_match":
        return True
    return not st["orders_by_priority"] and any(q.get("priority") for q in data["queues"])


def render_status(data: dict[str, Any]) -> RenderableType:
    """The rich view of ``status.pool_status`` data."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    counts = data["counts"]
    lead = data["leader"]
    head = Text.assemble(
        ("pool ", "dim"),
        (data["pool"], "bold"),
        ("   leader ", "dim"),
        (f"{lead['owner']} (epoch {lead['epoch']})" if lead else "none", "" if lead else "yellow"),
        *(
            [("   strategy ", "dim"), (data["strategy"]["text"], "")]
            if _strategy_shown(data)
            else []
        ),
        *(
            [
                ("   PAUSED", "bold yellow"),
                (f" by {data['paused']['by']}" if data["paused"].get("by") else "", "yellow"),
                (f" ({data['paused']['reason']})" if data["paused"]["reason"] else "", "yellow"),
                (": nothing new is assigned (deviceq resume)", "yellow"),
            ]
            if data.get("paused")
            else []
        ),  # fmt: skip
        "\n",
        *[(f"{k} {v}  ", "bold red" if k == "failed" and v else "") for k, v in counts.items()],
    )
    parts: list[RenderableType] = [head]
    rd = data.get("redis") or {}
    if rd and "error" not in rd:
        evicting = rd.get("maxmemory_policy") not in (None, "noeviction")
        parts.append(Text.assemble(
            ("redis ", "dim"), f"{rd.get('redis_version')} {rd.get('role')}",
            ("  aof ", "dim"), "on" if rd.get("aof_enabled") else "off",
            ("  replicas ", "dim"), str(rd.get("connected_replicas")),
            ("  maxmemory-policy ", "dim"),
            (str(rd.get("maxmemory_policy")), "bold red" if evicting else ""),
            ("  durability ", "dim"), str(data.get("durability", "none")),
        ))  # fmt: skip

    q = Table(title="queued by constraints", title_justify="left")
    for col in ("constraints", "prio", "depth", "oldest wait", "devices", "idle", "signature"):
        numeric = col in ("prio", "depth", "devices", "idle")
        q.add_column(col, justify="right" if numeric else "left", no_wrap=col == "signature")
    for b in data["queues"]:
        cons = _constraints(b["driver_type"], b["tags"])
        devices = str(b["matching_devices"])
        if b["unmatchable"]:
            cons, devices = f"[bold red]{cons}[/]", "[bold red]none[/]"
        q.add_row(
            cons,
            str(b["priority"]),
            str(b["depth"]),
            fmt_age(b["oldest_wait_ms"]),
            devices,
            str(b["idle_matching"]),
            b["sig"],
        )
    if not data["queues"]:
        q.add_row("queue empty", "", "", "", "", "", "")
    parts.append(q)
    if data.get("tenants"):
        parts.append(tenant_table(data["tenants"]))

    d = Table(title=f"devices ({data['devices']['total']})", title_justify="left")
    by_state = data["devices"]["by_state"]
    for name in by_state:
        d.add_column(name, justify="right")
    d.add_row(
        *[
            f"[bold red]{n}[/]" if n and name in ("quarantined", "host_dead", "offline") else str(n)
            for name, n in by_state.items()
        ]
    )
    parts.append(d)

    h = Table(title="hosts", title_justify="left")
    for col in ("host", "alive", "draining", "last heartbeat", "devices"):
        h.add_column(col)
    for x in data["hosts"]:
        h.add_row(
            x["host_id"],
            "[green]yes[/]" if x["alive"] else "[bold red]no[/]",
            "[yellow]yes[/]" if x["draining"] else "no",
            f"{fmt_age(x['heartbeat_age_ms'])} ago" if x["heartbeat_age_ms"] else "never",
            str(len(x["devices"])),
        )
    parts.append(h)

    if data["leases"]:
        lt = Table(title="leases expiring next", title_justify="left")
        for col in ("task", "status", "host", "device", "attempt", "expires in"):
            lt.add_column(col)
        for x in data["leases"]:
            left = x["expires_in_ms"]
            lt.add_row(
                x["task"],
                x["status"] or "-",
                x["host_id"] or "-",
                x["device_id"] or "-",
                f"{x['attempt']}/{x['max_attempts']}",
                f"[bold red]{fmt_age(left)}[/]" if left < 5000 else fmt_age(left),
            )
        parts.append(lt)

    if data["failures"]:
        ft = Table(title="recent failures", title_justify="left")
        for col in ("task", "kind", "finished", "attempt", "device", "error"):
            ft.add_column(col)
        for x in data["failures"]:
            ft.add_row(
                x["task"],
                x["failure_kind"] or "-",
                fmt_ms(x["finished_at"]),
                f"{x['attempt']}/{x['max_attempts']}",
                x["device_id"] or "-",
                (x["error"] or "")[:60],
            )
        parts.append(ft)
    if data.get("reservations"):
        rt = Table(title="reservations (deviceq reserve)", title_justify="left")
        for col in ("device", "host", "reserved by", "until", "ends in"):
            rt.add_column(col)
        for x in data["reservations"]:
            rt.add_row(
                x["device_id"],
                x["host_id"] or "-",
                x["reserved_by"],
                fmt_ms(x["reserved_until"]),
                fmt_age(x["reserved_until"] - data["time_ms"]),
            )
        parts.append(rt)
    for x in data.get("attention", []):
        parts.append(Text(f"device {x['device_id']} (host {x['host_id']}) needs attention: "
                          f"{x['why']}", style="bold yellow"))  # fmt: skip
    if data["unmatchable_tasks"]:
        parts.append(
            Text(
                f"{data['unmatchable_tasks']} queued task(s) match no registered device: they wait "
                "until such a device registers (or their queue timeout). See `deviceq explain ID`.",
                style="bold red",
            )
        )
    return Group(*parts)


def render_all_pools(data: dict[str, Any]) -> RenderableType:
    """``status --all-pools``: a line per pool."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"{len(data['pools'])} pool(s)"
                  + (f" on {len(data['nodes'])} cluster shard(s)" if data["cluster"] else ""),
                  title_justify="left")  # fmt: skip
    for col in ("pool", "node", "queued", "running", "done", "failed", "cancelled", "hosts alive",
                "devices idle/all", "leader"):  # fmt: skip
        table.add_column(col, justify="right" if col not in ("pool", "node", "leader") else "left")
    for p in data["pools"]:
        if "error" in p:
            table.add_row(p["pool"], p["node"], f"[red]{p['error']}[/]")
            continue
        c = p["counts"]
        table.add_row(
            p["pool"], p["node"], str(c["queued"]), str(p["running"]), str(c["done"]),
            str(c["failed"]), str(c["cancelled"]), f"{p['hosts_alive']}/{p['hosts']}",
            f"{p['devices_by_state'].get('idle', 0)}/{p['devices']}", p["leader"] or "none",
        )  # fmt: skip
    parts: list[RenderableType] = [table]
    if data["truncated"]:
        parts.append(Text("(more pools than shown)", style="bold yellow"))
    return Group(*parts)
