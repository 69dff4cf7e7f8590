"""Checks that records were written by the transitions that own them: an attempt's host is
its device's owner, and an ended attempt's end is in its device's history.

A user with direct Redis access (the producer and host ACL users included: Redis runs a
script with its caller's rights) can write a task's hash and attempt records itself. What
those writes usually leave out is what these checks look for:

- every attempt record names the host of its device: ``assign.lua`` writes it from the
  device's hash, and a device keeps its owner while it is registered (``registered_at``
  before the attempt); a record naming another host was rewritten (a host making a task its
  own to report it);
- every attempt the transition scripts end (``close_attempt`` in lua/lib/attempts.lua:
  report, cancel, expiry, session takeover, hand-back) is pushed on its device's history
  (``device:ID:history``, its last `DEVICE_RECENT` ends); a closed record whose end is
  missing from a history that still reaches back to it was closed by hand.

A writer that replays a transition's every write (its ``device:ID:history`` entry
included) leaves nothing these checks can tell from the real transition: see
``deviceq verify --scope``."""

from __future__ import annotations

from .model import DEVICE_RECENT, PoolState, TaskRow, to_int
from .results import Findings


def _owner_since(st: PoolState, did: str) -> tuple[str, int] | None:
    """The registered device's host and since when it is registered (None: not registered,
    or no registration time)."""
    d = st.device_rows.get(did)
    if d is None or did not in st.devices:
        return None
    since = to_int(d.get("registered_at"))
    host = d.get("host_id") or ""
    if since is None or not host:
        return None
    return host, since


def check_attempt_hosts(st: PoolState, f: Findings) -> None:
    """Each attempt record (and an active task's ``host_id``) names the host that owned its
    device when the attempt was assigned."""
    for tid, t in st.tasks.items():
        for n, end in enumerate(t.ends, start=1):
            if not end.device_id or not end.host_id or end.assigned_at is None:
                continue
            owner = _owner_since(st, end.device_id)
            if owner is None or owner[1] > end.assigned_at:
                continue  # registered since (removed and added again): not judged
            if end.host_id != owner[0]:
                f.add(
                    "attempt_host_mismatch",
                    f"attempt {n} names host {end.host_id}, but its device {end.device_id} "
                    f"belongs to {owner[0]} (registered before the attempt): the record was "
                    "rewritten",
                    task=tid,
                    host=end.host_id,
                    device=end.device_id,
                )


def check_attempt_ends(st: PoolState, f: Findings) -> None:
    """Each closed attempt on a registered device is in its device's history, with its
    outcome, while that history still reaches back to its end (a multi-device task's own
    record is not: its parts' records are the ones on their devices)."""
    for t in st.tasks.values():
        if t.roles or t.parts:
            continue
        for n, end in enumerate(t.ends, start=1):
            if end.outcome in ("active", "?") or end.ended_at is None or not end.device_id:
                continue
            owner = _owner_since(st, end.device_id)
            if owner is None or end.assigned_at is None or owner[1] > end.assigned_at:
                continue
            _in_history(st, f, t, n, end.device_id, end.ended_at, end.outcome)


def _in_history(st: PoolState, f: Findings, t: TaskRow, n: int, did: str, ended: int,
                outcome: str) -> None:  # fmt: skip
    history = st.device_history.get(did, [])
    if len(history) >= DEVICE_RECENT:
        oldest = min((at for *_, at in history if at is not None), default=None)
        if oldest is None or oldest >= ended:
            f.skip("attempt_ends_past_device_history")
            return
    attempt = t.ends[n - 1].attempt or n
    seen = [o for task, a, o, _ in history if task == t.id and a == attempt]
    if not seen:
        f.add(
            "attempt_end_unrecorded",
            f"attempt {attempt} ended {outcome}, but its device {did}'s history has no end "
            "of it: no transition script closed it (the record was closed by hand)",
            task=t.id,
            device=did,
        )
    elif outcome not in seen:
        f.add(
            "attempt_end_unrecorded",
            f"attempt {attempt} ended {outcome}, but its device {did}'s history says it "
            f"ended {seen[0]}: the record was rewritten",
            task=t.id,
            device=did,
        )
