"""Delta heartbeats: what a host last got through to Redis, and what it sends next.

A host keeps, per session, the device rows (``device_id driver_type tags state reason``) of
its last heartbeat that got through and the version Redis stored with it. The next heartbeat
sends only the rows that changed (a device the host no longer has as state ``gone``) with
that version (``lua/heartbeat.lua`` mode ``delta``); Redis applies them only when the version
is the one it keeps, else answers ``full`` -- after a restart that lost writes, a failover, a
new session, a lost reply -- and the host sends its full snapshot in chunks (mode ``full``)
and ends it (mode ``commit``, repeated while it answers ``more``: the devices left out go
offline a bounded number per call). Each call is bounded, so no heartbeat call holds Redis for
long, whatever the host's device count: a chunk holds at most `CHUNK` devices, fewer when the
calls take longer than `PACE_MS` (`deviceq.core.pacing`: each call's time sizes the next
chunk).

A device's attributes ride on its row (the optional field ``attrs``, `attrs_text`): given
`beat` the attributes the host reports (device -> name -> stored form), a delta carries a
device whose attributes changed since the last heartbeat that got through (only the changed
ones, removals as ``-NAME``), even when its state did not; a full snapshot carries every
device's attributes. An unchanged attribute costs nothing.

`HeartbeatSync.beat` runs the protocol over a `HeartbeatCall`: `deviceq.host.redis_link.HostClient`
calls the script, `deviceq.host.http_link.ApiHostClient` the API's heartbeat route."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Protocol

from ..core.errors import DeviceqError, InvalidInput
from ..core.pacing import Pacer

CHUNK = 100  # devices per heartbeat call at most (the script takes 400)
FIRST = 40  # devices in a host's first call; the pacer sizes the next (a device's registration
# costs Redis ~50-100 us on the 2-core benchmark machine: 100 in one call held it 5-8 ms)
PACE_MS = 2.5  # the wall time per call the chunks are sized toward
LEAST = 25  # devices per call at least (a call's round trip alone, through the API, is ~ms)
GONE = "gone"  # the state of a delta row: the host no longer has this device
MAX_COMMITS = 10_000  # commit calls of one full snapshot at most (250 left-out devices each)

Row = tuple[str, ...]  # script_args.HEARTBEAT's fields in order (the optional may be left off)
Attrs = Mapping[str, Mapping[str, str]]  # device -> attribute name -> stored form (KIND:TEXT)


def attrs_text(put: Mapping[str, str], unset: Iterable[str] = ()) -> str:
    """A row's ``attrs`` field: ``NAME=KIND:TEXT`` a line for each value set, ``-NAME`` for
    each one unset (``lua/lib/attrs.lua``: names and stored forms hold no newline)."""
    return "\n".join([*(f"{k}={v}" for k, v in put.items()), *(f"-{k}" for k in unset)])


def attrs_delta(want: Mapping[str, str], have: Mapping[str, str]) -> str | None:
    """What turns ``have`` into ``want`` (`attrs_text`), or None when they are the same."""
    if want == have:
        return None
    return attrs_text({k: v for k, v in want.items() if have.get(k) != v},
                      [k for k in have if k not in want])  # fmt: skip


@dataclass(frozen=True)
class Heartbeat:
    """A heartbeat's answer: the host's device count, its devices that were idle candidates
    when last reported, the operator's drain flag, the daemon's stopping flag and the host's
    quarantined devices."""

    devices: int
    idle: int
    draining: bool
    stopping: bool = False
    quarantined: frozenset[str] = frozenset()
    renewals: tuple[Any, ...] | None = None  # the leases it renewed (HostLink.heartbeat)


@dataclass(frozen=True)
class Reply:
    """One heartbeat call's answer: ``status`` ok | full | part | more, then the heartbeat."""

    status: str
    heartbeat: Heartbeat

    @classmethod
    def parse(cls, raw: Sequence[Any]) -> Reply:
        """heartbeat.lua's reply; a 7th element (the renewals of the leases the call carried:
        renew.lua's flat triples) goes to the heartbeat's ``renewals`` as it is."""
        status, n, idle, draining, stopping, quarantined = raw[:6]
        q = frozenset(x for x in str(quarantined or "").split(",") if x)
        renewed = tuple(raw[6]) if len(raw) > 6 else None
        return cls(str(status), Heartbeat(int(n), int(idle), bool(int(draining)),
                                          bool(int(stopping)), q, renewed))  # fmt: skip


class HeartbeatCall(Protocol):
    """One heartbeat call (see ``lua/heartbeat.lua``): ``mode`` delta | full | commit; the
    ``leases`` to renew, when given, as (task_id, lease_id) pairs."""

    def __call__(self, mode: str, ver: str, arg: str, total: int, rows: Sequence[Row],
                 leases: Sequence[tuple[str, str]] = ...) -> Reply: ...  # fmt: skip


def new_version() -> str:
    return secrets.token_hex(8)


def rows_of(reports: Iterable[Any]) -> dict[str, Row]:
    """The checked rows of ``reports`` (`DeviceReport`), by device id; a device listed twice
    is refused (InvalidInput)."""
    out: dict[str, Row] = {}
    for r in reports:
        did, driver, tags, state, reason = r.args()
        if did in out:
            raise InvalidInput(f"device {did} is listed twice")
        out[did] = (did, driver, tags, state, reason)
    return out


