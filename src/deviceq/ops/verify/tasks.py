"""Checks of the tasks themselves: each in the one status index its hash names, index entries
that name no task, one record per attempt with only the live lease's open, the host a task
names, and the ``avoid`` and host inbox entries."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from .model import ACTIVE, TERMINAL, PoolState, TaskRow
from .results import Findings


def check_status_indexes(st: PoolState, f: Findings) -> None:
    """Each task is in exactly the status index its hash names (scored by its seq while not
    terminal); past-retention terminal tasks are awaiting the expiry scan's trim."""
    where: dict[str, list[str]] = defaultdict(list)
    for s, entries in st.status.items():
        for tid, _ in entries:
            where[tid].append(s)
    for tid, t in st.tasks.items():
        found = where.get(tid, [])
        if t.gang:  # a part of a multi-device task: only its task is indexed
            if found:
                f.add(
                    "status_index_mismatch",
                    f"a part of multi-device task {t.gang} is in status:{found[0]}",
                    task=tid,
                )
            continue
        if not found:
            if t.status in TERMINAL and (t.finished_at or 0) <= st.cutoff:
                f.skip("past_retention")
            else:
                f.add(
                    "task_unindexed", f"task is {t.status or '?'} but in no status index", task=tid
                )
        elif len(found) > 1:
            two_active = sum(s in ACTIVE for s in found) > 1
            f.add(
                "task_two_leases" if two_active else "task_in_two_indexes",
                f"task is in status indexes {', '.join(found)} (its hash says {t.status or '?'})",
                task=tid,
            )
        elif found[0] != t.status:
            f.add(
                "status_index_mismatch",
                f"task is {t.status or '?'} but indexed in status:{found[0]}",
                task=tid,
            )
    for s in ("queued", *ACTIVE):
        for tid, score in st.status[s]:
            row = st.tasks.get(tid)
            if row is not None and row.status == s and row.seq is not None and score != row.seq:
                f.add(
                    "status_index_mismatch",
                    f"status:{s} scores it {score:g}, its seq is {row.seq:g}",
                    task=tid,
                )


def orphans(st: PoolState, f: Findings, index: str, entries: Iterable[tuple[str, float]]) -> None:
    """Entries of a task index whose task does not exist (past-retention terminal entries
    are awaiting the trim)."""
    terminal = index.removeprefix("status:") in TERMINAL
    for tid, score in entries:
        if tid in st.tasks or tid in st.vanished:
            continue
        if terminal and score <= st.cutoff:
            f.skip("past_retention")
            continue
        f.add(
            "orphan_index_entry",
            f"{index} names task {tid}, which does not exist",
            task=tid,
            key=index,
        )


def check_attempts(st: PoolState, f: Findings) -> None:
    """One record per attempt; the only open record is the live lease's; an attempt is
    closed when its task is not active."""
    for tid, t in st.tasks.items():
        if t.attempt is None or t.attempts_len != t.attempt:
            f.add(
                "attempt_missing",
                f"attempt is {t.attempt} but the history holds {t.attempts_len} record(s)",
                task=tid,
            )
        open_ = [i + 1 for i, (_, outcome, _) in enumerate(t.records) if outcome == "active"]
        if len(open_) > 1:
            f.add(
                "task_two_leases",
                f"attempts {', '.join(map(str, open_))} are all still open (outcome active)",
                task=tid,
            )
        if t.status in ACTIVE:
            _live_attempt(f, t)
        elif open_:
            n = open_[-1]
            f.add(
                "unclosed_attempt",
                f"task is {t.status or '?'} but attempt {n} (lease {t.records[n - 1][0]}) is "
                "still active",
                task=tid,
            )


def check_task_hosts(st: PoolState, f: Findings) -> None:
    """A task's ``host_id`` (the host whose token may report it) is its device's host or the
    host of its current attempt: any other host was written into the hash by hand."""
    for tid, t in st.tasks.items():
        if not t.host_id:
            continue
        d = st.device_rows.get(t.device_id) if t.device_id else None
        device_host = (d or {}).get("host_id") or ""
        n = t.attempt or 0
        attempt_host = t.records[n - 1][2] if 0 < n <= len(t.records) else ""
        known = {h for h in (device_host, attempt_host) if h}
        if known and t.host_id not in known:
            f.add(
                "task_host_mismatch",
                f"task is {t.status or '?'} on host {t.host_id}, but its device "
                f"{t.device_id or '(none)'} belongs to {device_host or '(unknown)'} and its "
                f"attempt {n} was assigned to {attempt_host or '(unknown)'}",
                task=tid,
                host=t.host_id,
                device=t.device_id or None,
            )


def _live_attempt(f: Findings, t: TaskRow) -> None:
    """An active task's last attempt record is open and is its lease."""
    if not t.records:
        return  # the count check above already reports a missing history
    lease, outcome, _ = t.records[-1]
    if outcome != "active":
        f.add(
            "attempt_missing",
            f"live lease {t.lease_id} has no open attempt record (the last one is {outcome})",
            task=t.id,
        )
    elif lease != t.lease_id:
        f.add(
            "task_two_leases",
            f"the open attempt is lease {lease} but the task holds lease {t.lease_id}",
            task=t.id,
        )


def check_task_entries(st: PoolState, f: Findings) -> None:
    """``avoid`` only while queued; a host inbox only holds that host's assignments."""
    for tid in sorted(st.avoid):
        t = st.tasks.get(tid)
        if t is not None and t.status != "queued":
            f.add(
                "stale_index_entry",
                f"avoid holds the task, which is {t.status or '?'} (kept only while queued)",
                task=tid,
                key="avoid",
            )
    orphans(st, f, "avoid", ((tid, 0.0) for tid in st.avoid))
    for host, entries in st.inboxes.items():
        key = f"host:{host}:inbox"
        orphans(st, f, key, ((tid, 0.0) for tid in entries))
        for tid in entries:
            t = st.tasks.get(tid)
            if t is not None and t.gang and t.status != "assigned":
                continue  # a part ended with its task: the host's next claim drops it
            if t is not None and (t.status != "assigned" or t.host_id != host):
                f.add(
                    "stale_index_entry",
                    f"{key} holds the task, which is {t.status or '?'} on host "
                    f"{t.host_id or '(none)'}",
                    task=tid,
                    host=host,
                    key=key,
                )
