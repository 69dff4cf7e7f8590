"""Checks of the queue: its depth, each bucket's members and their order, ``retries``, the
buckets' heads in ``queues`` and their ``sig:SIG`` constraints."""

from __future__ import annotations

from .gangs import check_gangs
from .model import PoolState
from .results import Findings
from .tasks import orphans


def check_buckets(st: PoolState, f: Findings) -> None:
    """Queue depth, bucket membership and order, bucket heads and bucket constraints."""
    depth = len(st.status["queued"])
    total = sum(len(e) for e in st.buckets.values())
    if depth != total + len(st.retries) + len(st.gangs):
        f.add(
            "queue_depth",
            f"status:queued holds {depth} task(s), the queue buckets {total}, retries "
            f"{len(st.retries)} and gangs {len(st.gangs)}",
            key="status:queued",
        )
    members: set[tuple[str, str]] = set()
    for sig, entries in st.buckets.items():
        orphans(st, f, f"queue:{sig}", entries)
        for tid, score in entries:
            members.add((sig, tid))
            t = st.tasks.get(tid)
            why = None
            if t is None:
                continue
            if t.status != "queued":
                why = f"the task is {t.status or '?'}"
            elif t.sig != sig:
                why = f"the task's bucket is {t.sig or '(none)'}"
            elif t.seq is not None and score != t.seq:
                why = f"it is scored {score:g}, the task's seq is {t.seq:g}"
            if why:
                f.add(
                    "bucket_mismatch",
                    f"queue:{sig} holds the task but {why}",
                    task=tid,
                    key=f"queue:{sig}",
                )
    waiting = {tid for tid, _ in st.retries}
    orphans(st, f, "retries", st.retries)
    for tid in sorted(waiting):
        t = st.tasks.get(tid)
        if t is not None and (t.status != "queued" or (t.sig, tid) in members):
            f.add(
                "retry_index",
                f"retries holds the task, which is {t.status or '?'}"
                + (" and also in its bucket" if (t.sig, tid) in members else ""),
                task=tid,
                key="retries",
            )
    in_gangs = {tid for tid, _ in st.gangs}
    for tid, t in st.tasks.items():
        if t.gang or t.roles:  # parts wait in no index; multi-device tasks: check_gangs
            continue
        if t.status == "queued" and (t.sig, tid) not in members and tid not in waiting:
            f.add(
                "bucket_mismatch",
                f"task is queued but not in its bucket queue:{t.sig or '?'} (never scheduled)",
                task=tid,
            )
    _check_heads(st, f)
    check_gangs(st, f, in_gangs, waiting)


def _check_heads(st: PoolState, f: Findings) -> None:
    """``queues`` scores each non-empty bucket by its head; ``sig:SIG`` exists exactly while
    its bucket is non-empty."""
    heads = {sig: e[0][1] for sig, e in st.buckets.items() if e}
    indexed = dict(st.queues)
    for sig, head in sorted(heads.items()):
        if sig not in indexed:
            f.add(
                "queue_head",
                f"bucket queue:{sig} holds tasks but is not in queues (never scheduled)",
                key="queues",
            )
        elif indexed[sig] != head:
            f.add(
                "queue_head",
                f"queues scores bucket {sig} at {indexed[sig]:g}, its head's seq is {head:g}",
                key="queues",
            )
    for sig in sorted(set(indexed) - set(heads)):
        f.add("queue_head", f"queues names bucket {sig}, which is empty", key="queues")
    for sig in sorted(set(heads) - st.space.sigs):
        f.add(
            "bucket_constraints",
            f"bucket queue:{sig} holds tasks but sig:{sig} is missing",
            key=f"sig:{sig}",
        )
    for sig in sorted(st.space.sigs - set(heads)):
        f.add("bucket_constraints", f"sig:{sig} exists but its bucket is empty", key=f"sig:{sig}")
