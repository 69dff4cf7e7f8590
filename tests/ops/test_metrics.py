"""The Prometheus endpoint, scraped over HTTP while a scenario runs on a real redis-server:
its counters and histograms match the event stream, its gauges match Redis."""

from __future__ import annotations

import time
import urllib.request
from collections import Counter
from typing import Any

from deviceq.core.events import read_events
from deviceq.services.metrics import parse_metrics, serve_metrics
from harness import free_port


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        return parse_metrics(resp.read().decode())


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_metrics_match_the_event_stream(real_fleet: Any) -> None:
    f = real_fleet
    pool = f.pool
    # events before the server starts are not counted
    h1 = f.add_host("h1", ("d1", "android", ("wifi",)), ("d2", "android", ()))
    h2 = f.add_host("h2", ("d3", "ios", ()))
    f.client.submit("before the server")
    leading = {"now": False}
    server = serve_metrics(f.admin, free_port(), lambda: leading["now"], addr="127.0.0.1")
    start = server.cursor
    try:
        base = scrape(server.port)
        assert value(base, "deviceq_assignments_total", pool=pool) == 0
        assert value(base, "deviceq_leader", pool=pool) == 0
        assert value(base, "deviceq_redis_up", pool=pool) == 1

        f.admin.set_config("claim_ttl", 1)
        done_t = f.client.submit("works", driver_type="android", tags=["wifi"])
        fail_t = f.client.submit("breaks", driver_type="android")
        lost_t = f.client.submit("never claimed", driver_type="ios")
        back_t = f.client.submit("handed back", driver_type="android", tags=["wifi"])
        gone_t = f.client.submit("cancelled while queued", driver_type="web")
        f.client.submit("waits", driver_type="web")
        time.sleep(0.05)  # a measurable submit -> assign latency
        assert all(
            x.startswith("ok:")
            for x in f.store.commit([(done_t, "d1"), (fail_t, "d2"), (lost_t, "d3")])
        )
        got = {a.task.id: a for a in h1.claim(5)}
        assert set(got) == {done_t, fail_t}
        assert h1.report(done_t, got[done_t].lease_id, "done") == "ok:done"
        assert h1.report(fail_t, got[fail_t].lease_id, "failed", "runner_error") == "ok:failed"
        f.store.commit([(back_t, "d1")])
        (b,) = h1.claim(1)
        assert h1.release(back_t, b.lease_id) == "ok:queued"
        f.client.cancel(gone_t)
        time.sleep(1.1)  # lost_t's claim window passes: an expiry and a requeue
        assert f.store.expire()["requeued"] == 1
        assert h2.claim(1) == []  # its inbox entry is gone with the expired lease
        leading["now"] = True

        assert server.wait_caught_up(10)
        samples = scrape(server.port)
    finally:
        server.stop()

    _, events = read_events(f.r, f.client.keys, start, block_ms=None, count=10_000)
    types = Counter(e.type for e in events)
    assert types["assigned"] == 4 and types["dispatched"] == 3 and types["expired"] == 1
    assert value(samples, "deviceq_assignments_total", pool=pool) == types["assigned"]
    assert value(samples, "deviceq_dispatches_total", pool=pool) == types["dispatched"]
    assert value(samples, "deviceq_submissions_total", pool=pool) == types["submitted"] == 6
    assert value(samples, "deviceq_lease_expiries_total", pool=pool) == types["expired"]
    assert (
        value(samples, "deviceq_retries_total", pool=pool, reason="lease_expired")
        == types["requeued"]
        == 1
    )
    assert (
        value(samples, "deviceq_retries_total", pool=pool, reason="released")
        == types["released"]
        == 1
    )
    assert value(samples, "deviceq_failures_total", pool=pool, kind="runner_error") == 1
    assert (
        value(samples, "deviceq_failures_total", pool=pool, kind="cancelled")
        == types["cancelled"]
        == 1
    )
    assert value(samples, "deviceq_failures_total", pool=pool, kind="lease_expired") == 0
    assert (
        value(samples, "deviceq_completions_total", pool=pool, status="done") == types["done"] == 1
    )
    assert value(samples, "deviceq_events_total", pool=pool) == len(events)

    queued_ms = [int(e.fields["queued_ms"]) for e in events if e.type == "assigned"]
    claim_ms = [int(e.fields["claim_ms"]) for e in events if e.type == "dispatched"]
    s2a, a2d = "deviceq_submit_to_assign_seconds", "deviceq_assign_to_dispatch_seconds"
    assert value(samples, f"{s2a}_count", pool=pool) == len(queued_ms) == 4
    assert abs(value(samples, f"{s2a}_sum", pool=pool) - sum(queued_ms) / 1000) < 1e-6
    assert value(samples, f"{s2a}_sum", pool=pool) >= 4 * 0.05
    assert value(samples, f"{a2d}_count", pool=pool) == len(claim_ms) == 3
    assert abs(value(samples, f"{a2d}_sum", pool=pool) - sum(claim_ms) / 1000) < 1e-6
    under_10ms = sum(1 for ms in queued_ms if ms / 1000 <= 0.01)
    assert value(samples, f"{s2a}_bucket", pool=pool, le="0.01") == under_10ms

    # scrape-time gauges agree with Redis
    assert value(samples, "deviceq_leader", pool=pool) == 1
    keys = f.client.keys
    for sig in f.r.zrange(keys.queues, 0, -1):
        info = f.r.hgetall(keys.sig(sig))
        assert value(
            samples,
            "deviceq_queue_depth",
            pool=pool,
            signature=sig,
            driver_type=info["driver_type"],
            tags=info["tags"],
            priority=info["priority"],
        ) == f.r.zcard(keys.queue(sig))
    depth = sum(v for (n, _), v in samples.items() if n == "deviceq_queue_depth")
    assert depth == f.client.counts()["queued"] == 4  # before, waits, back_t, lost_t
    assert value(samples, "deviceq_tasks", pool=pool, status="failed") == 1
    # d1's host handed back_t back (held until h1's next heartbeat), d3 lost lost_t's lease
    # (suspect until h2's next heartbeat): only d2 is an idle candidate
    assert value(samples, "deviceq_devices", pool=pool, state="idle") == 1
    assert value(samples, "deviceq_devices", pool=pool, state="held") == 1
    assert value(samples, "deviceq_devices", pool=pool, state="suspect") == 1
    assert value(samples, "deviceq_hosts", pool=pool, state="alive") == 2
    assert value(samples, "deviceq_active_leases", pool=pool) == 0


