"""THE rule for whether a device may take work now and, when not, why, in Python.

``device_blocker`` in ``lua/lib/eligibility.lua`` is the rule the scripts enforce (the truth: it
decides membership of the ``idle`` candidates and which assignments ``assign.lua`` refuses);
``device_blocker`` here mirrors it and is tested against it over every combination of its
fields (tests/scheduler/test_constraints.py). ``verdict`` adds the host's side
(`deviceq.core.liveness`) and gives every reason in precedence order: the first names the
device's effective state, which ``status``, ``device list``, ``explain``, ``verify`` and the
dashboard show."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .vocabulary import BLOCKERS, DEVICE_BLOCKERS

if TYPE_CHECKING:
    from .models import Host, PooledDevice

GATE_FIELDS = ("state", "reserved_by", "quarantined", "held", "booked_until", "health", "gated")
"""The device hash fields the rule reads (HMGET them in this order)."""

DEVICE_REASONS = DEVICE_BLOCKERS
"""The device's own reasons, in precedence order (``busy``/``offline``: its reported state;
`deviceq.core.vocabulary.DEVICE_BLOCKERS`)."""

REASONS = BLOCKERS
"""Every reason ``verdict`` gives, in precedence order (`deviceq.core.vocabulary.BLOCKERS`):
the device's own with its host's interleaved (a dead host outranks all but a quarantine; a
drain or a host's lost lease only shows on a device that would otherwise be idle)."""

STATE_OF_REASON = {"host_draining": "draining", "host_suspect": "suspect"}
"""The effective state a first reason shows as (any other reason is its own word)."""

STATES = (
    "idle", "reserved", "busy", "offline", "draining", "suspect", "held", "checking",
    "unhealthy", "gated", "quarantined", "host_dead", "booked",
)  # fmt: skip
"""Effective device states, in the order ``status`` shows them. ``reserved``: a lease holds it
(assigned or running); ``booked``: reserved for a person (``deviceq reserve``); ``draining``:
its host is drained or shutting down; ``suspect``: a lease on it (or on its host) expired,
``held``: its host handed an assignment back (both until the host's next heartbeat);
``checking``: its host's health check runs on it or is due; ``unhealthy``: the last health
check failed (out of service until one passes); ``gated``: a gate holds it (``deviceq
gate``: e.g. its battery is low) until the gate lets it go; ``host_dead``: its host's
heartbeat is older than ``host_timeout``."""


def device_blocker(fields: Mapping[str, str | None]) -> str | None:
    """Why a device with hash ``fields`` (`GATE_FIELDS`) is not an idle candidate, or None
    when it is one: the first of `DEVICE_REASONS` that applies (the Lua rule, mirrored)."""
    if fields.get("quarantined") == "1":
        return "quarantined"
    if fields.get("reserved_by"):
        return "reserved"
    if fields.get("booked_until"):
        return "booked"
    held = fields.get("held")
    if held:
        return "suspect" if held == "suspect" else "held"
    health = fields.get("health")
    if health in ("checking", "unhealthy"):
        return health
    if fields.get("gated"):
        return "gated"
    state = fields.get("state")
    if state != "idle":
        return state if state == "busy" else "offline"
    return None


def device_blockers(fields: Mapping[str, str | None]) -> list[str]:
    """Every one of the device's own reasons that applies, in precedence order (the first is
    `device_blocker`'s answer)."""
    out = []
    if fields.get("quarantined") == "1":
        out.append("quarantined")
    if fields.get("reserved_by"):
        out.append("reserved")
    if fields.get("booked_until"):
        out.append("booked")
    held = fields.get("held")
    if held:
        out.append("suspect" if held == "suspect" else "held")
    if fields.get("health") in ("checking", "unhealthy"):
        out.append(str(fields["health"]))
    if fields.get("gated"):
        out.append("gated")
    state = fields.get("state")
    if state != "idle":
        out.append(state if state == "busy" else "offline")
    return out


def gate_fields(device: PooledDevice) -> dict[str, str | None]:
    """A device model's `GATE_FIELDS` as they are stored."""
    return {
        "state": device.state.value,
        "reserved_by": device.reserved_by or "",
        "quarantined": "1" if device.quarantined else "0",
        "held": device.held or "",
        "booked_until": str(device.booked_until) if device.booked_until else "",
        "health": device.health or "",
        "gated": device.gated or "",
    }


@dataclass(frozen=True)
class Verdict:
    """What a device can do now: its effective ``state`` (one of `STATES`) and every reason
    it cannot take work, in precedence order (empty when it is an idle candidate on a host
    that may take work)."""

    state: str
    reasons: tuple[str, ...]

    @property
    def assignable(self) -> bool:
        return not self.reasons


def host_reason(host: Host | None) -> str | None:
    """Why a device's host may not take new work (`deviceq.core.liveness.unplaceable` on a
    host model whose liveness was read), or None."""
    if host is None or not host.alive:
        return "host_dead"
    if host.draining or host.stopping:
        return "host_draining"
    if host.suspect:
        return "host_suspect"
    return None


def verdict(device: PooledDevice, host: Host | None) -> Verdict:
    """The device's effective state and reasons, the device's own (the Lua rule) with its
    host's (the liveness rule) in `REASONS` order."""
    found = set(device_blockers(gate_fields(device)))
    h = host_reason(host)
    if h:
        found.add(h)
    reasons = tuple(r for r in REASONS if r in found)
    if not reasons:
        return Verdict("idle", ())
    return Verdict(STATE_OF_REASON.get(reasons[0], reasons[0]), reasons)
