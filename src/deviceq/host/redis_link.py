"""The host link over Redis (`HostClient`, one transport of `deviceq.host.link.HostLink`):
what a worker daemon does on Redis, authenticated by its token.

The token itself is sent with every call and hashed by the scripts (``redis.sha1hex``); Redis
keeps only ``sha1:`` + its digest, so a process that can read the pool's keys learns nothing it
could authenticate with. A daemon also carries its **session** (see `HostClient.start_session`):
while a session is active, calls from any other session are refused (`SessionSuperseded`)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import NoScriptError

from ..core.bounds import MAX_PAYLOAD_BYTES
from ..core.connection import PoolConnection
from ..core.durability import run_durably, warn_if_unsafe
from ..core.errors import Busy, InvalidInput, NotConfirmed
from ..core.lane import lane_of
from ..core.models import Assignment, ScheduledTask
from ..core.pacing import pacer_for
from ..core.script_args import ATTEMPT_ARTIFACTS, HEARTBEAT, LOG_APPEND, RENEW, REPORT
from ..core.scripts import sha as script_sha
from ..core.scripts import typed_error
from ..core.validation import validate_id
from ..core.vocabulary import HOST_FAILURE_KINDS, REPORT_OUTCOMES, FailureKind
from .claims import assignments, claim_rest, claimed_all
from .heartbeat_sync import HeartbeatSync, Reply, Row
from .link import HostLink, Renewal, Report, SessionInfo, renewals_of
from .log_stream import LogChunk
from .progress import ProgressCalls

REPORT_CHUNK = 1000  # reports per report.lua call at most; the pacer sizes them by time
REPORT_FIRST = 16  # the first chunk's size, before any call was timed
CTL_DRAIN = 10_000  # control messages dropped with each wake-up (they are only hints)


def token_digest(token: str) -> str:
    """What Redis stores for a token (``sha1:`` + hex digest). The scripts hash the token a host
    sends and compare: the stored digest cannot be replayed as a credential."""
    return "sha1:" + hashlib.sha1(token.encode()).hexdigest()


def _check_outcome(outcome: str, kind: str) -> None:
    """report.lua's outcome and failure_kind checks (InvalidInput, the script's words)."""
    if outcome not in REPORT_OUTCOMES:
        raise InvalidInput("outcome must be done, failed, cancelled or released")
    if outcome == "failed" and kind not in HOST_FAILURE_KINDS:
        raise InvalidInput(
            "failure_kind must be runner_failed, runner_error, timeout, rejected or infrastructure"
        )
    if outcome != "failed" and kind:
        raise InvalidInput("failure_kind is only given with outcome failed")


def _tail(text: str) -> str:
    data = text.encode()
    if len(data) <= MAX_PAYLOAD_BYTES:
        return text
    return data[-MAX_PAYLOAD_BYTES:].decode(errors="ignore")


class HostClient(ProgressCalls, PoolConnection, HostLink):
    """A host's side of the protocol: session, heartbeat, claim, renew, report.

    Every call carries the host token (hashed by the script, never stored) and, once
    ``start_session`` succeeded, the session id; a wrong token raises AuthError, a superseded
    session SessionSuperseded, and nothing is changed."""

    def __init__(
        self,
        redis_or_url: redis.Redis | str | None,
        pool: str | None,
        host_id: str,
        token: str,
        session: str | None = None,
    ) -> None:
        super().__init__(redis_or_url, pool)
        self.host_id = validate_id(host_id, "host id")
        if not token or not isinstance(token, str):
            raise InvalidInput("a host token is required")
        self._token = token
        self.session = validate_id(session, "session id") if session else ""
        self._hb = HeartbeatSync()

    def __repr__(self) -> str:  # never shows the token
        return f"HostClient(pool={self.pool!r}, host_id={self.host_id!r})"

    def _auth(self) -> list[str]:
        return [self.host_id, self._token, self.session]

    # -- session -----------------------------------------------------------------------------
    def host_record(self) -> dict[str, str]:
        """The host's session fields as stored (session, session_owner, last_heartbeat)."""
        vals = self.redis.hmget(
            self.keys.host(self.host_id), "session", "session_owner", "last_heartbeat"
        )
        return dict(zip(("session", "session_owner", "last_heartbeat"),
                        (str(v or "") for v in vals), strict=True))  # fmt: skip

    def start_session(
        self, session: str, mode: str = "start", owner: str = "", expected: str = ""
    ) -> SessionInfo:
        """Start this client's session (``mode``: start, dead or takeover; see
        ``lua/session.lua``). Raises SessionActive while another daemon's session is live."""
        validate_id(session, "session id")
        res = self._run("session", [self.host_id, self._token, mode, session, owner, expected])
        self.session = session
        return SessionInfo(int(res[0]), str(res[1] or ""), int(res[2]))

    def end_session(self) -> bool:
        """End this client's session if it is still current (a clean daemon exit)."""
        if not self.session:
            return False
        res = self._run("session", [self.host_id, self._token, "end", self.session, "", ""])
        return bool(int(res))

    # -- protocol ----------------------------------------------------------------------------
    heartbeat_renews = True

    def heartbeat_call(
        self,
        mode: str,
        ver: str,
        arg: str,
        total: int,
        rows: Sequence[Row],
        leases: Sequence[tuple[str, str]] = (),
    ) -> Reply:
        """One ``lua/heartbeat.lua`` call (mode delta, full or commit) with checked rows (the
        devices packed: `deviceq.core.script_args.HEARTBEAT`) and, when given, checked leases
        to renew in the same call (its trailing argument, packed as renew.lua's:
        `deviceq.core.script_args.RENEW`; the reply's ``renewals`` are their triples)."""
        # (a row may stop short of the schema's optional fields: not given)
        devices = HEARTBEAT.pack(dict(zip(HEARTBEAT.names, r, strict=False)) for r in rows)
        args: list[Any] = [*self._auth(), mode, ver, arg, str(int(total)), str(len(rows)), devices]
        if leases:
            args.append(RENEW.pack({"task_id": t, "lease_id": lid} for t, lid in leases))
        return Reply.parse(self._run("heartbeat", args))

    def attributes_call(self, entries: Sequence[Sequence[str]]) -> int:
        """One ``lua/device_attrs.lua`` call (mode host) with encoded device entries."""
        args = ["host", *self._auth()]
        for e in entries:
            args += e
        return int(self._run("device_attrs", args))

    def claim(self, max_count: int = 1) -> list[Assignment]:
        """Take up to ``max_count`` assignments from this host's inbox to ``dispatched``: in
        several script calls when one call's time budget (2.5 ms) cannot take them all."""
        return claim_rest(self._claim_call(max_count), self._claim_call, max_count)

    def _claim_args(self, max_count: int) -> list[str]:
        return [*self._auth(), str(int(max_count))]

    def _claim_call(self, max_count: int) -> list[Any]:
        return list(self._run("claim", self._claim_args(max_count)))

    def wait_and_claim(self, timeout: float, max_count: int) -> list[Assignment]:
        """`wait_for_work` for at most ``timeout`` seconds, then `claim` up to ``max_count``,
        in one round trip where the connection allows it (`deviceq.core.lane`): the two are
        pipelined, so Redis runs the claim the moment the wait ends. The claim runs either
        way (woken or not), as a claim after a wait would."""
        lane = lane_of(self.redis)
        if lane is None:
            self.wait_for_work(timeout)
            return self.claim(max_count)
        key = self.keys.host_wake(self.host_id)
        call = ("EVALSHA", script_sha("claim"), 1, self.keys.prefix, *self._claim_args(max_count))
        woken, rows = lane.call_many(("BLPOP", key, timeout), call)
        if isinstance(woken, Exception):
            raise woken
        if isinstance(rows, NoScriptError):  # a restarted server: the claim sends its body
            return self.claim(max_count)
        if isinstance(rows, redis.ResponseError):
            raise typed_error(rows)
        return claim_rest(rows, self._claim_call, max_count)

    def wait_for_work(self, timeout: float) -> bool:
        """Block until an assignment may be waiting (or ``timeout`` seconds pass)."""
        key = self.keys.host_wake(self.host_id)
        lane = lane_of(self.redis)
        if lane is None:
            return bool(self.redis.blpop([key], timeout=timeout))
        return bool(lane.call("BLPOP", key, timeout))

    def nudge(self) -> None:
        """Wake this host's own blocking inbox wait (its daemon is stopping)."""
        self.redis.lpush(self.keys.host_wake(self.host_id), "stop")

    def wait_for_control(self, timeout: float) -> str | None:
        """Block until a control message arrives for this host (cancel requested, quarantine
        changed, session superseded, host removed, token rotated) or ``timeout`` seconds pass;
        returns the first message. Messages are hints: act on what the next renew/heartbeat
        answers. So the rest of the list is drained with the same wake-up (one ``LPOP`` of up
        to `CTL_DRAIN`): a flood of messages costs one reaction per wake-up, not one each."""
        key = self.keys.host_ctl(self.host_id)
        got = self.redis.blpop([key], timeout=max(0.01, timeout))
        if not got:
            return None
        self.redis.lpop(key, CTL_DRAIN)
        return str(got[1])

    def renew(self, leases: Sequence[tuple[str, str]]) -> list[Renewal]:
        """Extend leases given as (task_id, lease_id) pairs, in one call."""
        if not leases:
            return []
        packed = RENEW.pack(
            {
                "task_id": validate_id(task_id, "task id"),
                "lease_id": validate_id(lease_id, "lease id"),
            }
            for task_id, lease_id in leases
        )
        flat = self._run("renew", [*self._auth(), str(len(leases)), packed])
        return renewals_of(leases, flat)

    def log_append(self, chunks: Sequence[LogChunk]) -> list[str]:
        """Append chunks of runs' output to their attempts' live log streams
        (``lua/log_append.lua``); per chunk ``ok`` or ``rejected:REASON`` (the lease is not
        this host's current one: nothing written)."""
        if not chunks:
            return []
        for c in chunks:
            validate_id(c.task_id, "task id")
            validate_id(c.lease_id, "lease id")
        packed = LOG_APPEND.pack(c.item() for c in chunks)
        return [str(x) for x in self._run("log_append", [*self._auth(), str(len(chunks)), packed])]

    def report_many(self, reports: Sequence[Report]) -> list[str]:
        """End attempts; per report ``ok:STATUS``, ``dup:STATUS`` or ``rejected:REASON``. The
        reports go in chunks of at most ``REPORT_CHUNK``, sized by `core.pacing.Pacer` from
        the calls' durations (about 2.5 ms a call), each report applied whole in its call. With
        the pool's ``durability`` set, raises NotConfirmed (answers so far in ``result``) when
        the reports could not be confirmed durable: send them again (an applied one answers
        ``dup:``)."""
        return self._report(reports, 0)[0]

    def report_and_claim(
        self, reports: Sequence[Report], claim_max: int
    ) -> tuple[list[str], list[Assignment]]:
        """`report_many`, and its last call (``report.lua`` with ``claim_max``) then claims up
        to ``claim_max`` assignments of this host's inbox as `claim` does (its time budget
        too: claimed again while it says ``more``, up to ``claim_max``). Returns the answers
        and the claimed assignments. NotConfirmed (durability) carries the answers in
        ``result`` and the claimed assignments in ``claimed``: start them."""
        if claim_max <= 0 or not reports:
            return self.report_many(reports), []
        answers, rows = self._report(reports, min(int(claim_max), 1000))
        if rows is None:
            return answers, []
        return answers, claim_rest(rows, self._claim_call, claim_max)

    def _report(self, reports: Sequence[Report], claim_max: int) -> tuple[list[str], Any]:
        """The reports' answers and, with ``claim_max``, the claim reply of the last call."""
        if not reports:
            return [], None
        fields: list[dict[str, str]] = []
        for r in reports:
            kind = (
                r.failure_kind.value if isinstance(r.failure_kind, FailureKind) else r.failure_kind
            )
            if r.outcome == "cancelled":
                kind = None
            _check_outcome(r.outcome, kind or "")  # the whole batch before any chunk is sent
            fields.append(
                {
                    "task_id": validate_id(r.task_id, "task id"),
                    "lease_id": validate_id(r.lease_id, "lease id"),
                    "outcome": r.outcome,
                    "failure_kind": kind or "",
                    "payload": _tail(r.payload or ""),
                }
            )
        pacer = pacer_for(self, "report", REPORT_FIRST)
        answers: list[str] = []
        rows: Any = None
        for part in pacer.chunks(fields, REPORT_CHUNK):
            args: list[Any] = [*self._auth(), str(len(part)), REPORT.pack(part)]
            last = claim_max > 0 and len(answers) + len(part) == len(fields)
            if last:  # (the claim rides on the last call, after every report)
                args.append(str(claim_max))
            t0 = time.perf_counter()
            try:
                out = run_durably(self, "report", args)
            except NotConfirmed as exc:
                got = list(exc.result or [])
                if last and len(got) > len(part):
                    exc.claimed = assignments(got.pop())
                exc.result = answers + [str(x) for x in got]
                raise
            took, work = time.perf_counter() - t0, len(part)
            if last:
                out = list(out)
                rows = out.pop()
                work += len(rows) - (1 if claimed_all(rows) else 2)  # (its claims: work too)
            pacer.record(work, took)
            answers += [str(x) for x in out]
        return answers, rows

    def set_draining(self, draining: bool = True) -> str:
        """Mark this host's daemon as shutting down (``stopping``: no new assignments) or
        running again. An operator's drain (``PoolAdmin.drain``) is a separate flag."""
        return str(
            self._run(
                "host_drain",
                [self.host_id, "1" if draining else "0", "daemon", self._token, self.session],
            )
        )

    # -- health checks -----------------------------------------------------------------------
    def health_begin(self, device_id: str) -> bool:
        """Take one of this host's devices for a health check (``lua/device_health.lua``):
        True when it is now ``checking`` (out of the idle candidates: no task can be assigned
        to it until `health_end`); False when it holds a task's lease or is booked by a person
        (nothing changed: try later)."""
        try:
            did = validate_id(device_id, "device id")
            self._run("device_health", [*self._auth(), "begin", did])
        except Busy:
            return False
        return True

    def health_next(self, device_id: str) -> bool:
        """Mark a device for a check after the task that holds it (before that task's report):
        it is ``checking`` at once, so it does not go back among the idle candidates when the
        task ends; `health_begin` then takes it. False when it is booked by a person."""
        try:
            did = validate_id(device_id, "device id")
            self._run("device_health", [*self._auth(), "next", did])
        except Busy:
            return False
        return True

    def health_end(self, device_id: str, healthy: bool, output: str = "", reason: str = "") -> str:
        """Record the result of the check `health_begin` started: ``healthy`` puts the device
        back among the idle candidates (when nothing else keeps it out), ``unhealthy`` keeps it
        out of service with ``reason`` (at most 200 bytes). ``output`` is kept as its last
        2,000 bytes. Returns the health recorded."""
        output, reason = self._health_result(healthy, output, reason)
        args = [*self._auth(), "end", validate_id(device_id, "device id"),
                "healthy" if healthy else "unhealthy", output, reason]  # fmt: skip
        return str(self._run("device_health", args))

    def record_artifacts(
        self,
        task_id: str,
        attempt: int,
        files: Sequence[tuple[str, int, str]],
        error: str = "",
    ) -> int:
        """Record the files (name, size, sha256) uploaded for one attempt this host ran, and
        why an upload failed ('' : none); by token only (a restarted daemon may finish the
        uploads of its previous session). Raises AuthError for another host's attempt."""
        packed = ATTEMPT_ARTIFACTS.pack(
            {"name": name, "size": int(size), "sha256": sha} for name, size, sha in files
        )
        args = [self.host_id, self._token, validate_id(task_id, "task id"), str(int(attempt)),
                error, str(len(files)), packed]  # fmt: skip
        return int(self._run("attempt_artifacts", args))

    def health_clear(self, device_id: str) -> str:
        """Forget a device's health (this host no longer checks it): it is a candidate again
        when otherwise idle. Returns the health it had ('' for none)."""
        args = [*self._auth(), "clear", validate_id(device_id, "device id")]
        return str(self._run("device_health", args) or "")

    def device_health(self, device_ids: Sequence[str]) -> dict[str, str]:
        """The stored ``health`` of devices ('' when never checked or not registered)."""
        pipe = self.redis.pipeline(transaction=False)
        for d in device_ids:
            pipe.hmget(self.keys.device(d), "health")
        return {d: str(v[0] or "") for d, v in zip(device_ids, pipe.execute(), strict=True)}

    # -- reads the daemon makes --------------------------------------------------------------
    def part_statuses(self, task: ScheduledTask) -> list[str]:
        """The status of every other part of the multi-device task whose part ``task`` is
        (its leader waits until they are all ``dispatched``); '' for a part that is gone."""
        if not task.gang:
            return []
        others = [n for n in (task.roles or {}) if n != task.role]
        pipe = self.redis.pipeline(transaction=False)
        for name in others:
            pipe.hget(self.keys.task(validate_id(f"{task.gang}.{name}", "task id")), "status")
        return [str(v or "") for v in pipe.execute()]

    def storage_warning(self, what: str) -> str | None:
        """Warn (and return the warning) when Redis may evict keys (``maxmemory-policy`` not
        ``noeviction``); None otherwise or when it cannot be told."""
        try:
            return warn_if_unsafe(self.redis, what)
        except redis.RedisError:
            return None
