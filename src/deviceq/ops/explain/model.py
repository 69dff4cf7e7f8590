"""What ``explain`` answers: an `Explanation` of `Reason`s, and the time formats its
sentences use."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any


@dataclass
class Reason:
    """One reason, machine-readable ``code`` plus a sentence and a count where it applies."""

    code: str
    message: str
    count: int = 0
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class Explanation:
    """Why a task is where it is. ``summary`` is one sentence; ``reasons`` the details;
    ``counts`` the device classification (queued tasks only)."""

    task_id: str
    status: str
    summary: str
    reasons: list[Reason] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    constraints: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        lines = [f"{self.task_id} {self.status}: {self.summary}"]
        for r in self.reasons:
            lines.append(f"  - [{r.code}] {r.message}")
        return "\n".join(lines)


def at(ms: int) -> str:
    """A Redis time (ms) as UTC text."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def secs(at_ms: int | None, now: int) -> str:
    """How long from ``now`` until ``at_ms`` (``-`` when there is no such time)."""
    if not at_ms:
        return "-"
    return f"{(at_ms - now) / 1000:.1f}s"
