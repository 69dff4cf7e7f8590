"""What the demo runs: the fleet (two hosts with sim devices), the task mix, the kill, and
the result it reports (`DemoResult`, latency percentiles)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from ...core.models import WorkflowDefinition, WorkflowStep

# -- the fleet -------------------------------------------------------------------------------

#: host id -> devices (device_id, driver_type, tags). Every constraint the demo submits can be
#: met by ``lab-a`` alone, so the work of the killed host always has somewhere to go.
DEMO_HOSTS: dict[str, list[tuple[str, str, tuple[str, ...]]]] = {
    "lab-a": [
        ("a-pixel-1", "android", ("wifi", "camera")),
        ("a-pixel-2", "android", ("wifi",)),
        ("a-chrome-1", "browser", ("headless",)),
        ("a-chrome-2", "browser", ("headless", "gpu")),
        ("a-chrome-3", "browser", ("headless",)),
    ],
    "lab-b": [
        ("b-pixel-1", "android", ("wifi", "camera")),
        ("b-pixel-2", "android", ("wifi", "nfc")),
        ("b-chrome-1", "browser", ("headless", "gpu")),
        ("b-chrome-2", "browser", ("headless",)),
    ],
}
KILLED_HOST = "lab-b"

#: short timings so that a killed host's work is requeued within seconds
DEMO_CONFIG: dict[str, float | int] = {
    "lease_ttl": 3.0,
    "claim_ttl": 3.0,
    "host_timeout": 3.0,
    "leader_ttl": 3.0,
    "max_attempts": 4,
    "quarantine_after": 0,
}

#: (goal, driver_type, tags) of the goal tasks, submitted round-robin
DEMO_GOALS: list[tuple[str, str | None, tuple[str, ...]]] = [
    ("open the settings app and enable wifi", "android", ("wifi",)),
    ("take a photo and check it uploads", "android", ("camera",)),
    ("load the landing page", "browser", ()),
    ("render the WebGL product viewer", "browser", ("gpu",)),
    ("read the battery level", None, ()),
]

DEMO_WORKFLOW = WorkflowDefinition(
    name="checkout-flow",
    description="log in, add an item to the cart, pay (demo)",
    steps=[
        WorkflowStep(name="login", goal="log in as the demo user"),
        WorkflowStep(name="cart", goal="add the first product to the cart"),
        WorkflowStep(name="pay", goal="pay with the test card"),
    ],
)
WORKFLOW_EVERY = 4  # every 4th task is a workflow task (browser, headless)

#: simulated run time of one goal (a workflow step too), for the ``sim`` runner
SIM_MIN_S, SIM_MAX_S = 0.3, 0.9
SIM_DURATION = f"uniform:{SIM_MIN_S},{SIM_MAX_S}"
#: the host is killed while a run it claimed is surely still going: at most this long after
#: the claim, minus this margin for the time the kill takes
KILL_MARGIN_MS = 100

#: events the live view keeps in view longer than the rest
INCIDENTS = frozenset({"expired", "requeued", "failed", "released", "device_quarantined",
                       "leader_elected", "host_killed"})  # fmt: skip

EMBEDDED_CHOICES = ("auto", "redis-server", "fakeredis")


# -- results ---------------------------------------------------------------------------------


@dataclass
class DemoResult:
    """What the demo did; ``ok`` is true when every submitted task ended ``done``."""

    backend: str
    redis_url: str
    pool: str
    submitted: int = 0
    goal_tasks: int = 0
    workflow_tasks: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    retried: int = 0
    lease_expiries: int = 0
    requeued: int = 0
    killed_host: str | None = None
    killed_at_s: float | None = None
    tasks_on_killed_host: int = 0  # runs the killed host had claimed and not finished
    latency_ms: dict[str, float | int | None] = field(default_factory=dict)
    retry_latency_ms: dict[str, float | int | None] = field(default_factory=dict)
    wall_s: float = 0.0
    ok: bool = False
    problem: str | None = None
    detail: str = ""  # e.g. the log tail of a daemon that died

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: list[int], q: float) -> int | None:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def latency_stats(values: list[int]) -> dict[str, float | int | None]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "max": max(values) if values else None,
    }
