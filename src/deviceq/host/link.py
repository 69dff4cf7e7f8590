"""The host link: what a host daemon calls on its pool, one interface (`HostLink`) with two
transports — `deviceq.host.redis_link.HostClient` straight to Redis and
`deviceq.host.http_link.ApiHostClient` through ``deviceq api`` — that give the same answers
and raise the same errors (a transient outage is a ``redis.ConnectionError``), so the daemon
runs unchanged on either. The calls both make alike are written here once: the heartbeat's
delta protocol (`heartbeat_sync`) over each transport's ``heartbeat_call``, a single report
and a hand-back over ``report_many``, a health check's result with the host token scrubbed.
And the records the link passes: a device's row in a heartbeat, a started session, a
renewal, a report."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..core.attributes import check_attributes, check_key, encode, entry_args
from ..core.bounds import MAX_REASON_BYTES
from ..core.config import PoolConfig
from ..core.errors import InvalidInput
from ..core.models import Assignment, DeviceState, ScheduledTask, WorkflowDefinition
from ..core.validation import validate_id, validate_tag_list
from ..core.vocabulary import FailureKind
from .heartbeat_sync import Attrs, Heartbeat, HeartbeatSync, Reply, Row, rows_of
from .log_stream import LogChunk
from .progress import ProgressUpdate

HEALTH_OUTPUT_BYTES = 2000  # the tail of a health check's output kept on the device hash


def clean_reason(text: str | None) -> str:
    """A device state reason as the heartbeat accepts it: printable, at most 200 bytes."""
    s = "".join(c if c.isprintable() else " " for c in (text or ""))
    data = s.encode()[:MAX_REASON_BYTES]
    return data.decode(errors="ignore")


ATTR_CHUNK = 100
"""Devices per attribute call (``device_attrs.lua`` takes at most 400)."""


@dataclass(frozen=True)
class DeviceReport:
    """One device in a heartbeat snapshot; ``reason`` says why it is busy or offline."""

    device_id: str
    driver_type: str
    tags: tuple[str, ...] = ()
    state: DeviceState = DeviceState.idle
    reason: str = ""

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
            ",".join(validate_tag_list(self.tags)),
            state,
            clean_reason(self.reason) if state != "idle" else "",
        ]


@dataclass(frozen=True)
class SessionInfo:
    """A started session: its fencing ``epoch``, the session it replaced ('' for none) and how
    many of the replaced session's running attempts were handed back at once."""

    epoch: int
    replaced: str
    handed_back: int


@dataclass(frozen=True)
class Renewal:
    """Result of renewing one lease: ``ok``, ``cancel`` (renewed, but stop: cancel requested)
    or ``lost`` (superseded / expired / finished: stop and report nothing). ``lease_ms`` is the
    length of the renewed lease (the pool's ``lease_ttl`` when it was renewed)."""

    task_id: str
    status: str
    expires_at: int | None = None
    reason: str | None = None
    lease_ms: int = 0

    @property
    def lost(self) -> bool:
        return self.status == "lost"


def renewals_of(leases: Sequence[tuple[str, str]], flat: Sequence[Any]) -> list[Renewal]:
    """renew.lua's reply (a flat triple per lease, in order; heartbeat.lua's 7th element) for
    ``leases``, (task_id, lease_id) pairs, read into `Renewal` s."""
    out = []
    for (task_id, _), status, value, ms in zip(
        leases, flat[::3], flat[1::3], flat[2::3], strict=True
    ):
        if status == "lost":
            out.append(Renewal(task_id, str(status), reason=str(value)))
        else:
            out.append(Renewal(task_id, str(status), expires_at=int(value), lease_ms=int(ms)))
    return out


@dataclass(frozen=True)
class Report:
    """One attempt outcome for ``HostClient.report_many``."""

    task_id: str
    lease_id: str
    outcome: str  # done | failed | cancelled | released | preempted
    failure_kind: FailureKind | str | None = None
    payload: str = ""


