"""Checks of preemption's state: ``preemptible`` holds only running tasks, and a device held
for the task that preempted its run (``preempt_for``) is reserved by nobody but the
preempted run or that task (invariant 7: the device is not given away before the preempted
run has stopped). A hold whose task left the queue is not a finding: ``assign.lua`` drops
it when the device is next offered."""

from __future__ import annotations

from .model import PoolState
from .results import Findings

RUNNING = ("assigned", "dispatched")


def check_preemption(st: PoolState, f: Findings) -> None:
    for tid, _ in st.preemptible:
        t = st.tasks.get(tid)
        if t is None or t.status not in RUNNING:
            f.add(
                "preemptible_not_running",
                f"preemptible holds a task that is {t.status if t else 'missing'}, not running",
                task=tid,
                key="preemptible",
            )
    for did, d in sorted(st.device_rows.items()):
        uid = d.get("preempt_for") or ""
        u = st.tasks.get(uid) if uid else None
        if u is None or u.status != "queued" or u.preempting != did:
            continue  # no hold, or one assign.lua drops (its task left the queue)
        holder = d.get("reserved_by") or ""
        if holder and holder not in (uid, u.preempting_task):
            f.add(
                "preempt_hold_given_away",
                f"the device is held for {uid} (it preempted {u.preempting_task or '?'}) but "
                f"reserved by {holder}",
                task=uid,
                device=did,
            )
