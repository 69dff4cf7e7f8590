"""The host-side client: what a worker daemon does on Redis, authenticated by its token."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import redis

from .connection import PoolConnection
from .errors import InvalidInput
from .models import (
    MAX_PAYLOAD_BYTES,
    Assignment,
    DeviceState,
    FailureKind,
    ScheduledTask,
    trusted_model,
    validate_id,
    validate_tags,
)


def token_digest(token: str) -> str:
    """What Redis stores and scripts compare: the token itself never reaches Redis."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class DeviceReport:
    """One device in a heartbeat snapshot."""

    device_id: str
    driver_type: str
    tags: tuple[str, ...] = ()
    state: DeviceState = DeviceState.idle

    def args(self) -> list[str]:
        try:
            state = DeviceState(self.state).value
        except ValueError:
            raise InvalidInput(
                f"invalid device state {str(self.state)[:20]!r}: use idle, busy or offline"
            ) from None
        return [
            validate_id(self.device_id, "device id"),
            validate_id(self.driver_type, "driver_type"),
            ",".join(validate_tags(self.tags)),
            state,
        ]


@dataclass(frozen=True)
class Heartbeat:
    devices: int
    idle: int
    draining: bool


@dataclass(frozen=True)
class Renewal:
    """Result of renewing one lease: ``ok``, ``cancel`` (renewed, but stop: cancel requested)
    or ``lost`` (superseded / expired / finished: stop and report nothing)."""

    task_id: str
    status: str
    expires_at: int | None = None
    reason: str | None = None

    @property
    def lost(self) -> bool:
        return self.status == "lost"


@dataclass(frozen=True)
class Report:
    """One attempt outcome for ``HostClient.report_many``."""

    task_id: str
    lease_id: str
    outcome: str  # done | failed | cancelled | released
    failure_kind: FailureKind | str | None = None
    payload: str = ""


def _tail(text: str) -> str:
    data = text.encode()
    if len(data) <= MAX_PAYLOAD_BYTES:
        return text
    return data[-MAX_PAYLOAD_BYTES:].decode(errors="ignore")


class HostClient(PoolConnection):
    """A host's side of the protocol: heartbeat, claim, renew, report.

    Every call carries the digest of the host token; a wrong one raises AuthError and changes
    nothing."""

    def __init__(
        self, redis_or_url: redis.Redis | str | None, pool: str | None, host_id: str, token: str
    ) -> None:
        super().__init__(redis_or_url, pool)
        self.host_id = validate_id(host_id, "host id")
        if not token:
            raise InvalidInput("a host token is required")
        self._digest = token_digest(token)

    def __repr__(self) -> str:  # never shows the token
        return f"HostClient(pool={self.pool!r}, host_id={self.host_id!r})"

    def heartbeat(self, devices: Iterable[DeviceReport]) -> Heartbeat:
        """Report this host alive and its full device snapshot."""
        args: list[str] = [self.host_id, self._digest]
        devs = list(devices)
        args.append(str(len(devs)))
        for d in devs:
            args += d.args()
        n, idle, draining = self._run("heartbeat", args)
        return Heartbeat(int(n), int(idle), bool(draining))

    def claim(self, max_count: int = 1) -> list[Assignment]:
        """Take up to ``max_count`` assignments from this host's inbox to ``dispatched``."""
        rows = self._run("claim", [self.host_id, self._digest, max_count])
        out = []
        for flat in rows:
            h = dict(zip(flat[::2], flat[1::2], strict=True))
            task = ScheduledTask.from_hash(h, trusted=True)
            out.append(
                trusted_model(
                    Assignment,
                    {
                        "task": task,
                        "lease_id": task.lease_id,
                        "attempt": task.attempt,
                        "device_id": task.device_id,
                        "host_id": task.host_id,
                        "lease_expires_at": task.lease_expires_at,
                    },
                )
            )
        return out

    def wait_for_work(self, timeout: float) -> bool:
        """Block until an assignment may be waiting (or ``timeout`` seconds pass)."""
        return bool(self.redis.blpop([self.keys.host_wake(self.host_id)], timeout=timeout))

    def renew(self, leases: Sequence[tuple[str, str]]) -> list[Renewal]:
        """Extend leases given as (task_id, lease_id) pairs, in one call."""
        if not leases:
            return []
        args: list[str] = [self.host_id, self._digest, str(len(leases))]
        for task_id, lease_id in leases:
            args += [validate_id(task_id, "task id"), validate_id(lease_id, "lease id")]
        flat = self._run("renew", args)
        out = []
        for (task_id, _), status, value in zip(leases, flat[::2], flat[1::2], strict=True):
            if status == "lost":
                out.append(Renewal(task_id, status, reason=str(value)))
            else:
                out.append(Renewal(task_id, status, expires_at=int(value)))
        return out

    def report_many(self, reports: Sequence[Report]) -> list[str]:
        """End attempts; per report ``ok:STATUS``, ``dup:STATUS`` or ``rejected:REASON``."""
        args: list[str] = [self.host_id, self._digest, str(len(reports))]
        for r in reports:
            kind = (
                r.failure_kind.value if isinstance(r.failure_kind, FailureKind) else r.failure_kind
            )
            args += [
                validate_id(r.task_id, "task id"),
                validate_id(r.lease_id, "lease id"),
                r.outcome,
                kind or "",
                _tail(r.payload or ""),
            ]
        return [str(x) for x in self._run("report", args)]

    def report(
        self,
        task_id: str,
        lease_id: str,
        outcome: str,
        failure_kind: FailureKind | str | None = None,
        payload: str = "",
    ) -> str:
        """End one attempt (see ``report_many``)."""
        return self.report_many([Report(task_id, lease_id, outcome, failure_kind, payload)])[0]

    def release(self, task_id: str, lease_id: str, reason: str = "handed back") -> str:
        """Hand an attempt back: the task is queued again at once, keeping its place."""
        return self.report(task_id, lease_id, "released", None, reason)

    def set_draining(self, draining: bool = True) -> str:
        """Mark this host draining (no new assignments) or active again."""
        return str(self._run("host_drain", [self.host_id, "1" if draining else "0", self._digest]))
