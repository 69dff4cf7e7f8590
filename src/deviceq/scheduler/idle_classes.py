"""Which idle devices a pass reads (`IdleClasses`): the idle sets of the device classes
(``idle:c:CLASS``, one per distinct ``DRIVER|TAGS`` profile, kept in step with ``idle`` by
lua/lib/idle.lua) that some queued bucket can use, each only as deep as the pass can place.

- The classes are the profiles of the ``caps`` hash (read again only when ``devgen`` changes:
  a device registered, changed its driver type or tags, or was removed).
- A class is read when a non-empty bucket can use it (driver type matches, tags a superset of
  the bucket's), or every class while a multi-device task waits (its roles are not buckets).
- Each is read from its longest idle device, ``FACTOR x min(queued, batch) + SLACK`` deep:
  no global cap, so a device of a class only it has is seen however many others are idle,
  and a pass with nothing queued reads no idle device at all. Where the devices read leave a
  class short (their hosts cannot take work, or stale entries), it is read deeper
  (`short`), ``GROW`` times as deep each round.
- A strategy whose policy needs every idle device (attribute ``reads_all_idle = True``) gets
  its classes read whole.
- The classes the last pass read are read again speculatively with the next base, so a
  steady pool's pass costs no extra round trip."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import redis

from ..core import liveness
from ..core.attributes import decode_hash
from ..core.keys import Keys, class_id
from ..core.lane import batch
from ..core.where import Clause, decompile, matches_all
from .device_cache import DeviceCache, tagset, with_faults
from .limit_load import device_room, read_limits
from .placement.rows import Bucket, IdleDevice, Snapshot

SigRow = tuple[str | None, frozenset[str], int, str | None, str | None, tuple[Clause, ...]]
"""A bucket's attributes: driver type, tags, priority, tenant, the device its tasks are pinned
to, --where clauses."""

FACTOR = 2  # devices read per class per placement the pass can make
SLACK = 16  # and this many more (stale entries, faulty devices offered last, small gangs)
GROW = 4  # a short class is read this many times as deep at the next round
ALL = -1  # read a class whole

Constraint = tuple[str | None, frozenset[str]]


@dataclass
class Base:
    """The part of a snapshot read before any heads: devices, hosts, bucket constraints."""

    now: int
    shells: list[Bucket]
    devices: list[IdleDevice]
    matching: dict[str, list[IdleDevice]]
    signatures: int
    classes: dict[tuple[str, frozenset[str]], list[IdleDevice]] | None = None  # by class


@dataclass(frozen=True)
class DeviceClass:
    """One device class: its profile's driver type and tags, its idle set's key and its
    number of devices (as counted in ``caps`` when the classes were read)."""

    driver: str
    tags: frozenset[str]
    key: str
    devices: int = 0

    def accepts(self, driver: str | None, tags: frozenset[str]) -> bool:
        """Whether a bucket of this driver type (None: any) and these tags can use it."""
        return (driver is None or driver == self.driver) and tags <= self.tags


class IdleClasses:
    """The pool's device classes and how deep this pass reads each one's idle set."""

    def __init__(self, keys: Keys, *, batch: int, whole: bool = False) -> None:
        self.keys = keys
        self.batch = batch
        self.whole = whole  # read every class whole (a strategy that needs the whole fleet)
        self.classes: list[DeviceClass] = []
        self.by_class: dict[tuple[str, frozenset[str]], str] = {}  # (driver, tags) -> key
        self._devgen: Any = ()  # the ``devgen`` the classes were read at (() = never)
        self.spec: dict[str, int] = {}  # key -> depth: read with the next base
        self.depth: dict[str, int] = {}  # key -> depth read this pass (ALL: whole)
        self.got: dict[str, list[Any]] = {}  # key -> (device, score) pairs read this pass
        self.demand = 0  # placements this pass can make: min(queued, batch)

    def stale(self, devgen: Any) -> bool:
        """Whether the classes must be read again (``devgen`` changed since)."""
        return devgen != self._devgen

    def load(self, devgen: Any, caps: dict[Any, Any]) -> None:
        """The classes from the ``caps`` hash (profile ``DRIVER|TAGS`` -> device count)."""
        self._devgen = devgen
        self.classes = []
        for raw, count in caps.items():
            profile = raw.decode() if isinstance(raw, bytes) else str(raw)
            driver, _, tags = profile.partition("|")
            key = self.keys.idle_class(class_id(profile))
            tagset = frozenset(t for t in tags.split(",") if t)
            self.classes.append(DeviceClass(driver, tagset, key, _count(count)))
        self.by_class = {(c.driver, c.tags): c.key for c in self.classes}

    def devices_for(self, driver: str | None, tags: frozenset[str]) -> int:
        """How many devices the classes a bucket of this driver type and these tags can use
        hold (as counted when the classes were read)."""
        return sum(c.devices for c in self.classes if c.accepts(driver, tags))

    def wanted(
        self, constraints: Iterable[Constraint], queued: int, gangs: bool, every: bool = False
    ) -> dict[str, int]:
        """Per class to read, how deep: the classes the buckets' ``constraints`` can use
        (every class when ``gangs`` wait), ``FACTOR x min(queued, batch) + SLACK`` each.
        ``every``: every class, as deep as a full batch needs, whatever is queued (what
        ``TaskScheduler.snapshot`` shows)."""
        self.demand = self.batch if every else min(max(0, queued), self.batch)
        gangs = gangs or every
        if self.demand <= 0 and not gangs:
            return {}
        n = ALL if self.whole else FACTOR * self.demand + SLACK
        if gangs:
            return {c.key: n for c in self.classes}
        cons = set(constraints)
        return {c.key: n for c in self.classes if any(c.accepts(d, t) for d, t in cons)}

    def take(self, want: dict[str, int], spec: dict[str, list[Any]]) -> dict[str, int]:
        """Record this pass's depths; the speculative replies ``spec`` (key -> pairs, read
        with the base at the depths of ``self.spec``) that cover a wanted depth are used.
        Returns the classes still to read (key -> depth)."""
        self.depth = dict(want)
        self.got = {}
        todo: dict[str, int] = {}
        for key, n in want.items():
            have = spec.get(key)
            had = self.spec.get(key)
            if have is not None and had is not None and (had == ALL or (n != ALL and had >= n)):
                self.got[key] = have if n == ALL else have[:n]
            else:
                todo[key] = n
        self.spec = dict(want)  # the next pass reads these with its base
        return todo

    def read(self, r: redis.Redis, todo: dict[str, tuple[int, int]]) -> None:
        """Read ``todo`` (key -> (start, stop), stop ALL: to the end) in one round trip,
        appending to what this pass read."""
        if not todo:
            return
        pipe = batch(r)
        for key, (start, stop) in todo.items():
            pipe.execute_command("ZRANGE", key, start, stop, "WITHSCORES")
        for key, raw in zip(todo, pipe.execute(), strict=True):
            self.got.setdefault(key, []).extend(pairs(raw))

    def pairs(self) -> list[Any]:
        """Every (device, score) pair read this pass."""
        return [p for got in self.got.values() for p in got]

    def short(self, usable: Iterable[tuple[str, frozenset[str]]]) -> dict[str, tuple[int, int]]:
        """The classes to read deeper, with the range to read: those whose idle set holds
        more than was read while fewer of the devices read than the pass can place are usable
        (``usable``: the class of every device left after hosts' health and stale entries)."""
        count: Counter[str] = Counter(self.by_class.get(c, "") for c in usable)
        out: dict[str, tuple[int, int]] = {}
        for key, n in self.depth.items():
            got = len(self.got.get(key, ()))
            if n == ALL or got < n or count[key] >= self.demand:
                continue  # read whole, exhausted, or enough usable devices
            deeper = n * GROW
            self.depth[key] = deeper
            out[key] = (got, deeper - 1)
        return out


def _count(raw: Any) -> int:
    """A device count of the ``caps`` hash (0 when it is not a number)."""
    try:
        return max(0, int(raw))
    except (TypeError, ValueError):
        return 0


class IdleReading(Protocol):
    """What the reads of this module use of a snapshot reader (`snapshot.SnapshotReader`):
    its connection, its idle classes and device cache, the settings and faults read with
    its last base, and its host filter."""

    redis: redis.Redis
    keys: Keys
    needs: frozenset[str]
    batch: int
    idle: IdleClasses
    device_cache: DeviceCache
    settings: dict[str, Any]
    faults: dict[str, str]

    def host_filter(self, base: Base, hosts: list[str], rows: list[Any]) -> Base: ...


def read_new(r: IdleReading, new_sigs: list[str], devgen: Any) -> dict[str, SigRow]:
    """The constraints of buckets not seen before (returned: bucket -> `SigRow`) and, when
    ``devgen`` changed, the device classes (``caps``, loaded into ``r.idle``): one round
    trip, only when either is needed."""
    stale = r.idle.stale(devgen)
    if not new_sigs and not stale:
        return {}
    pipe = batch(r.redis)
    for s in new_sigs:
        pipe.hmget(r.keys.sig(s), "driver_type", "tags", "priority", "tenant", "pin", "where")
    if stale:
        pipe.hgetall(r.keys.caps)
    res = pipe.execute()
    if stale:
        r.idle.load(devgen, res[-1])
    return {
        s: (
            drv or None,
            tagset(tags),
            int(prio or 0),
            tenant or None,
            pin or None,
            decompile(str(where or "")),
        )
        for s, (drv, tags, prio, tenant, pin, where) in zip(new_sigs, res, strict=False)
    }


def read_devices(r: IdleReading, now: int, shells: list[Bucket], signatures: int) -> Base:
    """The base over the idle devices read so far, attributes cached (`DeviceCache`)."""
    cached, _ = r.device_cache.rows(r.idle.pairs(), [])
    if r.faults:
        cached = [with_faults(d, r.faults) for d in cached]
    pre = Snapshot.build(shells, cached, r.batch, now)
    return Base(now, shells, pre.devices, pre.matching, signatures, pre.classes)


def deepen(
    r: IdleReading, base: Base, hosts: list[str], rowmap: dict[str, Any]
) -> tuple[Base, list[str]]:
    """The base filtered by its hosts' health (``rowmap``: host -> row), reading the
    classes it leaves short deeper (`IdleClasses.short`) until none is (each round: one
    round trip for the deeper ranges, one for the health of hosts not seen yet). With a limit
    counted by host set (and read: the profile places by the limits), a host's devices count
    as usable only as far as its limits leave room (`limit_load.device_room`: one more read
    of their counts)."""
    while True:
        kept = r.host_filter(base, hosts, [rowmap[h] for h in hosts])
        usable = kept.devices
        if "limits" in r.needs:
            loads = read_limits(r.redis, r.keys, r.settings, hosts, ())
            room = {h: device_room(loads, h) for h in hosts}
            if any(v is not None for v in room.values()):
                usable = []
                for d in kept.devices:
                    left = room.get(d.host_id)
                    if left is None or left > 0:
                        if left is not None:
                            room[d.host_id] = left - 1
                        usable.append(d)
        short = r.idle.short(d.device_class for d in usable)
        for key, rng in where_short(r, base, usable).items():
            short.setdefault(key, rng)
        if not short:
            return kept, hosts
        r.idle.read(r.redis, short)
        base = read_devices(r, base.now, base.shells, base.signatures)
        hosts = sorted({d.host_id for d in base.devices})
        new = [h for h in hosts if h not in rowmap]
        if new:
            pipe = batch(r.redis)
            for h in new:
                pipe.hmget(r.keys.host(h), *liveness.HOST_FIELDS)
            rowmap.update(zip(new, pipe.execute(), strict=True))


WHERE_DEPTH = 4096
"""How deep a pass reads a class at most for a bucket with --where clauses none of the
devices read so far satisfies (`where_short`): a bound on the pass's reads, so an
unsatisfiable clause costs at most this many devices a class."""


def where_short(r: IdleReading, base: Base, usable: list[IdleDevice]) -> dict[str, tuple[int, int]]:
    """The classes to read deeper for buckets with --where clauses that no device read so far
    satisfies: their usable devices may all fail the clauses while matching ones wait further
    down the idle order. Each such class (not exhausted) is read ``GROW`` times as deep, up to
    `WHERE_DEPTH`; the devices' attributes are read once a pass (one pipelined round trip for
    the devices not seen yet). Nothing is read while no servable bucket has clauses."""
    wheres = [b for b in base.shells if b.where and base.matching.get(b.sig) is not None]
    if not wheres:
        return {}
    seen: dict[str, dict[str, Any]] = r.__dict__.setdefault("_where_attrs", {})
    new = [d.device_id for d in usable if d.device_id not in seen]
    if new:
        pipe = batch(r.redis)
        for d in new:
            pipe.hgetall(r.keys.device_attrs(d))
        seen.update(zip(new, (decode_hash(h) for h in pipe.execute()), strict=True))
    out: dict[str, tuple[int, int]] = {}
    for b in wheres:
        if any(b.accepts(d) and matches_all(b.where, seen.get(d.device_id, {})) for d in usable):
            continue
        for c in r.idle.classes:
            n = r.idle.depth.get(c.key)
            got = len(r.idle.got.get(c.key, ()))
            if n is None or n == ALL or got < n or n >= WHERE_DEPTH or c.key in out:
                continue  # not read, read whole, exhausted, or as deep as a pass goes
            if not c.accepts(b.driver_type, b.tags):
                continue
            deeper = min(WHERE_DEPTH, n * GROW)
            r.idle.depth[c.key] = deeper
            out[c.key] = (got, deeper - 1)
    return out


def forget_where(r: Any) -> None:
    """A new pass: the attributes `where_short` read are read again (they change)."""
    r.__dict__.pop("_where_attrs", None)


def pairs(raw: list[Any]) -> list[Any]:
    """(member, score) pairs of a raw ZRANGE WITHSCORES reply: RESP3 pairs them already
    (float scores); a RESP2 reply is flat (string scores) and is paired here."""
    if not raw or isinstance(raw[0], (list, tuple)):
        return raw
    it = iter(raw)
    return list(zip(it, it, strict=True))
