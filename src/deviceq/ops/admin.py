"""`PoolAdmin`: the operator's API on a pool — hosts (add, rotate, remove, drain), devices
(list, quarantine), settings, manual dispatch — and the read-only views `status` and `explain`
are built on. What only the scheduler does (commit, expiry, leadership) is
`deviceq.scheduler.client.SchedulerClient`."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..core import fleet
from ..core.attributes import Value, check_attributes, check_key, decode_hash, entry_args
from ..core.config import PoolConfig
from ..core.connection import PoolConnection, warn_if_ignored
from ..core.errors import Busy, InvalidInput, NotFound
from ..core.models import Host, PooledDevice, satisfies
from ..core.priority_classes import PriorityClass, add_class, all_classes, remove_class
from ..core.replies import parse
from ..core.script_args import ASSIGN, TASK_PRIORITY
from ..core.tenants import TenantInfo, remove_tenant, set_tenant, tenant_infos
from ..core.validation import actor_args, validate_id, validate_tags
from ..core.where import compile_all, matches_all, parse_all
from ..host.redis_link import token_digest

MAX_RESERVATION_MS = 7 * 86_400_000
"""A reservation lasts 1 s to 7 days (``lua/device_reserve.lua`` enforces the same)."""
MIN_RESERVATION_MS = 1000
RESERVE_SCAN = 1000
"""``reserve --driver-type/--tag`` looks at most at this many idle devices (oldest idle
first)."""


class RemovedDevice(NamedTuple):
    """What ``remove_device`` did: the device and its host, the task it handed back (None
    when none held the device) and whether its live host still reported it."""

    device_id: str
    host_id: str
    handed_back: str | None
    still_reported: bool


@dataclass(frozen=True)
class Reservation:
    """A person's reservation ("booking") of a device: ``reserved_by`` is the note (who,
    why), ``reserved_until`` and ``reserved_at`` ms since the epoch (Redis time). Stored as
    the device hash fields ``booked_by``/``booked_until``/``booked_at`` (``reserved_by`` of
    the hash is the task whose lease holds the device) and indexed in ``bookings``."""

    device_id: str
    host_id: str | None
    reserved_by: str
    reserved_until: int
    reserved_at: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "device_id": self.device_id,
            "host_id": self.host_id,
            "reserved_by": self.reserved_by,
            "reserved_until": self.reserved_until,
            "reserved_at": self.reserved_at,
        }


def _check_duration(duration_ms: int) -> int:
    ms = int(duration_ms)
    if not MIN_RESERVATION_MS <= ms <= MAX_RESERVATION_MS:
        raise InvalidInput(
            f"a reservation lasts 1s to 7d (7 days); {ms / 1000:g}s is "
            + ("too long" if ms > MAX_RESERVATION_MS else "too short")
        )
    return ms


def _check_note(note: str, required: bool) -> str:
    if not isinstance(note, str) or len(note.encode()) > 200:
        raise InvalidInput("the note must be text of at most 200 bytes")
    if any(ord(c) < 32 or ord(c) == 127 for c in note):
        raise InvalidInput("the note must not contain control characters (newlines, tabs)")
    if required and not note:
        raise InvalidInput("a reservation needs a note (who is it for?)")
    return note


DEVICE_PAST = 20
"""Entries kept in a device's ``device:ID:history`` and ``device:ID:log`` (the Lua side
trims both to this many: ``DEVICE_RECENT`` in lua/lib/history.lua)."""


def _json_objects(raw: Iterable[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for item in raw:
        try:
            v = json.loads(item)
        except (TypeError, ValueError):
            continue
        if isinstance(v, dict):
            out.append(v)
    return out


def check_reason(reason: str) -> str:
    """A quarantine reason: text of at most 200 bytes without control characters."""
    if not isinstance(reason, str) or len(reason.encode("utf-8", "replace")) > 200:
        raise InvalidInput("the reason must be text of at most 200 bytes")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in reason):
        raise InvalidInput("the reason must be valid text (a lone surrogate is not)")
    if any(ord(c) < 32 or ord(c) == 127 for c in reason):
        raise InvalidInput("the reason must not contain control characters (newlines, tabs)")
    return reason


class PoolAdmin(PoolConnection):
    """Hosts, devices and settings of one pool."""

    # -- hosts ---------------------------------------------------------------------------------
    def add_host(self, host_id: str) -> str:
        """Create a host and return its fresh secret token (shown once; only a digest is
        stored). Raises AlreadyExists."""
        validate_id(host_id, "host id")
        token = secrets.token_urlsafe(32)
        self._run("host_add", [host_id, token_digest(token), "add"])
        return token

    def rotate_token(self, host_id: str) -> str:
        """Replace a host's token; the old one stops working at once."""
        validate_id(host_id, "host id")
        token = secrets.token_urlsafe(32)
        self._run("host_add", [host_id, token_digest(token), "rotate"])
        return token

    def remove_host(self, host_id: str, force: bool = False) -> int:
        """Delete a host and its devices; returns the number of devices removed. Refused with
        Busy while one holds a lease, unless ``force``: each such task is handed back first
        (no attempt spent: it is queued again)."""
        n, _ = self._run("host_remove", [validate_id(host_id, "host id"), "1" if force else "0"])
        return int(n)

    def remove_device(self, device_id: str, force: bool = False) -> RemovedDevice:
        """Delete one device (retired, replaced, or a ghost its host no longer reports).
        Refused with Busy while a lease holds it or its live host still reports it, unless
        ``force``: a task holding it is handed back first (no attempt spent) and its host stops
        the run; a host that still reports it registers it again at its next heartbeat."""
        host_id, task_id, reported = self._run(
            "device_remove", [validate_id(device_id, "device id"), "1" if force else "0"]
        )
        return RemovedDevice(str(device_id), str(host_id), str(task_id) or None, reported == 1)

    def drain(self, host_id: str, draining: bool = True, by: str = "") -> str:
        """No new assignments to the host (``draining=False`` resumes them). ``by`` (an id,
        '' = not recorded): who, the ``by`` field of the event."""
        who = actor_args(by)
        return str(
            self._run(
                "host_drain",
                [
                    validate_id(host_id, "host id"),
                    "1" if draining else "0",
                    "operator",
                    "",
                    "",
                    *who,
                ],
            )  # fmt: skip
        )

    # -- the pool --------------------------------------------------------------------------
    def pause(self, reason: str = "", by: str = "") -> str:
        """Stop new assignments in the whole pool (running tasks go on); ``paused`` or
        ``unchanged``. ``reason``: at most 200 bytes, no control characters. ``by`` (an id,
        '' = not recorded): who, the event's ``by`` and `paused`'s."""
        who = actor_args(by)
        return str(self._run("pool_pause", ["pause", check_reason(reason), *who]))

    def resume(self, by: str = "") -> str:
        """Assign again after `pause`; ``resumed`` or ``unchanged``. ``by`` as for `pause`."""
        who = actor_args(by)
        return str(self._run("pool_pause", ["resume", "", *who]))

    def set_priority(self, task_ids: Iterable[str], priority: int, by: str = "") -> dict[str, str]:
        """Change the priority (0-9) of queued tasks: each moves to the bucket of its new
        priority, keeping its place in submission order (``lua/task_priority.lua``). Returns
        per id ``ok``, ``same`` or ``err:REASON`` (task_not_found, task_not_queued,
        task_part); InvalidInput for a bad id or priority (nothing changed). ``by`` (an id,
        '' = not recorded): who, the events' ``by``."""
        ids = [validate_id(t, "task id") for t in task_ids]
        if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
            raise InvalidInput(f"priority must be 0-9, got {priority!r}")
        if not 1 <= len(ids) <= 1000:
            raise InvalidInput("give 1 to 1,000 task ids")
        who = actor_args(by)
        tasks = TASK_PRIORITY.pack({"task_id": t} for t in ids)
        out = self._run("task_priority", [str(priority), str(len(ids)), tasks, *who])
        if self.priority_warnings and priority and any(str(r) == "ok" for r in out):
            warn_if_ignored(self.redis, self.keys)  # (PriorityIgnored)
        return {t: str(r) for t, r in zip(ids, out, strict=True)}

    def paused(self) -> dict[str, Any] | None:
        """``{at, reason, by}`` while the pool is paused, else None (``by``: '' when not
        recorded)."""
        raw = self.redis.get(self.keys.paused)
        if raw is None:
            return None
        try:
            info = json.loads(raw)
        except ValueError:
            info = {}
        return {
            "at": info.get("at"),
            "reason": info.get("reason") or "",
            "by": info.get("by") or "",
        }

    def hosts(self) -> list[Host]:
        """Every host of the pool with its liveness, flags and session (sorted by id)."""
        return fleet.read_hosts(self)

    def host(self, host_id: str) -> Host:
        validate_id(host_id, "host id")
        for h in self.hosts():
            if h.host_id == host_id:
                return h
        raise NotFound(f"no host {host_id} in pool {self.pool}")

    # -- devices -------------------------------------------------------------------------------
    def devices(self) -> list[PooledDevice]:
        """Every device of the pool (sorted by id)."""
        return fleet.read_devices(self)

    def device(self, device_id: str) -> PooledDevice:
        h: dict[str, str] = self.redis.hgetall(  # type: ignore[assignment]
            self.keys.device(validate_id(device_id, "device id"))
        )
        if not h:
            raise NotFound(f"no device {device_id} in pool {self.pool}")
        return PooledDevice.from_hash(h)

    def set_attributes(self, device_id: str, values: Mapping[str, object], by: str = "") -> bool:
        """Set attributes of a device (what an operator knows: ``{"sdk": 34}``; values typed
        and checked by `deviceq.core.attributes.check_attributes`). Returns whether anything
        changed. Raises NotFound, InvalidInput (a device ends with at most 32 attributes)."""
        return self._attrs(device_id, check_attributes(values), (), by)

    def unset_attributes(self, device_id: str, names: Iterable[str], by: str = "") -> bool:
        """Remove attributes of a device (absent names are no change)."""
        return self._attrs(device_id, {}, tuple(dict.fromkeys(check_key(n) for n in names)), by)

    def _attrs(
        self, device_id: str, values: Mapping[str, Value], unset: tuple[str, ...], by: str
    ) -> bool:
        validate_id(device_id, "device id")
        entry = entry_args(device_id, values, unset)
        res = self._run("device_attrs", ["op", *(actor_args(by) or [""]), *entry])
        return int(res) > 0

    def attributes(
        self, device_ids: list[str], with_times: bool = False
    ) -> dict[str, tuple[dict[str, Value], dict[str, int]]]:
        """Device id -> (attributes, when each was last reported in ms: only ``with_times``)."""
        return fleet.read_attributes(self, [validate_id(d, "device id") for d in device_ids],
                                     with_times)  # fmt: skip

    def quarantine(
        self, device_id: str, quarantined: bool = True, reason: str = "", by: str = ""
    ) -> str:
        """Take a device out of assignment (or release it and reset its failure count).
        Returns ``quarantined``, ``released``, or ``not_quarantined`` (a release of a device
        that was not quarantined: nothing changed).
        ``reason`` (at most 200 bytes, no control characters; '' = "operator") is stored as
        the device's ``quarantine_reason`` and carried by the ``device_quarantined`` event.
        ``by`` (an id; '' = "operator"): who, the events' and the change log's ``by``."""
        who = actor_args(by)
        return str(
            self._run(
                "device_quarantine",
                [validate_id(device_id, "device id"), "1" if quarantined else "0",
                 check_reason(reason), *who],
            )
        )  # fmt: skip

    def device_past(self, device_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """A device's recent attempts (``device:ID:history``: task, attempt, outcome,
        failure_kind, at) and its change log (``device:ID:log``: quarantine, health check and
        booking changes), each at most 20 entries, newest first (one round trip). An entry
        that is not a JSON object is skipped."""
        validate_id(device_id, "device id")
        pipe = self.redis.pipeline(transaction=False)
        pipe.lrange(self.keys.device_history(device_id), 0, DEVICE_PAST - 1)
        pipe.lrange(self.keys.device_log(device_id), 0, DEVICE_PAST - 1)
        recent, log = pipe.execute()
        return _json_objects(recent), _json_objects(log)

    # -- reservations (a device for a person) ------------------------------------------------
    def reserve(
        self, device_id: str, duration_ms: int, note: str, where: Iterable[str] = ()
    ) -> Reservation:
        """Reserve an idle device for ``duration_ms`` (1 s - 7 days): it leaves the idle
        candidates at once and comes back when the reservation ends (``release``, or the
        scheduler's expiry scan at its end). Raises Busy (with the reason) unless the device
        is idle now, holds no lease, is not quarantined or held, its host is alive and its
        attributes satisfy the ``where`` expressions (checked in the same script);
        AlreadyExists when it is reserved already (use ``extend``)."""
        compiled = compile_all(parse_all(list(where)))
        res = self._run(
            "device_reserve",
            ["reserve", validate_id(device_id, "device id"), str(_check_duration(duration_ms)),
             _check_note(note, True), *([compiled] if compiled else [])],
        )  # fmt: skip
        return Reservation(device_id, str(res[2]), str(res[1]), int(res[0]), None)

    def extend(self, device_id: str, duration_ms: int, note: str = "") -> Reservation:
        """Move the end of a device's reservation out by ``duration_ms`` (the end at most 7
        days from now); a non-empty ``note`` replaces the note. NotFound unless reserved."""
        res = self._run(
            "device_reserve",
            ["extend", validate_id(device_id, "device id"), str(_check_duration(duration_ms)),
             _check_note(note, False)],
        )  # fmt: skip
        return Reservation(device_id, str(res[2]), str(res[1]), int(res[0]), None)

    def release(self, device_id: str) -> str:
        """End a device's reservation now (it is an idle candidate again if idle, not
        quarantined and not held). Returns its host id; NotFound unless reserved."""
        return str(
            self._run("device_reserve", ["release", validate_id(device_id, "device id"), "", ""])
        )

    def reserve_matching(
        self,
        driver_type: str | None,
        tags: Iterable[str],
        duration_ms: int,
        note: str,
        where: Iterable[str] = (),
    ) -> Reservation:
        """Reserve the first idle device (longest idle first, among at most `RESERVE_SCAN`)
        that offers ``driver_type`` and every tag and whose attributes satisfy the ``where``
        expressions (`deviceq.core.where`; checked again as it is reserved). Raises Busy when
        none is idle now (no reservation is left pending)."""
        if driver_type is not None:
            validate_id(driver_type, "driver type")
        need = validate_tags(list(tags))
        clauses = parse_all(list(where))
        _check_duration(duration_ms)
        _check_note(note, True)
        r, k = self.redis, self.keys
        ids: list[str] = r.zrange(k.idle, 0, RESERVE_SCAN - 1)  # type: ignore[assignment]
        pipe = r.pipeline(transaction=False)
        for did in ids:
            pipe.hmget(k.device(did), "driver_type", "tags")
            if clauses:
                pipe.hgetall(k.device_attrs(did))
        res = iter(pipe.execute())
        texts = [str(c) for c in clauses]
        for did in ids:
            drv, tg = next(res)
            attrs = decode_hash(next(res)) if clauses else {}
            if drv is None or not satisfies(driver_type, need, drv, (tg or "").split(",")):
                continue
            if clauses and not matches_all(clauses, attrs):
                continue
            try:
                return self.reserve(did, duration_ms, note, texts)
            except Busy:
                continue  # taken meanwhile: the next one
        want = " and ".join(
            x
            for x in (f"driver type {driver_type}" if driver_type else "",
                      f"tags {','.join(need)}" if need else "",
                      " and ".join(texts))
            if x
        ) or "any device"  # fmt: skip
        raise Busy(
            f"no idle device offers {want} now (reservations take idle devices only; "
            "see `deviceq device list`)"
        )

    def reservations(self) -> dict[str, Reservation]:
        """Every current reservation by device id (one ZRANGE of ``bookings``, one pipeline).
        A reservation past its end shows until the scheduler's next expiry scan ends it."""
        r, k = self.redis, self.keys
        ids: list[str] = r.zrange(k.bookings, 0, -1)  # type: ignore[assignment]
        pipe = r.pipeline(transaction=False)
        for did in ids:
            pipe.hmget(k.device(did), "host_id", "booked_by", "booked_until", "booked_at")
        out = {}
        for did, (host_id, by, until, at) in zip(ids, pipe.execute(), strict=True):
            if until:
                out[did] = Reservation(did, host_id, by or "", int(until), int(at) if at else None)
        return out

    def reservation(self, device_id: str) -> Reservation | None:
        """The device's current reservation, or None."""
        raw: list[str | None] = self.redis.hmget(  # type: ignore[assignment]
            self.keys.device(validate_id(device_id, "device id")),
            "host_id", "booked_by", "booked_until", "booked_at",
        )  # fmt: skip
        host_id, by, until, at = raw
        if not until:
            return None
        return Reservation(device_id, host_id, by or "", int(until), int(at) if at else None)

    # -- priority classes -------------------------------------------------------------------------
    def add_priority_class(
        self,
        name: str,
        priority: int,
        *,
        preempts: bool = False,
        preemptible: bool = True,
        grace: float = 30.0,
    ) -> PriorityClass:
        """Add (or replace) priority class ``name``: its tasks get ``priority`` (0..9); with
        ``preempts`` a queued task of it that matches no idle device takes the device of a
        running ``preemptible`` task of a strictly lower priority, whose run gets ``grace``
        seconds after its runner's stop signal. Raises InvalidInput (nothing written)."""
        c = PriorityClass(name, priority, preempts, preemptible, grace)
        return add_class(self.redis, self.keys, c)

    def remove_priority_class(self, name: str) -> bool:
        """Forget a priority class (its tasks keep their priority; they neither preempt nor
        are preempted while it is missing). True if it existed."""
        return remove_class(self.redis, self.keys, name)

    def priority_classes(self) -> list[PriorityClass]:
        """Every priority class, highest priority first."""
        return all_classes(self.redis, self.keys)

    # -- tenants ----------------------------------------------------------------------------------
    def set_tenant(self, tenant: str, *, weight: int = 1, max_devices: int = 0) -> TenantInfo:
        """Set a tenant's fair-share ``weight`` (1..1000) and its cap on devices held at once
        (``max_devices``, 0 = none; enforced when tasks are assigned). Raises InvalidInput
        (nothing written) for bad values."""
        set_tenant(self.redis, self.keys, tenant, weight, max_devices)
        return next(t for t in self.tenants() if t.tenant == tenant)

    def remove_tenant(self, tenant: str) -> bool:
        """Forget a tenant's policy (weight 1, no cap). True if it had one."""
        return remove_tenant(self.redis, self.keys, tenant)

    def tenants(self) -> list[TenantInfo]:
        """Every tenant with a policy or holding devices: weight, cap, devices held."""
        return tenant_infos(self.redis, self.keys)

    # -- settings and maintenance --------------------------------------------------------------
    def set_config(self, key: str, value: Any) -> int | float | str:
        """Validate and store one pool setting; returns the stored value."""
        parsed = PoolConfig.parse_value(key, str(value))
        self.redis.hset(self.keys.config, key, str(parsed))
        return parsed

    def stored_settings(self) -> set[str]:
        """The settings this pool has set (the others are at their defaults)."""
        return {k for k in self.redis.hgetall(self.keys.config) if k in PoolConfig.model_fields}

    def get_config(self, key: str | None = None) -> dict[str, int | float | str]:
        cfg = self.config().model_dump()
        if key is None:
            return cfg
        PoolConfig.parse_value(key, str(cfg.get(key, "")))  # raises ConfigError if unknown
        return {key: cfg[key]}

    def dispatch(self, task_id: str, device_id: str) -> str:
        """Manual dispatch: bind a queued task to a named idle device through the same atomic
        commit as the scheduler. Returns the lease id; raises InvalidInput with the reason."""
        pair = {"task_id": validate_id(task_id, "task id"),
                "device_id": validate_id(device_id, "device id")}  # fmt: skip
        res = parse(self._run("assign", ["", "1", ASSIGN.pack([pair])])[0])
        if res.ok:
            return res.value
        raise InvalidInput(f"cannot dispatch {task_id} to {device_id}: {res.value}")
