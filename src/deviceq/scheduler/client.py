"""`SchedulerClient`: what only the scheduler does on Redis — commit proposed pairs
(``lua/assign.lua``, fenced by the leader epoch), write next-task hints (``lua/plan_ahead.lua``),
run the expiry scan (``lua/expire.lua``) and hold the leader lease (``lua/leader.lua``). The
operator's API is `deviceq.ops.admin.PoolAdmin`; the host's is
`deviceq.host.redis_link.HostClient`; the producer's `deviceq.producer.Client`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ..core.connection import PoolConnection
from ..core.errors import DeviceqError
from ..core.pacing import pacer_for
from ..core.script_args import ASSIGN, GANG_ASSIGN, PLAN_AHEAD
from ..core.validation import validate_id

COMMIT_CHUNK = 1000  # pairs per assign.lua call at most; the pacer sizes them by time
COMMIT_FIRST = 50  # the first chunk's size, before any call was timed
# the smallest chunk: assign.lua's own budget bounds a call's Redis time (the pairs past it
# answer "later"), while a call's wall time, which the pacer measures, is mostly its round
# trip on a busy host: sized by that alone, a pass's few pairs would go one call each
COMMIT_LEAST = COMMIT_FIRST
COMMIT_BUDGET_US = 2500  # a call's time budget in assign.lua: the pairs past it come back later
HINT_CHUNK = 1000  # hints per plan_ahead.lua call at most

EXPIRE_KINDS = ("requeued", "failed", "cancelled", "unschedulable", "more", "trimmed", "retried")
"""What an expiry batch answers, in the order of ``lua/expire.lua``'s reply."""


@dataclass(frozen=True)
class Lead:
    """The answer of a leader-lease attempt: ``leads`` with fencing ``epoch``, or the
    ``epoch`` and ``owner`` of the scheduler that leads instead."""

    epoch: int
    leads: bool
    owner: str | None = None