def output_tail(text: str, limit: int = HEALTH_OUTPUT_BYTES) -> str:
    """The last ``limit`` bytes of ``text`` at most, cut at a character boundary."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[-limit:].decode(errors="ignore")


class HostLink(ABC):
    """What a host daemon calls (see the module docstring): the transport's calls, abstract
    here, and the ones written once over them."""

    host_id: str
    session: str
    _token: str
    _hb: HeartbeatSync
    heartbeat_renews = False
    """Does `heartbeat` renew the leases it is given (else its ``renewals`` stay None)?"""

    # -- written once, over the transport's calls --------------------------------------------
    def heartbeat(
        self,
        devices: Iterable[DeviceReport],
        full: bool = False,
        attributes: Mapping[str, Mapping[str, object]] | None = None,
        stored: bool = False,
        leases: Sequence[tuple[str, str]] = (),
    ) -> Heartbeat:
        """Report this host alive with its device snapshot ``devices``: only what changed
        since the last heartbeat that got through, or (``full``, or when the pool asks for
        it) the full snapshot in chunks (see `deviceq.host.heartbeat_sync`). ``attributes``
        (device -> name -> value: what the host reports of each device, a device left out has
        none; ``stored``: already in their stored form ``KIND:TEXT``, as
        `AttributeSync.reported` gives them) ride on the same rows, only the changed ones in a
        delta; None: attributes are not reported. ``leases``, (task_id, lease_id) pairs, are
        renewed by its first call where the transport can (`heartbeat_renews`): the answer's
        ``renewals`` (`Renewal` s, as `renew` answers them), None when they were not renewed
        (renew them with `renew`)."""
        rows = rows_of(devices)
        attrs: Attrs | None = None
        if attributes is not None and stored:
            attrs = attributes  # type: ignore[assignment]  # (checked when they were encoded)
        elif attributes is not None:
            attrs = {d: {k: encode(v) for k, v in check_attributes(a).items()}
                     for d, a in attributes.items()}  # fmt: skip
        if not leases or not self.heartbeat_renews:
            return self._hb.beat(self.heartbeat_call, self.session, rows, full, attrs)
        checked = [(validate_id(t, "task id"), validate_id(lid, "lease id")) for t, lid in leases]
        hb = self._hb.beat(self.heartbeat_call, self.session, rows, full, attrs, checked)
        if hb.renewals is None:
            return hb
        return replace(hb, renewals=tuple(renewals_of(checked, hb.renewals)))

    def report_and_claim(
        self, reports: Sequence[Report], claim_max: int
    ) -> tuple[list[str], list[Assignment]]:
        """`report_many`, then claim up to ``claim_max`` assignments of this host's inbox in
        the same call where the transport can (else none: the answers alone)."""
        return self.report_many(reports), []

    def send_attributes(
        self, changes: Mapping[str, tuple[Mapping[str, object], Iterable[str]]]
    ) -> int:
        """Attribute changes of this host's devices: device id -> (values set, names unset),
        only what changed since the last call (``lua/device_attrs.lua``, at most
        `ATTR_CHUNK` devices a call). Returns how many devices' attributes changed. Raises
        InvalidInput (nothing sent), DeviceOwned (a device of another host: nothing of that
        call written)."""
        entries = [
            entry_args(validate_id(d, "device id"), check_attributes(values),
                       tuple(dict.fromkeys(check_key(n) for n in unset)))
            for d, (values, unset) in changes.items()
        ]  # fmt: skip
        return sum(
            self.attributes_call(entries[i : i + ATTR_CHUNK])
            for i in range(0, len(entries), ATTR_CHUNK)
        )

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
        """Hand an attempt back: the task is queued again at once, keeping its place (at most
        ``max_handbacks`` times; then it fails as ``rejected``)."""
        return self.report(task_id, lease_id, "released", None, reason)

    def _health_result(self, healthy: bool, output: str, reason: str) -> tuple[str, str]:
        """A check's output (its last `HEALTH_OUTPUT_BYTES`) and reason ('' when healthy) as
        stored: the check runs without the token in its environment; should it print it
        anyway (read from a file), it is never stored."""
        output = (output or "").replace(self._token, "[host token]")
        reason = "" if healthy else clean_reason(reason.replace(self._token, "[host token]"))
        return output_tail(output), reason

    # -- each transport's ---------------------------------------------------------------------
    @abstractmethod
    def host_record(self) -> dict[str, str]: ...

    @abstractmethod
    def start_session(
        self, session: str, mode: str = "start", owner: str = "", expected: str = ""
    ) -> SessionInfo: ...

    @abstractmethod
    def end_session(self) -> bool: ...

    @abstractmethod
    def claim(self, max_count: int = 1) -> list[Assignment]: ...

    @abstractmethod
    def attributes_call(self, entries: Sequence[Sequence[str]]) -> int:
        """Send encoded attribute entries (`deviceq.core.attributes.entry_args`) of this
        host's devices; the number of devices whose attributes changed."""

    @abstractmethod
    def wait_for_work(self, timeout: float) -> bool: ...

    @abstractmethod
    def wait_and_claim(self, timeout: float, max_count: int) -> list[Assignment]: ...

    @abstractmethod
    def nudge(self) -> None: ...

    @abstractmethod
    def wait_for_control(self, timeout: float) -> str | None: ...

    @abstractmethod
    def renew(self, leases: Sequence[tuple[str, str]]) -> list[Renewal]: ...

    @abstractmethod
    def report_many(self, reports: Sequence[Report]) -> list[str]: ...

    @abstractmethod
    def progress(self, updates: Sequence[ProgressUpdate]) -> list[str]:
        """Record how far running attempts are (``progress.lua``): per update ``ok`` or
        ``rejected:REASON``."""

    @abstractmethod
    def log_append(self, chunks: Sequence[LogChunk]) -> list[str]: ...

    @abstractmethod
    def set_draining(self, draining: bool = True) -> str: ...

    @abstractmethod
    def health_begin(self, device_id: str) -> bool: ...

    @abstractmethod
    def health_next(self, device_id: str) -> bool: ...

    @abstractmethod
    def health_end(
        self, device_id: str, healthy: bool, output: str = "", reason: str = ""
    ) -> str: ...

    @abstractmethod
    def health_clear(self, device_id: str) -> str: ...

    @abstractmethod
    def device_health(self, device_ids: Sequence[str]) -> dict[str, str]: ...

    @abstractmethod
    def part_statuses(self, task: ScheduledTask) -> list[str]: ...

    @abstractmethod
    def storage_warning(self, what: str) -> str | None: ...

    @abstractmethod
    def config(self) -> PoolConfig: ...

    @abstractmethod
    def get_workflow(self, name: str) -> WorkflowDefinition: ...

    @abstractmethod
    def close(self) -> None: ...

    @abstractmethod
    def heartbeat_call(
        self,
        mode: str,
        ver: str,
        arg: str,
        total: int,
        rows: Sequence[Row],
        leases: Sequence[tuple[str, str]] = (),
    ) -> Reply: ...

    @abstractmethod
    def record_artifacts(
        self, task_id: str, attempt: int, files: Sequence[tuple[str, int, str]], error: str = ""
    ) -> int: ...
