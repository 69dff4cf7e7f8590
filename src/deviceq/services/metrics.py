"""Prometheus metrics of a pool, served by the scheduler (``deviceq scheduler run
--metrics-port PORT [--metrics-host ADDR]``). The endpoint listens on 127.0.0.1 unless an
address is given: metrics name hosts, devices and constraints, so exposing them on every
interface (``0.0.0.0``, e.g. inside a container whose port is published) is a choice.

Two kinds of series:

* gauges computed from Redis at scrape time (bounded reads): queue depth per constraint
  signature, tasks per status, devices per effective state, hosts, leader status;
* counters and histograms fed by a background thread that tails the pool's event stream from
  the moment the server starts, so they count exactly the transitions in the stream:
  assignments, submit→assign latency (``queued_ms`` of ``assigned`` events), assign→dispatch
  latency (``claim_ms`` of ``dispatched``), lease expiries (``expired``), retries
  (``requeued``, ``released``), failures by kind (``failed`` by ``failure_kind``, plus
  ``cancelled``), completions by status, reservations of devices for people (reserved,
  extended, released, expired; and a gauge of the reserved devices); each device's numeric
  attributes (``deviceq_device_attribute``, at most `MAX_ATTRIBUTE_SERIES` series) and the
  devices each gate holds.

>>> handle = serve_metrics(admin, 9108, is_leader=lambda: scheduler.is_leader)  # 127.0.0.1
>>> handle.stop()
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..core.events import Event, last_event_id, read_events
from ..core.fleet import read_attributes
from ..core.limits import LIMITS, setting_bound
from ..core.vocabulary import TERMINAL_STATUSES, FailureKind
from ..ops import status as st
from ..ops.admin import PoolAdmin
from ..scheduler.limit_load import read_counts

LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
)
DEFAULT_METRICS_HOST = "127.0.0.1"
"""Where the endpoint listens unless told otherwise (loopback only)."""
MAX_SIGNATURES = 1000
"""At most this many queue buckets are exported (oldest heads first), bounding the series."""


MAX_ATTRIBUTE_SERIES = 10_000
"""Series of ``deviceq_device_attribute`` a scrape holds at most (label sets stay bounded)."""


class PoolCollector(Collector):
    """Scrape-time gauges read from Redis."""

    def __init__(self, admin: PoolAdmin, is_leader: Callable[[], bool]) -> None:
        self.admin = admin
        self.is_leader = is_leader

    def collect(self) -> Iterator[GaugeMetricFamily]:
        pool = self.admin.pool
        up = GaugeMetricFamily(
            "deviceq_redis_up", "1 if the last scrape could read Redis", labels=["pool"]
        )
        leader = GaugeMetricFamily(
            "deviceq_leader",
            "1 while this scheduler process holds the leader lease",
            labels=["pool"],
        )
        try:
            leading = bool(self.is_leader())
        except Exception:  # a broken callback must not break the scrape
            leading = False
        leader.add_metric([pool], 1.0 if leading else 0.0)
        yield leader
        try:
            families = list(self._from_redis(pool))
        except redis.RedisError:
            up.add_metric([pool], 0.0)
            yield up
            return
        up.add_metric([pool], 1.0)
        yield up
        yield from families

    def _from_redis(self, pool: str) -> Iterator[GaugeMetricFamily]:
        depth = GaugeMetricFamily(
            "deviceq_queue_depth",
            "queued tasks per constraint signature",
            labels=["pool", "signature", "driver_type", "tags", "priority"],
        )
        queued_by_tenant: dict[str, int] = {}
        for b in st.buckets(self.admin, MAX_SIGNATURES):
            depth.add_metric(
                [pool, b.sig, b.driver_type or "", ",".join(sorted(b.tags)), str(b.priority)],
                float(b.depth or 0),
            )
            if b.tenant:
                queued_by_tenant[b.tenant] = queued_by_tenant.get(b.tenant, 0) + (b.depth or 0)
        yield depth
        tq = GaugeMetricFamily(
            "deviceq_tenant_queued", "queued tasks per tenant", labels=["pool", "tenant"]
        )
        th = GaugeMetricFamily(
            "deviceq_tenant_held",
            "devices held by a tenant's tasks, and its cap (0 = none)",
            labels=["pool", "tenant", "max_devices"],
        )
        infos = {t.tenant: t for t in self.admin.tenants()}
        for name in sorted(set(infos) | set(queued_by_tenant)):
            tq.add_metric([pool, name], float(queued_by_tenant.get(name, 0)))
            t = infos.get(name)
            th.add_metric([pool, name, str(t.max_devices if t else 0)], float(t.held if t else 0))
        yield tq
        yield th
        tasks = GaugeMetricFamily(
            "deviceq_tasks",
            "tasks per status (terminal: within retention)",
            labels=["pool", "status"],
        )
        for name, n in st.status_counts(self.admin).items():
            tasks.add_metric([pool, name], float(n))
        yield tasks
        hosts, devices = st.hosts_and_devices(self.admin)
        dev = GaugeMetricFamily(
            "deviceq_devices", "devices per effective state", labels=["pool", "state"]
        )
        for name, n in st.device_counts(devices).items():
            dev.add_metric([pool, name], float(n))
        yield dev
        yield from self._attributes(pool, [d for d, _ in devices])
        hs = GaugeMetricFamily(
            "deviceq_hosts", "hosts: alive, dead, draining", labels=["pool", "state"]
        )
        hs.add_metric([pool, "alive"], float(sum(h.alive for h in hosts)))
        hs.add_metric([pool, "dead"], float(sum(not h.alive for h in hosts)))
        hs.add_metric([pool, "draining"], float(sum(h.draining for h in hosts)))
        yield hs
        r, keys = self.admin.redis, self.admin.keys
        for lim in LIMITS:
            if lim.setting is None:  # a tenant's own cap: deviceq_tenant_held, above
                continue
            family = GaugeMetricFamily(
                f"deviceq_{lim.counter}",
                f"the {lim.name} limit: {lim.summary}, held now, and its bound ({lim.setting}, "
                "0 = none); counts of none are left out",
                labels=["pool", *lim.scope, lim.setting],
            )
            bound = str(setting_bound(r.hget(keys.config, lim.setting)))
            for key, count in sorted(read_counts(r, keys, lim).items()):
                values = lim.values(key)
                family.add_metric([pool, *(values[s] for s in lim.scope), bound], float(count))
            yield family
        leases = GaugeMetricFamily(
            "deviceq_active_leases", "tasks holding a lease", labels=["pool"]
        )
        leases.add_metric([pool], float(self.admin.redis.zcard(self.admin.keys.leases)))
        yield leases
        booked = GaugeMetricFamily(
            "deviceq_reserved_devices",
            "devices reserved for a person (deviceq reserve)",
            labels=["pool"],
        )
        booked.add_metric([pool], float(self.admin.redis.zcard(self.admin.keys.bookings)))
        yield booked
        k = self.admin.keys
        gangs = GaugeMetricFamily(
            "deviceq_gangs_waiting",
            "queued multi-device tasks waiting for every role's device at once",
            labels=["pool"],
        )
        gangs.add_metric([pool], float(self.admin.redis.zcard(k.gangs)))
        yield gangs
        kept = GaugeMetricFamily(
            "deviceq_gang_kept_devices",
            "idle devices the scheduler keeps for waiting multi-device tasks (gang_holds)",
            labels=["pool"],
        )
        holds: dict[str, str] = self.admin.redis.hgetall(k.gang_holds)  # type: ignore[assignment]
        kept.add_metric(
            [pool], float(sum(len(v.partition("|")[2].split(",")) for v in holds.values()))
        )
        yield kept

    def _attributes(self, pool: str, devices: list[Any]) -> Iterator[GaugeMetricFamily]:
        """A gauge per device and numeric (or boolean) attribute, at most
        `MAX_ATTRIBUTE_SERIES` series a scrape (devices by id, names sorted), and the devices
        each gate holds."""
        attr = GaugeMetricFamily(
            "deviceq_device_attribute",
            "a device's numeric attribute (booleans as 0/1; at most "
            f"{MAX_ATTRIBUTE_SERIES} series)",
            labels=["pool", "device", "attribute"],
        )
        gated = GaugeMetricFamily(
            "deviceq_gated_devices", "devices a gate holds (deviceq gate)", labels=["pool", "gate"]
        )
        ids = sorted(d.device_id for d in devices)
        held: dict[str, int] = {}
        for d in devices:
            if d.gated:
                held[d.gated] = held.get(d.gated, 0) + 1
        for name, n in sorted(held.items()):
            gated.add_metric([pool, name], float(n))
        series = 0
        for did, (values, _) in read_attributes(self.admin, ids).items():
            for name, v in values.items():
                if isinstance(v, bool | int | float) and series < MAX_ATTRIBUTE_SERIES:
                    attr.add_metric([pool, did, name], float(v))
                    series += 1
        yield attr
        yield gated


class EventMetrics:
    """Counters and histograms fed from the event stream."""

    def __init__(self, registry: CollectorRegistry, pool: str) -> None:
        self.pool = pool
        lp = ["pool"]
        self.assignments = Counter(
            "deviceq_assignments", "tasks assigned to a device", lp, registry=registry
        )
        self.dispatches = Counter(
            "deviceq_dispatches", "assignments claimed by their host", lp, registry=registry
        )
        self.submissions = Counter("deviceq_submissions", "tasks submitted", lp, registry=registry)
        self.expiries = Counter(
            "deviceq_lease_expiries", "leases that expired", lp, registry=registry
        )
        self.retries = Counter(
            "deviceq_retries",
            "attempts returned to the queue",
            ["pool", "reason"],
            registry=registry,
        )
        self.failures = Counter(
            "deviceq_failures",
            "tasks ended failed or cancelled, by kind",
            ["pool", "kind"],
            registry=registry,
        )
        self.completions = Counter(
            "deviceq_completions",
            "tasks reaching a terminal status",
            ["pool", "status"],
            registry=registry,
        )
        self.submit_to_assign = Histogram(
            "deviceq_submit_to_assign_seconds",
            "time from submission to assignment",
            lp,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.assign_to_dispatch = Histogram(
            "deviceq_assign_to_dispatch_seconds",
            "time from assignment to the host's claim",
            lp,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.events_seen = Counter(
            "deviceq_events", "events read from the stream", lp, registry=registry
        )
        self.reservations = Counter(
            "deviceq_reservations",
            "reservations of devices for people, by event: reserved, extended, released "
            "(early), expired",
            ["pool", "event"],
            registry=registry,
        )
        self.preemptions = Counter(
            "deviceq_preemptions",
            "running tasks told to stop so that an urgent task of a class that preempts gets "
            "their device (the preempted event)",
            lp,
            registry=registry,
        )
        # every series exists (at 0) from the start, so rates and alerts work at once
        for metric in (
            self.preemptions,
            self.assignments,
            self.dispatches,
            self.submissions,
            self.expiries,
            self.submit_to_assign,
            self.assign_to_dispatch,
            self.events_seen,
        ):
            metric.labels(pool)
        for reason in ("lease_expired", "released"):
            self.retries.labels(pool, reason)
        for kind in FailureKind:
            self.failures.labels(pool, kind.value)
        for status in TERMINAL_STATUSES:
            self.completions.labels(pool, status)
        for event in ("reserved", "extended", "released", "expired"):
            self.reservations.labels(pool, event)

    def observe(self, e: Event) -> None:
        p = self.pool
        self.events_seen.labels(p).inc()
        if e.fields.get("gang"):  # a part of a multi-device task: counted as its task
            return
        t = e.type
        if t == "submitted":
            self.submissions.labels(p).inc()
        elif t == "assigned":
            self.assignments.labels(p).inc()
            if e.fields.get("queued_ms", "").lstrip("-").isdigit():
                self.submit_to_assign.labels(p).observe(max(0, int(e.fields["queued_ms"])) / 1000)
        elif t == "dispatched":
            self.dispatches.labels(p).inc()
            if e.fields.get("claim_ms", "").lstrip("-").isdigit():
                self.assign_to_dispatch.labels(p).observe(max(0, int(e.fields["claim_ms"])) / 1000)
        elif t == "expired":
            self.expiries.labels(p).inc()
        elif t == "preempted":
            self.preemptions.labels(p).inc()
        elif t == "requeued" and "preempted_by" in e.fields:  # (counted at its preempted)
            pass
        elif t == "requeued" and "reason" in e.fields:  # a multi-device task's part ended
            self.retries.labels(p, "part_ended").inc()
        elif t in ("requeued", "released"):
            self.retries.labels(p, "lease_expired" if t == "requeued" else "released").inc()
        elif t == "failed":
            self.failures.labels(p, e.fields.get("failure_kind") or "unknown").inc()
            self.completions.labels(p, "failed").inc()
        elif t == "cancelled":
            self.failures.labels(p, "cancelled").inc()
            self.completions.labels(p, "cancelled").inc()
        elif t == "done":
            self.completions.labels(p, "done").inc()
        elif t == "device_reserved":
            event = "extended" if e.fields.get("extended") == "1" else "reserved"
            self.reservations.labels(p, event).inc()
        elif t == "device_released":
            self.reservations.labels(p, "released").inc()
        elif t == "reservation_expired":
            self.reservations.labels(p, "expired").inc()


class MetricsServer:
    """A running metrics endpoint: its port, its registry, and ``stop()``."""

    def __init__(
        self,
        admin: PoolAdmin,
        port: int,
        is_leader: Callable[[], bool],
        addr: str = DEFAULT_METRICS_HOST,
    ) -> None:
        self.admin = admin
        self.registry = CollectorRegistry()
        self.registry.register(PoolCollector(admin, is_leader))
        self.events = EventMetrics(self.registry, admin.pool)
        self._stop = threading.Event()
        self.cursor = last_event_id(admin.redis, admin.keys)
        self.events_read = 0
        self._server, self._thread = start_http_server(port, addr=addr, registry=self.registry)
        self.port = int(self._server.server_port)
        self.addr = str(self._server.server_address[0])
        self._tail = threading.Thread(target=self._run, name="deviceq-metrics-events", daemon=True)
        self._tail.start()

    def _run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                cursor, batch = read_events(
                    self.admin.redis, self.admin.keys, self.cursor, block_ms=500
                )
            except redis.RedisError:
                self._stop.wait(backoff)
                backoff = min(5.0, backoff * 2)
                continue
            backoff = 0.1
            for e in batch:
                self.events.observe(e)
            self.events_read += len(batch)
            self.cursor = cursor

    def wait_caught_up(self, timeout: float = 5.0) -> bool:
        """Block until every event in the stream now has been counted (for tests and tools)."""
        target = last_event_id(self.admin.redis, self.admin.keys)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if _id_tuple(self.cursor) >= _id_tuple(target):
                return True
            time.sleep(0.02)
        return False

    def stop(self) -> None:
        """Stop serving and stop tailing events."""
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        self._tail.join(timeout=2)


def _id_tuple(event_id: str) -> tuple[int, int]:
    ms, _, seq = event_id.partition("-")
    return int(ms), int(seq or 0)


def serve_metrics(
    admin: PoolAdmin, port: int, is_leader: Callable[[], bool], addr: str = DEFAULT_METRICS_HOST
) -> MetricsServer:
    """Start the Prometheus endpoint of ``admin``'s pool on ``addr``:``port`` (0: any free
    port; ``addr`` 127.0.0.1 by default, ``0.0.0.0`` or ``::`` for every interface) in
    background threads and return its handle (callers may ignore it: the threads are daemons).
    ``is_leader`` is called at each scrape for the ``deviceq_leader`` gauge."""
    return MetricsServer(admin, port, is_leader, addr)


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Samples of a Prometheus text exposition: ``{(name, sorted labels): value}``."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


__all__ = ["MetricsServer", "serve_metrics", "parse_metrics"]
