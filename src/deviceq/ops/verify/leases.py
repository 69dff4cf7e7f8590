"""Checks of the leases: ``leases`` holds exactly the live leases, scored by their expiry; one
live lease per device, agreeing with the device's ``reserved_by``/``lease_id``;
each declared limit's count hash (``tenant_held``, ``host_held``, ...) counts the leases under
it."""

from __future__ import annotations

from collections import defaultdict

from ...core.limits import LIMITS
from .model import ACTIVE, PoolState, TaskRow, to_int
from .results import Findings


def check_leases(st: PoolState, f: Findings) -> None:
    """``leases`` holds exactly the live leases, each scored by its expiry."""
    leased = set()
    for tid, score in st.leases:
        leased.add(tid)
        t = st.tasks.get(tid)
        if t is None:
            continue  # an orphan, reported by orphans
        if t.status not in ACTIVE or t.parts:
            f.add(
                "lease_entry_stale",
                f"leases holds the task, which is {t.status or '?'} (no live lease)",
                task=tid,
            )
        elif t.lease_expires_at != int(score):
            f.add(
                "lease_entry_stale",
                f"leases scores lease {t.lease_id} at {int(score)}, its lease_expires_at is "
                f"{t.lease_expires_at}",
                task=tid,
            )
    for tid, t in st.tasks.items():
        if t.status in ACTIVE and tid not in leased and not t.parts:
            f.add(
                "lease_entry_missing",
                f"task is {t.status} with lease {t.lease_id} but has no leases entry "
                "(the expiry scan never ends it)",
                task=tid,
            )


def check_reservations(st: PoolState, f: Findings) -> None:
    """One live lease per device, and each reservation agrees with its task."""
    by_device: dict[str, list[str]] = defaultdict(list)
    for tid, t in st.tasks.items():
        if t.status not in ACTIVE or t.parts:  # (a multi-device task's parts hold its devices)
            continue
        if not t.device_id:
            f.add("reservation_mismatch", f"task is {t.status} but names no device", task=tid)
        else:
            by_device[t.device_id].append(tid)
    for did, tids in sorted(by_device.items()):
        if len(tids) > 1:
            held = ", ".join(f"{tid} (lease {st.tasks[tid].lease_id})" for tid in sorted(tids))
            f.add("device_two_leases", f"tasks {held} all hold a live lease on it", device=did)
        else:
            _task_side(st, f, did, st.tasks[tids[0]])
    for did, d in sorted(st.device_rows.items()):
        holder = d["reserved_by"] or ""
        if not holder or holder in by_device.get(did, ()):
            continue
        f.add(
            "reservation_mismatch",
            f"reserved by task {holder}, {_holder_state(st.tasks.get(holder))}",
            device=did,
            task=holder,
        )


def _holder_state(t: TaskRow | None) -> str:
    """Why the task a device names as its holder does not hold it."""
    if t is None:
        return "which does not exist"
    if t.status not in ACTIVE:
        return f"which is {t.status or '?'}"
    return f"whose lease is on device {t.device_id or '(none)'}"


def _task_side(st: PoolState, f: Findings, did: str, t: TaskRow) -> None:
    """The device an active task names is reserved by that task, under its lease."""
    d = st.device_rows.get(did)
    if d is None or did not in st.devices:
        f.add(
            "reservation_mismatch",
            f"task holds lease {t.lease_id} on device {did}, which is not registered",
            task=t.id,
            device=did,
        )
    elif (d["reserved_by"] or "") != t.id:
        f.add(
            "reservation_mismatch",
            f"task is {t.status} with lease {t.lease_id} on the device, which is reserved by "
            f"{d['reserved_by'] or 'nobody'}",
            task=t.id,
            device=did,
        )
    elif (d["lease_id"] or "") != t.lease_id:
        f.add(
            "reservation_mismatch",
            f"the device holds lease {d['lease_id'] or '(none)'} for the task, whose lease is "
            f"{t.lease_id}",
            task=t.id,
            device=did,
        )


def check_limits(st: PoolState, f: Findings) -> None:
    """Each declared limit's count hash (`deviceq.core.limits`) counts the leases (assigned or
    running) under it: single tasks by their host and tenant, the parts of multi-device tasks
    by their host (the multi-device tasks themselves hold no lease of their own)."""
    for lim in LIMITS:
        held: dict[str, int] = {}
        for t in st.tasks.values():
            if t.status in ACTIVE and not t.parts and not t.roles:
                key = lim.field(host=t.host_id or "", tenant=t.tenant or "")
                if key is not None:
                    held[key] = held.get(key, 0) + 1
        stored = st.counters.get(lim.counter, {})
        for key in sorted(set(held) | set(stored)):
            want, got = held.get(key, 0), to_int(stored.get(key)) or 0
            if want != got:
                at = " and ".join(f"{s} {v}" for s, v in lim.values(key).items())
                f.add(
                    lim.counter,
                    f"{lim.counter} counts {got} lease(s) for {at}, its tasks hold {want}",
                    key=lim.counter,
                    **({"host": lim.values(key)["host"]} if "host" in lim.scope else {}),
                )