class OutOfSync(DeviceqError):
    """Redis refused a chunk of a full snapshot twice in a row (another call of the same host
    keeps restarting the sync)."""


class HeartbeatSync:
    """What one host last got through (its rows and Redis' version of them), for one session."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._session: str | None = None
        self._sent: dict[str, Row] | None = None
        self._ver = ""
        self._pacer = Pacer(FIRST, target_ms=PACE_MS, least=LEAST)
        self._attrs: dict[str, dict[str, str]] = {}  # the attributes of _sent, by device

    def forget(self) -> None:
        """The next heartbeat sends the full snapshot."""
        with self._lock:
            self._sent, self._ver = None, ""

    def beat(
        self,
        call: HeartbeatCall,
        session: str,
        rows: dict[str, Row],
        full: bool = False,
        attrs: Attrs | None = None,
        leases: Sequence[tuple[str, str]] = (),
    ) -> Heartbeat:
        """Heartbeat ``rows``: the changes since the last one that got through, or (``full``,
        none got through in this session yet, or Redis asks for it) the full snapshot. With
        ``attrs`` (the attributes the host reports, by device: a device left out has none),
        the rows carry them too (see the module's doc); None: they are not reported. The
        ``leases`` ride on the first call (renewed whatever its device part answers): the
        heartbeat's ``renewals`` are that call's (None without leases)."""
        if leases:
            renewed: list[tuple[Any, ...] | None] = []
            inner = call

            def first(
                mode: str,
                ver: str,
                arg: str,
                total: int,
                rows: Sequence[Row],
                leases: Sequence[tuple[str, str]] = leases,
            ) -> Reply:
                if renewed:
                    return inner(mode, ver, arg, total, rows)
                reply = inner(mode, ver, arg, total, rows, leases=leases)
                renewed.append(reply.heartbeat.renewals)
                return reply

            hb = self._beat(first, session, rows, full, attrs)
            return replace(hb, renewals=renewed[0] if renewed else None)
        return self._beat(call, session, rows, full, attrs)

    def _beat(
        self,
        call: HeartbeatCall,
        session: str,
        rows: dict[str, Row],
        full: bool,
        attrs: Attrs | None,
    ) -> Heartbeat:
        with self._lock:
            if session != self._session:
                self._session, self._sent, self._ver = session, None, ""
            if not full and self._sent is not None:
                hb = self._delta(call, rows, attrs)
                if hb is not None:
                    return hb
            for _ in range(2):
                hb = self._full(call, rows, attrs)
                if hb is not None:
                    return hb
            raise OutOfSync("the full heartbeat snapshot was refused twice: try again")

    def _delta(
        self, call: HeartbeatCall, rows: dict[str, Row], attrs: Attrs | None
    ) -> Heartbeat | None:
        sent = self._sent
        assert sent is not None
        changes: list[Row] = []
        had = self._attrs
        for did, r in rows.items():
            delta = None if attrs is None else attrs_delta(attrs.get(did, {}), had.get(did, {}))
            if delta is not None:
                changes.append((*r, delta))
            elif sent.get(did) != r:
                changes.append(r)
        changes += [(did, "", "", GONE, "") for did in sent if did not in rows]
        hb: Heartbeat | None = None
        for part in self._pacer.chunks(changes, CHUNK) if changes else [changes]:
            nxt = new_version()
            beat = partial(call, "delta", self._ver, nxt, len(rows), part)
            reply = self._pacer.timed(len(part), beat)
            if reply.status != "ok":
                return None
            self._ver = nxt
            for r in part:
                if r[3] == GONE:
                    sent.pop(r[0], None)
                    self._attrs.pop(r[0], None)
                else:
                    sent[r[0]] = r[:5]
                    if len(r) > 5 and attrs is not None:
                        self._attrs[r[0]] = dict(attrs.get(r[0], {}))
            hb = reply.heartbeat
        return hb

    def _full(
        self, call: HeartbeatCall, rows: dict[str, Row], attrs: Attrs | None
    ) -> Heartbeat | None:
        self._sent, self._ver, self._attrs = None, "", {}
        sync = new_version()
        listed = list(rows.values())
        if attrs is not None:  # (every device's, '' for none: those sent before leave)
            listed = [(*r, attrs_text(attrs.get(did, {}))) for did, r in rows.items()]
        first = "first"
        for part in self._pacer.chunks(listed, CHUNK) if listed else [listed]:
            reply = self._pacer.timed(len(part), partial(call, "full", sync, first, 0, part))
            first = ""
            if reply.status != "part":
                return None
        nxt = new_version()
        for _ in range(MAX_COMMITS):
            reply = call("commit", sync, nxt, len(rows), [])
            if reply.status == "ok":
                self._sent, self._ver = dict(rows), nxt
                if attrs is not None:
                    self._attrs = {did: dict(attrs[did]) for did in rows if attrs.get(did)}
                return reply.heartbeat
            if reply.status != "more":
                return None
        raise OutOfSync("the full heartbeat snapshot did not end")
