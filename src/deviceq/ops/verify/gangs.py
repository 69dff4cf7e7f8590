"""Checks of multi-device (gang) tasks: all their devices or none, and ``gangs`` holds exactly
the queued ones."""

from __future__ import annotations

from .model import ACTIVE, PoolState
from .results import Findings
from .tasks import orphans


def check_gangs(st: PoolState, f: Findings, in_gangs: set[str], waiting: set[str]) -> None:
    """A multi-device task holds all its devices or none: while it is active every part
    holds a lease of its attempt; otherwise no part holds one. ``gangs`` holds exactly the
    queued multi-device tasks not waiting out a retry."""
    orphans(st, f, "gangs", st.gangs)
    for tid in sorted(in_gangs):
        t = st.tasks.get(tid)
        if t is not None and (t.status != "queued" or not t.roles or tid in waiting):
            f.add("gang_index", f"gangs holds the task, which is {t.status or '?'}", task=tid)
    for tid, t in st.tasks.items():
        if t.roles and t.status == "queued" and tid not in in_gangs and tid not in waiting:
            f.add("gang_index", "queued multi-device task is not in gangs (never placed)", task=tid)
        if t.gang and t.status in ACTIVE:
            g = st.tasks.get(t.gang)
            if g is None or g.status not in ACTIVE:
                f.add(
                    "gang_partial",
                    f"part holds lease {t.lease_id} while its task {t.gang} is "
                    f"{g.status if g else 'gone'}",
                    task=tid,
                )
        if not t.parts or t.status not in ACTIVE:
            continue
        for pid in t.parts:
            p = st.tasks.get(pid)
            if p is None or p.status not in ACTIVE or p.attempt != t.attempt:
                state = "gone" if p is None else f"{p.status} (attempt {p.attempt})"
                f.add(
                    "gang_partial",
                    f"task is {t.status} (attempt {t.attempt}) but its part {pid} is {state}",
                    task=tid,
                )
