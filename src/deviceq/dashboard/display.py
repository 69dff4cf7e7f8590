"""How the dashboard's pages show values (the templates' filters): times, clock times, ages
and durations, and the geometry of its small bar charts."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def fmt_time(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def fmt_clock(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M:%S")


def fmt_age(ms: int | float | None) -> str:
    if ms is None:
        return "-"
    s = ms / 1000
    if s < 0:
        return "-" + fmt_age(-ms)
    if s < 10:
        return f"{s:.1f}s"
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.0f}m"
    if s < 172800:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def fmt_ms(ms: int | float | None) -> str:
    """A duration: milliseconds under a second, else like `fmt_age`."""
    if ms is None:
        return "-"
    return f"{ms:.0f} ms" if abs(ms) < 1000 else fmt_age(ms)


def bars(values: list[float | None], width: int = 600, height: int = 120) -> dict[str, Any]:
    """Geometry of a small SVG bar chart (one bar per value, scaled to the maximum)."""
    n = max(1, len(values))
    top = max([v for v in values if v] or [0])
    slot = width / n
    out = []
    for i, v in enumerate(values):
        h = 0.0 if not v or not top else (height - 14) * v / top
        out.append({"x": round(i * slot + 1, 1), "w": round(max(1.0, slot - 2), 1),
                    "y": round(height - h, 1), "h": round(h, 1), "v": v})  # fmt: skip
    return {"bars": out, "width": width, "height": height, "max": top}
