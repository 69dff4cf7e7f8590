"""``claim.lua``'s reply read into `Assignment` s: the lease length, then each claimed task's
hash as flat field/value pairs (trusted: the script wrote them), the fields the claim changed
appended: a field named twice has its last value (``tests_list``: the task's test ids, one a
line, when it has some); last ``more`` when the script's time budget
stopped it with assignments left in the inbox (`claimed_all` is False: claim again)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.models import Assignment, ScheduledTask, trusted_model


def claimed_all(rows: list[Any]) -> bool:
    """Did the claim take all it could (False: its time budget stopped it, some are left)?"""
    return not (len(rows) > 1 and rows[-1] == "more")


def assignments(rows: list[Any]) -> list[Assignment]:
    """The assignments of one claim reply (``[]`` when the inbox was empty)."""
    lease_ms = int(rows[0])
    out = []
    for flat in rows[1:] if claimed_all(rows) else rows[1:-1]:
        h = dict(zip(flat[::2], flat[1::2], strict=True))  # (the last value of a field wins)
        task = ScheduledTask.from_hash(h, trusted=True)
        listed = h.get("tests_list")
        out.append(
            trusted_model(
                Assignment,
                {
                    "task": task,
                    "lease_id": task.lease_id,
                    "attempt": task.attempt,
                    "device_id": task.device_id,
                    "host_id": task.host_id,
                    "lease_expires_at": task.lease_expires_at,
                    "lease_ms": lease_ms,
                    "tests": listed.split("\n") if listed else None,
                },
            )
        )
    return out


def claim_rest(
    rows: list[Any], again: Callable[[int], list[Any]], max_count: int
) -> list[Assignment]:
    """The assignments of claim reply ``rows`` and, while the script's time budget stopped a
    call with some left (``more``), of the calls ``again(n)`` that take the rest, up to
    ``max_count`` in all."""
    out: list[Assignment] = []
    while True:
        out += assignments(rows)
        if claimed_all(rows) or len(out) >= max_count:
            return out
        rows = again(max_count - len(out))
