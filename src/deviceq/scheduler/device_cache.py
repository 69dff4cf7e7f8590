"""The scheduler's cache of idle devices' static attributes (host, driver type, tags), kept
between passes so that a steady pool's pass reads no device row at all (see `DeviceCache.rows`
for when a row is read again)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import redis

from ..core import eligibility
from ..core.keys import Keys
from ..core.lane import batch
from .placement.rows import IdleDevice

GATE = eligibility.GATE_FIELDS
DEVICE_ROW = ("host_id", "driver_type", "tags", *GATE)  # a device row as a pass reads it


class DeviceCache:
    """Idle devices by id, with the idle score they were read at. ``suspect``: devices to
    read again at the next pass (named in a refused pair, or found not assignable)."""

    def __init__(self, r: redis.Redis, keys: Keys, *, batch: int, refresh: float) -> None:
        self.redis = r
        self.keys = keys
        self.batch = batch
        self.refresh = refresh  # seconds after which an entry is read again (a safety net)
        # device id -> (idle score as read, read at (monotonic), the device)
        self.cache: dict[str, tuple[Any, float, IdleDevice]] = {}
        self.suspect: set[str] = set()
        self._devgen: str | None = None  # the pool's ``devgen`` the cache belongs to

    def generation(self, devgen: str | None) -> None:
        """The pool's ``devgen`` as read with a base: when it changed (a device registered,
        changed or was removed), every entry is dropped."""
        if devgen != self._devgen:
            self.cache.clear()
            self._devgen = devgen

    def rows(self, idle: list[Any], sig_keys: list[str]) -> tuple[list[IdleDevice], list[Any]]:
        """The assignable idle devices with their static attributes (host, driver type, tags),
        and the rows of ``sig_keys`` (read in the same round trip).

        The ``idle`` zset is maintained by the scripts (a device is in it only while the one
        rule, `deviceq.core.eligibility`, makes it a candidate; its score is the time it
        became idle), and the
        ``devgen`` counter is bumped whenever a device registers, changes its driver type or
        tags, or is removed (the whole cache is dropped then). So a device hash is read only
        when the device is new to this scheduler, after a ``devgen`` change, or when it was
        named in a rejected pair (then its state is checked too): in a steady pool no device
        row is read at all, whatever the number of devices freed since the last pass. As a
        safety net, entries older than ``device_refresh`` seconds are re-read too, at most
        ``max(64, batch)`` per pass."""
        k = self.keys
        mono = time.monotonic()
        cache = self.cache
        fetch: list[str] = []
        stale: list[str] = []
        suspect = self.suspect
        for did, _ in idle:
            c = cache.get(did)
            if c is None or did in suspect:
                fetch.append(did)
            elif mono - c[1] > self.refresh:
                stale.append(did)
        fetch += stale[: max(64, self.batch)]
        scores = dict(idle)
        res: list[Any] = []
        if fetch or sig_keys:
            pipe = batch(self.redis)
            for did in fetch:
                pipe.hmget(k.device(did), *DEVICE_ROW)
            for sk in sig_keys:
                pipe.hmget(sk, "driver_type", "tags", "priority", "tenant")
            res = pipe.execute()
        for did, d in zip(fetch, res[: len(fetch)], strict=True):
            host_id, driver, tags = d[:3]
            if not host_id or eligibility.device_blocker(dict(zip(GATE, d[3:], strict=True))):
                cache.pop(did, None)  # a stale idle entry: excluded, re-checked next pass
                suspect.add(did)
                continue
            suspect.discard(did)
            score = scores[did]
            dev = IdleDevice(did, host_id, driver or "", tagset(tags), int(float(score)))
            cache[did] = (score, mono, dev)
        if len(cache) > 2 * len(idle) + 1000:  # forget devices that left the index
            for did in set(cache) - set(scores):
                del cache[did]
        devices: list[IdleDevice] = []
        for did, score in idle:
            c = cache.get(did)
            if c is None:
                continue
            if c[0] != score:  # re-entered the idle index: same attributes, new idle_since
                dev = c[2]
                dev = IdleDevice(did, dev.host_id, dev.driver_type, dev.tags, int(float(score)))
                cache[did] = (score, c[1], dev)
                devices.append(dev)
            else:
                devices.append(c[2])
        return devices, res[len(fetch) :]


def tagset(csv: str | None) -> frozenset[str]:
    """Tags from their comma-separated stored form."""
    return frozenset(t for t in (csv or "").split(",") if t)


def with_faults(device: IdleDevice, faults: dict[str, str]) -> IdleDevice:
    """``device`` with its consecutive device faults (the ``faults`` hash), when it has any."""
    n = faults.get(device.device_id)
    if not n:
        return device
    try:
        return replace(device, faults=max(0, int(n)))
    except ValueError:  # a raw write of garbage: counts as one fault
        return replace(device, faults=1)
