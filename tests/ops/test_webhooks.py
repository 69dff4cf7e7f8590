"""Webhooks against a real local HTTP receiver: `deviceq webhook add|list|remove`, events
delivered by the leading `deviceq scheduler run` signed with HMAC-SHA256, bounded retries,
one delivery per event with two schedulers running, and bad input refused."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from deviceq import HostClient, TaskStatus
from deviceq.host.link import DeviceReport
from deviceq.services.webhooks import Deliverer, WebhookStore
from harness import Deployment, deviceq, free_port, wait_for


class Receiver:
    """A real HTTP server on a loopback port recording every POST; it answers ``fail_first``
    requests with 500 before answering 200."""

    def __init__(self, fail_first: int = 0) -> None:
        self.got: list[dict[str, Any]] = []
        self.fail_first = fail_first
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with outer.lock:
                    outer.got.append({"headers": dict(self.headers), "body": body})
                    fail = len(outer.got) <= outer.fail_first
                self.send_response(500 if fail else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            rows = [json.loads(g["body"]) for g in self.got]
        return [r for r in rows if name is None or r["event"] == name]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def add_hook(d: Deployment, url: str, events: str, tmp: Path) -> tuple[str, str]:
    out = deviceq(d.url, d.pool, "webhook", "add", url, "--event", events, "-o",
                  str(tmp / "hook.secret"))  # fmt: skip
    assert out.returncode == 0, out.stderr
    hook_id = out.stdout.split()[1].rstrip(":")
    return hook_id, (tmp / "hook.secret").read_text().strip()


def test_events_reach_the_receiver_signed_and_host_dead_once(
    deploy: Deployment, receiver: Receiver, tmp_path: Path
) -> None:
    d = deploy
    hook_id, secret = add_hook(d, receiver.url, "failed,quarantined,host_dead", tmp_path)
    d.scheduler()
    d.command_host("h1", "d1:x", "d2:x")
    tid = d.client.submit("echo broken; exit 3", driver_type="x", max_attempts=1)
    assert d.client.wait(tid, timeout=60).status == TaskStatus.failed
    ok = d.client.submit("true", driver_type="x")  # done: not subscribed
    assert d.client.wait(ok, timeout=60).status == TaskStatus.done
    (failed,) = wait_for(lambda: receiver.events("failed"), 30, "the failed event")
    assert failed["pool"] == d.pool and failed["data"]["task_id"] == tid
    # the signature is the HMAC-SHA256 of the exact body under the webhook's secret
    raw = next(g for g in receiver.got if json.loads(g["body"])["event"] == "failed")
    mac = hmac.new(secret.encode(), raw["body"], hashlib.sha256).hexdigest()
    assert raw["headers"]["X-Deviceq-Signature"] == f"sha256={mac}"
    assert raw["headers"]["X-Deviceq-Event"] == "failed"
    assert raw["headers"]["X-Deviceq-Delivery"] == failed["id"]

    d.admin.quarantine("d2", reason="usb flapping")
    (q,) = wait_for(lambda: receiver.events("quarantined"), 30, "the quarantined event")
    assert q["data"]["device_id"] == "d2"

    gone = HostClient(d.r, d.pool, "gone", d.admin.add_host("gone"))
    gone.heartbeat([DeviceReport("g1", "x", ())])  # then silent: dead after host_timeout (2 s)

    def gone_dead() -> list[dict[str, Any]]:  # (h1 too may miss a 2 s timeout on a busy CI)
        return [e for e in receiver.events("host_dead") if e["data"]["host_id"] == "gone"]

    (dead,) = wait_for(gone_dead, 30, "the host_dead event")
    assert dead["data"]["host_id"] == "gone"
    time.sleep(5)  # still dead: not delivered again
    assert len(gone_dead()) == 1
    assert receiver.events("done") == [] and len(receiver.events("failed")) == 1

    listed = deviceq(d.url, d.pool, "webhook", "list", "--json")
    assert listed.returncode == 0 and secret not in listed.stdout
    (row,) = json.loads(listed.stdout)
    assert row["id"] == hook_id and row["last_ok_at"] and row["last_error"] is None
    assert deviceq(d.url, d.pool, "webhook", "remove", hook_id).returncode == 0
    assert WebhookStore(d.r, d.admin.keys).all() == []


def test_a_failing_receiver_is_retried_and_one_leader_delivers(
    deploy: Deployment, tmp_path: Path
) -> None:
    d = deploy
    rec = Receiver(fail_first=2)
    try:
        add_hook(d, rec.url, "failed", tmp_path)
        d.scheduler()
        d.spawn("scheduler-2", "scheduler", "run", "--tick", "0.2")  # a standby beside it
        d.command_host("h1", "d1:x")
        tid = d.client.submit("exit 1", driver_type="x", max_attempts=1)
        assert d.client.wait(tid, timeout=60).status == TaskStatus.failed
        # tries 1 and 2 answered 500; the third, 1 s + 5 s later, lands
        wait_for(lambda: len(rec.got) >= 3, 30, "three tries")
        time.sleep(2)
        assert len(rec.got) == 3, "delivered again after a 200, or by the standby"
        ids = {g["headers"]["X-Deviceq-Delivery"] for g in rec.got}
        assert len(ids) == 1  # the same delivery each time: a receiver can drop repeats
    finally:
        rec.close()


def test_a_receiver_that_never_answers_is_given_up_after_bounded_tries(real_fleet: Any) -> None:
    f = real_fleet
    port = free_port()  # a port nobody listens on
    store = WebhookStore(f.r, f.admin.keys)
    hook = store.add(f"http://127.0.0.1:{port}/x", "failed")
    deliverer = Deliverer(f.r, f.admin.keys, f.pool, lambda: True, lambda: 30_000.0,
                          retry_delays=(0.1, 0.1))  # fmt: skip
    f.add_host("h1", ("d1", "x", ()))
    tid = f.client.submit("goal", driver_type="x", max_attempts=1)
    assert f.store.commit([(tid, "d1")])[0].startswith("ok:")
    (a,) = f.host("h1").claim(1)
    assert f.host("h1").report(tid, a.lease_id, "failed", "runner_failed") == "ok:failed"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        deliverer.step(block_ms=50)
        (h,) = store.all()
        if h.last_error and "gave up" in h.last_error:
            break
    (h,) = store.all()
    assert h.id == hook.id and h.last_error and "gave up after 3 tries" in h.last_error
    assert deliverer.pending == []


@pytest.mark.parametrize(
    "args, message",
    [
        (("ftp://example.com/x", "--event", "failed"), "http:// or https://"),
        (("http://example.com/x", "--event", "failed,bogus"), "unknown webhook event 'bogus'"),
        (("http://", "--event", "failed"), "with a host"),
        (("http://example.com/x", "--event", " , "), "at least one event"),
    ],
)
def test_bad_webhooks_are_refused_and_nothing_is_stored(
    real_fleet: Any, redis_url: str, args: tuple[str, ...], message: str
) -> None:
    out = deviceq(redis_url, real_fleet.pool, "webhook", "add", *args)
    assert out.returncode != 0 and message in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert WebhookStore(real_fleet.r, real_fleet.admin.keys).all() == []
    gone = deviceq(redis_url, real_fleet.pool, "webhook", "remove", "wh-nope")
    assert gone.returncode != 0 and "no webhook wh-nope" in gone.stderr


def test_a_new_webhook_gets_the_events_after_it_was_added_only(
    real_fleet: Any, receiver: Receiver
) -> None:
    f = real_fleet
    keys = f.admin.keys
    f.r.xadd(keys.events, {"type": "failed", "task": "before"})
    store = WebhookStore(f.r, keys)
    store.add(receiver.url, "failed")
    f.r.xadd(keys.events, {"type": "failed", "task": "after"})
    deliverer = Deliverer(f.r, keys, f.pool, lambda: True, lambda: 30_000.0)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not receiver.events():
        deliverer.step(block_ms=50)
    # a second webhook added now does not get the backlog the first one already had
    store.add(receiver.url, "failed")
    for _ in range(5):
        deliverer.step(block_ms=50)
    assert [e["data"]["task_id"] for e in receiver.events()] == ["after"]
