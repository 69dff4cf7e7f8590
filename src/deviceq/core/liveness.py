"""THE rule for whether a host is alive and may take new work, in Python. ``host_alive`` and
``host_placeable`` in ``lua/lib/liveness.lua`` are the rule the scripts enforce (the truth); this
mirror (for the scheduler's snapshot, ``host list``, ``status`` and ``explain``) is tested against
them on random inputs (tests/scheduler/test_constraints.py)."""

from __future__ import annotations

from collections.abc import Mapping

HOST_FIELDS = ("last_heartbeat", "draining", "stopping", "suspect")
"""The host hash fields the rule reads (HMGET them in this order)."""


def host_alive(last_heartbeat_ms: int | str | None, now_ms: int, timeout_ms: float) -> bool:
    """A host is alive while its last heartbeat is no older than ``host_timeout``."""
    try:
        hb = int(last_heartbeat_ms or 0)
    except (TypeError, ValueError):
        return False
    return hb > 0 and now_ms - hb <= timeout_ms


def unplaceable(fields: Mapping[str, str | None], now_ms: int, timeout_ms: float) -> str | None:
    """Why a host may not take new work, or None when it may: ``host_dead`` (no heartbeat
    within host_timeout), ``host_draining`` (an operator's drain or its daemon shutting down),
    ``host_suspect`` (one of its leases expired since its last heartbeat)."""
    if not host_alive(fields.get("last_heartbeat"), now_ms, timeout_ms):
        return "host_dead"
    if fields.get("draining") == "1" or fields.get("stopping") == "1":
        return "host_draining"
    if fields.get("suspect"):
        return "host_suspect"
    return None


def row(values: list[str | None] | tuple[str | None, ...]) -> dict[str, str | None]:
    """An HMGET reply of ``HOST_FIELDS`` as a mapping."""
    return dict(zip(HOST_FIELDS, values, strict=True))