class SchedulerClient(PoolConnection):
    """The scheduler's side of the protocol on one pool."""

    def commit(self, pairs: list[tuple[str, str]], fence: int | str = "") -> list[str]:
        """Commit proposed (task_id, device_id) pairs, each re-validated and committed on its
        own. Returns per pair ``ok:LEASE_ID`` or ``err:REASON``. The pairs go in chunks
        (`core.pacing.Pacer`: sized from the calls' durations toward about 2.5 ms a call, never
        below ``COMMIT_LEAST`` pairs), and each call stops once its time budget
        (``COMMIT_BUDGET_US``) is spent: the pairs it did not reach go in the next call. With
        ``fence`` (the scheduler's leader epoch) a call is refused with Fenced unless that epoch
        still leads: the pairs of earlier chunks stay committed (each was valid when made)."""
        checked = [
            (validate_id(task_id, "task id"), validate_id(device_id, "device id"))
            for task_id, device_id in pairs
        ]
        if not checked:  # still checks the fence
            return [str(x) for x in self._run("assign", [str(fence), "0", ASSIGN.pack([])])]
        pacer = pacer_for(self, "assign", COMMIT_FIRST, COMMIT_LEAST)
        out: list[str] = []
        while len(out) < len(checked):
            rest = checked[len(out) :]
            part = rest[: pacer.next_size(len(rest), COMMIT_CHUNK)]
            pairs_arg = ASSIGN.pack({"task_id": t, "device_id": d} for t, d in part)
            args: list[Any] = [str(fence), str(len(part)), pairs_arg, str(COMMIT_BUDGET_US)]
            t = time.perf_counter()
            answers = [str(x) for x in self._run("assign", args)]
            # the pairs past the call's time budget answer "later" (always after the first)
            done = answers.index("later") if "later" in answers else len(answers)
            if done == 0:
                raise DeviceqError("assign.lua looked at none of the pairs it was sent")
            pacer.record(done, time.perf_counter() - t)
            out += answers[:done]
        return out

    def plan_ahead(self, pairs: list[tuple[str, str]], fence: int | str = "") -> int:
        """Write next-task hints: for each (task_id, device_id) pair, ``lua/plan_ahead.lua`` sets
        the device's ``next_task`` field to the task (replacing an older hint; a device that no
        longer exists is skipped), so that the report freeing the device assigns that task at
        once if it still passes every check of an assignment. A hint reserves nothing: the
        task stays queued. Sent in calls of at most ``HINT_CHUNK`` pairs; no call for no
        pair. Returns the number of hints written. Raises Fenced as ``commit`` (the hints of
        earlier calls stay written) and InvalidInput for a bad id (nothing sent)."""
        checked = [
            (validate_id(task_id, "task id"), validate_id(device_id, "device id"))
            for task_id, device_id in pairs
        ]
        written = 0
        for i in range(0, len(checked), HINT_CHUNK):
            part = checked[i : i + HINT_CHUNK]
            packed = PLAN_AHEAD.pack({"task_id": t, "device_id": d} for t, d in part)
            written += int(self._run("plan_ahead", [str(fence), str(len(part)), packed]))
        return written

    def commit_gang(self, task_id: str, devices: list[str], fence: int | str = "") -> str:
        """Place a multi-device task: one device per role, in its role order, all or none
        (``lua/gang_assign.lua``). Returns ``ok:ATTEMPT`` or ``err:REASON``; Fenced as
        ``commit``."""
        packed = GANG_ASSIGN.pack({"device_id": validate_id(d, "device id")} for d in devices)
        args = [str(fence), validate_id(task_id, "task id"), str(len(devices)), packed]
        return str(self._run("gang_assign", args))

    def preempt(self, urgent_id: str, victim_id: str, device_id: str, fence: int | str) -> str:
        """Let queued task ``urgent_id`` take ``device_id`` from ``victim_id``, running on it
        (``lua/preempt.lua``: every rule checked again). Returns ``ok`` or ``err:REASON``;
        Fenced unless ``fence`` is the leader's epoch."""
        args = [
            str(fence),
            validate_id(urgent_id, "task id"),
            validate_id(victim_id, "task id"),
            validate_id(device_id, "device id"),
        ]
        return str(self._run("preempt", args))

    def expire(self, limit: int = 1000, budget_ms: float | None = None) -> dict[str, int]:
        """One bounded expiry batch: leases past expiry, queue deadlines, retention trim
        (each at most ``limit``, and with ``budget_ms`` only as many as fit in that much
        Redis time, each step at least one); ``more`` says whether any is left."""
        args = [str(int(limit))]
        if budget_ms is not None:
            args.append(str(max(1, round(budget_ms * 1000))))
        out = self._run("expire", args)
        return {k: int(v) for k, v in zip(EXPIRE_KINDS, out, strict=True)}

    def release_cooled(self, limit: int = 500) -> int:
        """Let go the devices whose cooldown gate's time is up (``gate_eval.lua :due``, at
        most ``limit``). Returns how many were released."""
        _, freed = self._run("gate_eval", [":due", str(int(limit))])
        return int(freed)

    def lead(self, owner: str, ttl_ms: int) -> Lead:
        """Acquire or renew the leader lease for ``owner`` (a fencing epoch per leadership)."""
        res = self._run("leader", [owner, str(int(ttl_ms)), "acquire"])
        return Lead(int(res[0]), bool(int(res[1])), str(res[2]) if len(res) > 2 else None)

    def step_down(self, owner: str) -> bool:
        """Release the leader lease if ``owner`` holds it."""
        return bool(int(self._run("leader", [owner, "1", "release"])))

    def leader(self) -> tuple[str, int] | None:
        """The current leader's (owner, epoch), or None."""
        raw = self.redis.get(self.keys.leader)
        if not raw:
            return None
        owner, _, epoch = str(raw).rpartition(":")
        return owner, int(epoch)
