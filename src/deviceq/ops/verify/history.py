"""Checks by the event stream: follows it oldest first and judges each task's transitions (one
live lease, one terminal event, reports carrying the latest lease), then the state by it
(every assigned lease recorded, no submitted task lost, ``deadlines`` orphans)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .model import TERMINAL, PoolState
from .reader import Reader
from .results import Findings


@dataclass(slots=True)
class Trail:
    """One task's history in the stream since its ``submitted`` event (``complete``), or
    since the oldest event kept."""

    complete: bool = False
    lease: str = ""
    """The lease of its latest ``assigned`` event."""
    live: bool = False
    """A lease is live: assigned, and not expired, released or ended since."""
    terminal: str = ""
    """``TYPE ID`` of its first terminal event ("" = none yet)."""
    leases: list[str] = field(default_factory=list)
    hosts: dict[str, str] = field(default_factory=dict)
    """Lease -> the host of its ``assigned`` event (the owner of the device it was given)."""


class History:
    """Follows the event stream oldest first and judges each task's transitions."""

    def __init__(self, f: Findings) -> None:
        self.f = f
        self.trails: dict[str, Trail] = {}
        self.events = 0

    def feed(self, eid: str, fields: dict[str, str]) -> None:
        self.events += 1
        tid, kind = fields.get("task"), fields.get("type")
        if not tid or not kind:
            return
        if kind == "submitted":
            self.trails[tid] = Trail(complete=True)
            return
        tr = self.trails.get(tid)
        if tr is None:  # (a multi-device task's part: its history starts at its assignment)
            tr = self.trails[tid] = Trail(complete=kind == "assigned" and bool(fields.get("gang")))
        lease = fields.get("lease", "")
        if kind == "assigned":
            self._assigned(tid, tr, eid, lease)
            tr.hosts[lease] = fields.get("host", "")
            return
        self._host_is_assigned(tid, tr, eid, kind, lease, fields.get("host", ""))
        if kind in ("expired", "requeued"):  # (requeued: a multi-device task's parts ended)
            tr.live = False
        elif kind in ("released", "retrying"):  # retrying: failed, queued again (retry_on)
            self._lease_is_latest(tid, tr, eid, kind, lease)
            tr.live = False
        elif kind in TERMINAL:
            self._terminal(tid, tr, eid, kind, lease)

    def _assigned(self, tid: str, tr: Trail, eid: str, lease: str) -> None:
        if tr.complete and tr.live:
            self.f.add(
                "task_two_leases",
                f"assigned event {eid} grants lease {lease} while lease {tr.lease} is live",
                task=tid,
            )
        tr.lease, tr.live = lease, True
        tr.leases.append(lease)

    def _host_is_assigned(self, tid: str, tr: Trail, eid: str, kind: str, lease: str,
                          host: str) -> None:  # fmt: skip
        """An event of a lease (claimed, reported, handed back, retried) names the host that
        lease was assigned to: the one the scheduler chose, owner of the device."""
        given = tr.hosts.get(lease) if lease else None
        if given and host and host != given:
            self.f.add(
                "report_host_mismatch",
                f"{kind} event {eid} names host {host}, but its lease {lease} was assigned "
                f"to host {given}",
                task=tid,
                host=host,
            )

    def _terminal(self, tid: str, tr: Trail, eid: str, kind: str, lease: str) -> None:
        if tr.terminal:
            self.f.add(
                "terminal_twice",
                f"{kind} event {eid} after the terminal event {tr.terminal}",
                task=tid,
            )
        else:
            tr.terminal = f"{kind} {eid}"
        self._lease_is_latest(tid, tr, eid, kind, lease)
        tr.live = False

    def _lease_is_latest(self, tid: str, tr: Trail, eid: str, kind: str, lease: str) -> None:
        """An ending event carries the task's latest lease (or none, while none is live)."""
        if not tr.complete:
            return
        if lease and lease != tr.lease:
            self.f.add(
                "superseded_report",
                f"{kind} event {eid} carries lease {lease}, but the task's latest assignment "
                f"is lease {tr.lease or '(none)'}",
                task=tid,
            )
        elif not lease and tr.live:
            self.f.add(
                "superseded_report",
                f"{kind} event {eid} carries no lease while lease {tr.lease} is live",
                task=tid,
            )

    def check_against(self, st: PoolState, rd: Reader) -> None:
        """Judge the state by the history: every assigned lease has its attempt record; a
        task that was submitted and never ended still exists. Counts untraceable tasks."""
        trimmed = {tid for tid, tr in self.trails.items() if not tr.complete}
        trimmed |= set(st.tasks) - set(self.trails)
        self.f.skip("history_trimmed", len(trimmed))
        lost = []
        for tid, tr in sorted(self.trails.items()):
            t = st.tasks.get(tid)
            if t is None:
                if tr.complete and not tr.terminal and tid not in st.vanished:
                    lost.append(tid)
                continue
            recorded = {lease for lease, *_ in t.records}
            for lease in tr.leases:
                if lease not in recorded:
                    self.f.add(
                        "attempt_missing",
                        f"lease {lease} was assigned (event stream) but has no attempt record",
                        task=tid,
                    )
        back = rd.existing([rd.keys.task(tid) for tid in lost])
        for tid in lost:
            if rd.keys.task(tid) in back:
                self.f.skip("changed_during_check")
            else:
                self.f.add(
                    "task_lost",
                    "the stream holds its submission and no terminal event, but the task is gone",
                    task=tid,
                )

    def check_deadlines(self, st: PoolState) -> None:
        """A ``deadlines`` entry outlives its task when the task ended and was trimmed before
        its deadline passed (entries are dropped lazily); it is an orphan only when the
        stream shows the task never ended."""
        for tid, _ in st.deadlines:
            if tid in st.tasks or tid in st.vanished:
                continue
            tr = self.trails.get(tid)
            if tr is None or not tr.complete or tr.terminal:
                self.f.skip("deadline_entries_unjudged")
            else:
                self.f.add(
                    "orphan_index_entry",
                    f"deadlines names task {tid}, which does not exist and never ended",
                    task=tid,
                    key="deadlines",
                )