def test_metrics_survive_a_redis_restart(private_redis: Any) -> None:
    import redis

    from deviceq import Client, PoolAdmin

    r = redis.Redis.from_url(private_redis.url, decode_responses=True)
    admin = PoolAdmin(r, "mpool")
    server = serve_metrics(admin, free_port(), lambda: True, addr="127.0.0.1")
    try:
        Client(r, "mpool").submit("one")
        assert server.wait_caught_up(10)
        private_redis.kill()
        down = scrape(server.port)
        assert value(down, "deviceq_redis_up", pool="mpool") == 0
        assert value(down, "deviceq_submissions_total", pool="mpool") == 1
        private_redis.restart()
        Client(r, "mpool").submit("two")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            up = scrape(server.port)
            if value(up, "deviceq_submissions_total", pool="mpool") == 2:
                break
            time.sleep(0.1)
        assert value(up, "deviceq_redis_up", pool="mpool") == 1
        assert value(up, "deviceq_submissions_total", pool="mpool") == 2
        assert (
            value(
                up,
                "deviceq_queue_depth",
                pool="mpool",
                signature=next(iter(r.zrange(admin.keys.queues, 0, 0))),
                driver_type="",
                tags="",
                priority="0",
            )
            == 2
        )
    finally:
        server.stop()
        r.close()
