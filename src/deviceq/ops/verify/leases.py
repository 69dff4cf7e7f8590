"""Checks of the leases: ``leases`` holds exactly the live leases, scored by their expiry; one
live lease per device, agreeing with the device's ``reserved_by``/``lease_id``;
``tenant_held`` counts each tenant's leases and ``host_held`` each host's."""

from __future__ import annotations

from collections import defaultdict

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


def check_tenants(st: PoolState, f: Findings) -> None:
    """``tenant_held`` counts each tenant's tasks holding a lease (assigned or running)."""
    held: dict[str, int] = {}
    for t in st.tasks.values():
        if t.tenant and t.status in ACTIVE:
            held[t.tenant] = held.get(t.tenant, 0) + 1
    stored = st.counters.get("tenant_held", {})
    for name in sorted(set(held) | set(stored)):
        want, got = held.get(name, 0), to_int(stored.get(name)) or 0
        if want != got:
            f.add(
                "tenant_held",
                f"tenant_held counts {got} device(s) for tenant {name}, its tasks hold {want}",
                key="tenant_held",
            )


def check_hosts(st: PoolState, f: Findings) -> None:
    """``host_held`` counts the leases (assigned or running) on each host's devices: single
    tasks and the parts of multi-device tasks, not the multi-device tasks themselves."""
    held: dict[str, int] = {}
    for t in st.tasks.values():
        if t.status in ACTIVE and not t.parts and not t.roles and t.host_id:
            held[t.host_id] = held.get(t.host_id, 0) + 1
    stored = st.counters.get("host_held", {})
    for host in sorted(set(held) | set(stored)):
        want, got = held.get(host, 0), to_int(stored.get(host)) or 0
        if want != got:
            f.add(
                "host_held",
                f"host_held counts {got} lease(s) on host {host}, its devices hold {want}",
                key="host_held",
                host=host,
            )
