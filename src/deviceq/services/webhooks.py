"""Webhooks: chosen events of a pool POSTed as JSON to HTTP receivers, signed with HMAC-SHA256.

``deviceq webhook add URL --event failed,quarantined,host_dead`` stores a webhook in
``webhooks`` and its secret (shown once) in ``_webhook_secrets``, which only the scheduler and
the operator can read; the leading scheduler's `Deliverer` reads the event stream
from the cursor ``webhooks:cursor`` and POSTs each matching event:

- body: ``{"id", "event", "pool", "time_ms", "data"}`` (``data``: the event's typed fields, as
  ``deviceq events --json`` prints them);
- headers: ``X-Deviceq-Event`` (the name), ``X-Deviceq-Delivery`` (the event id: the same on a
  retry and after a scheduler failover, so a receiver can drop repeats) and
  ``X-Deviceq-Signature: sha256=HEX``, the HMAC-SHA256 of the body under the webhook's secret.

A delivery is tried at once, then after `RETRY_DELAYS` (bounded: `TRIES` tries in all, each
with a `TIMEOUT`); any 2xx answer is success. The outcome of the last delivery is kept on the
webhook (``deviceq webhook list``). Delivery is at least once while a scheduler leads: the
cursor is saved after each batch is handed to the receivers, so a new leader resumes from it
(retries still pending in a deposed leader's memory are lost with it). ``host_dead`` is not a
stream event: the deliverer sees a host's heartbeat age pass ``host_timeout`` (the rule of
`deviceq.core.liveness`) and sends it once per death (the set ``webhooks:dead``)."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from ..core.errors import InvalidInput, NotFound
from ..core.events import last_event_id, read_events
from ..core.keys import Keys
from ..core.liveness import host_alive

_LOG = logging.getLogger("deviceq.webhooks")

STREAM_EVENTS: dict[str, str] = {
    "submitted": "submitted",
    "assigned": "assigned",
    "done": "done",
    "failed": "failed",
    "cancelled": "cancelled",
    "retrying": "retrying",
    "requeued": "requeued",
    "expired": "expired",
    "preempted": "preempted",
    "device_quarantined": "quarantined",
    "device_unquarantined": "unquarantined",
    "device_unhealthy": "unhealthy",
    "device_gated": "gated",
    "device_ungated": "ungated",
    "device_removed": "device_removed",
    "host_alive": "host_alive",
    "host_removed": "host_removed",
    "suite_submitted": "suite_submitted",
    "suite_joined": "suite_joined",
    "suite_done": "suite_done",
}
"""Event stream type -> the webhook event it is delivered as."""
EVENTS = frozenset(STREAM_EVENTS.values()) | {"host_dead"}
"""The names ``--event`` accepts."""
MAX_WEBHOOKS = 50
MAX_URL = 2048
TIMEOUT = 5.0  # seconds one POST may take
RETRY_DELAYS = (1.0, 5.0, 30.0)  # seconds before the 2nd, 3rd and 4th try
TRIES = 1 + len(RETRY_DELAYS)
MAX_PENDING = 10_000  # deliveries waiting for a retry, at most (the oldest are dropped)
HOST_SCAN_EVERY = 2.0  # seconds between two looks at the hosts' heartbeats


@dataclass(frozen=True)
class Webhook:
    """A receiver: its id, URL, the event names it gets and its secret (never printed)."""

    id: str
    url: str
    events: tuple[str, ...]
    created_at: int
    secret: str = field(repr=False)
    since: str = "0-0"  # the newest event id when it was added: it gets the events after
    last_ok_at: int | None = None
    last_error: str | None = None

    def public(self) -> dict[str, Any]:
        """As ``webhook list --json`` prints it: everything but the secret."""
        return {"id": self.id, "url": redact(self.url), "events": list(self.events),
                "created_at": self.created_at, "last_ok_at": self.last_ok_at,
                "last_error": self.last_error}  # fmt: skip

    def wants(self, name: str, event_id: str) -> bool:
        return name in self.events and _after(event_id, self.since)

    @classmethod
    def from_record(cls, d: dict[str, Any], secret: str) -> Webhook:
        """A stored record (the JSON of `to_json`, decoded) with its secret."""
        return cls(str(d["id"]), str(d["url"]), tuple(d["events"]), int(d["created_at"]),
                   secret, str(d.get("since") or "0-0"), d.get("last_ok_at"),
                   d.get("last_error"))  # fmt: skip

    def to_json(self) -> str:
        """The stored record: everything but the secret (kept apart: `WebhookStore`)."""
        return json.dumps({**self.public(), "url": self.url, "since": self.since})


def _after(a: str, b: str) -> bool:
    """Is stream id ``a`` newer than ``b``? (``MS-SEQ``; a synthetic id is always newer)"""
    try:
        ams, aseq = (int(x) for x in a.split("-", 1))
        bms, bseq = (int(x) for x in b.split("-", 1))
    except ValueError:
        return True
    return (ams, aseq) > (bms, bseq)


def redact(url: str) -> str:
    """``url`` without a password in its user part (``https://user:***@host/...``)."""
    p = urllib.parse.urlsplit(url)
    if p.password is None:
        return url
    netloc = f"{p.username}:***@{p.hostname}" + (f":{p.port}" if p.port else "")
    return urllib.parse.urlunsplit(p._replace(netloc=netloc))


def parse_events(value: str | Iterable[str]) -> tuple[str, ...]:
    """``failed,quarantined`` (or names) as the sorted, deduplicated names; InvalidInput for
    an empty list or an unknown name."""
    items = value.split(",") if isinstance(value, str) else list(value)
    names = sorted({x.strip() for item in items for x in item.split(",") if x.strip()})
    if not names:
        raise InvalidInput("give at least one event: --event failed,quarantined,host_dead")
    bad = [n for n in names if n not in EVENTS]
    if bad:
        raise InvalidInput(f"unknown webhook event {bad[0]!r}: one of {', '.join(sorted(EVENTS))}")
    return tuple(names)


def check_url(url: str) -> str:
    """An ``http://`` or ``https://`` URL with a host, at most 2,048 characters of printable
    text; InvalidInput otherwise."""
    if not isinstance(url, str) or not 1 <= len(url) <= MAX_URL:
        raise InvalidInput(f"the webhook URL must be 1-{MAX_URL} characters")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise InvalidInput("the webhook URL must not contain spaces or control characters")
    p = urllib.parse.urlsplit(url)
    if p.scheme not in ("http", "https") or not p.hostname:
        raise InvalidInput(f"the webhook URL must be http:// or https:// with a host: {url!r}")
    try:
        p.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise InvalidInput(f"bad port in the webhook URL {redact(url)!r}") from None
    return url


def sign(secret: str, body: bytes) -> str:
    """The ``X-Deviceq-Signature`` value of ``body``: ``sha256=`` and the hex HMAC."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class WebhookStore:
    """The pool's webhooks: the ``webhooks`` hash (id -> JSON, no secret) and their secrets in
    the private ``_webhook_secrets`` hash (id -> secret), which the producer and host ACL
    users cannot read. A record written before the secrets moved (its JSON holding
    ``secret``) is moved over when it is read or written."""

    def __init__(self, r: redis.Redis, keys: Keys) -> None:
        self.r, self.keys = r, keys

    def add(self, url: str, events: str | Iterable[str], secret: str | None = None) -> Webhook:
        """Store a webhook; its secret is generated unless given (at least 16 characters)."""
        check_url(url)
        names = parse_events(events)
        if secret is not None and not 16 <= len(secret) <= 256:
            raise InvalidInput("a webhook secret must be 16-256 characters")
        if self.r.hlen(self.keys.webhooks) >= MAX_WEBHOOKS:
            raise InvalidInput(f"a pool has at most {MAX_WEBHOOKS} webhooks: remove one first")
        since = last_event_id(self.r, self.keys)
        hook = Webhook("wh-" + uuid.uuid4().hex[:10], url, names, int(time.time() * 1000),
                       secret or secrets.token_hex(32), since)  # fmt: skip
        # the deliverer reads on from its cursor; the first webhook starts it at this event
        first = self.r.hlen(self.keys.webhooks) == 0
        self.r.set(self.keys.webhook_cursor, since, nx=not first)
        # the secret first: a record is never visible without it
        self.r.hset(self.keys.webhook_secrets, hook.id, hook.secret)
        self.r.hset(self.keys.webhooks, hook.id, hook.to_json())
        return hook

    def all(self) -> list[Webhook]:
        raw: dict[str, str] = self.r.hgetall(self.keys.webhooks)  # type: ignore[assignment]
        if not raw:
            return []
        kept: dict[str, str] = self.r.hgetall(self.keys.webhook_secrets)  # type: ignore[assignment]
        out = []
        for hook_id, v in raw.items():
            try:
                d = json.loads(v)
                if d.get("secret"):
                    kept[hook_id] = self._move_secret(hook_id, d)
                out.append(Webhook.from_record(d, kept[hook_id]))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # (written by hand, or no secret: skipped, never an error)
        return sorted(out, key=lambda h: (h.created_at, h.id))

    def _move_secret(self, hook_id: str, record: dict[str, Any]) -> str:
        """Move the secret of a record that still holds it to the private hash (the secret
        first, then the record without it); the secret."""
        secret = str(record.pop("secret"))
        self.r.hset(self.keys.webhook_secrets, hook_id, secret)
        self.r.hset(self.keys.webhooks, hook_id, json.dumps(record))
        return secret

    def remove(self, hook_id: str) -> None:
        if not self.r.hdel(self.keys.webhooks, hook_id):
            raise NotFound(f"no webhook {hook_id}")
        self.r.hdel(self.keys.webhook_secrets, hook_id)

    def note(self, hook_id: str, ok: bool, error: str | None = None) -> None:
        """Keep the outcome of the last delivery on the webhook (if it still exists)."""
        raw = self.r.hget(self.keys.webhooks, hook_id)
        if raw is None:
            return
        d = json.loads(raw)
        if d.get("secret"):
            self._move_secret(hook_id, d)
        if ok:
            d["last_ok_at"], d["last_error"] = int(time.time() * 1000), None
        else:
            d["last_error"] = (error or "failed")[:500]
        self.r.hset(self.keys.webhooks, hook_id, json.dumps(d))


@dataclass
class Delivery:
    hook: Webhook
    name: str
    delivery_id: str
    body: bytes
    tries: int = 0
    next_at: float = 0.0


def body_of(pool: str, name: str, delivery_id: str, time_ms: int, data: dict[str, Any]) -> bytes:
    return json.dumps({"id": delivery_id, "event": name, "pool": pool, "time_ms": time_ms,
                       "data": data}, sort_keys=True).encode()  # fmt: skip


Post = Callable[[str, bytes, dict[str, str]], int]


def http_post(url: str, body: bytes, headers: dict[str, str]) -> int:
    """POST ``body``; the HTTP status (an unreachable receiver raises OSError)."""
    import urllib.error  # (here: the command line imports this module for its names)
    import urllib.request

    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:  # noqa: S310 - checked URL
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


class Deliverer:
    """Delivers a pool's webhooks while ``is_leader()`` (see the module's doc)."""

    def __init__(
        self,
        r: redis.Redis,
        keys: Keys,
        pool: str,
        is_leader: Callable[[], bool],
        host_timeout_ms: Callable[[], float],
        post: Post = http_post,
        retry_delays: tuple[float, ...] = RETRY_DELAYS,
    ) -> None:
        self.r, self.keys, self.pool = r, keys, pool
        self.retry_delays = retry_delays  # seconds before each try after the first
        self.store = WebhookStore(r, keys)
        self.is_leader, self.host_timeout_ms, self.post = is_leader, host_timeout_ms, post
        self.pending: list[Delivery] = []
        self.stopping = threading.Event()
        self._next_scan = 0.0

    def start(self) -> threading.Thread:
        th = threading.Thread(target=self.run, name=f"webhooks-{self.pool}", daemon=True)
        th.start()
        return th

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                if not self.is_leader():
                    self.pending.clear()  # (a new leader resumes from the saved cursor)
                    self.stopping.wait(0.5)
                    continue
                self.step()
            except redis.RedisError as exc:
                _LOG.warning("webhooks: redis unreachable: %s", exc)
                self.stopping.wait(2.0)
            except Exception:  # noqa: BLE001 - the deliverer never dies of one bad event
                _LOG.exception("webhooks: step failed")
                self.stopping.wait(1.0)

    def step(self, block_ms: int = 500) -> None:
        """One round: new events handed to their webhooks, the hosts' deaths, due retries."""
        hooks = self.store.all()
        if not hooks and not self.pending:
            self.stopping.wait(block_ms / 1000)  # nothing to deliver: the stream is not read
            return
        cursor = self.r.get(self.keys.webhook_cursor)
        if cursor is None:  # (removed by hand): from now on
            cursor = last_event_id(self.r, self.keys)
            self.r.set(self.keys.webhook_cursor, cursor, nx=True)
        wait = block_ms
        if self.pending:
            due_in = min(d.next_at for d in self.pending) - time.monotonic()
            wait = max(1, min(block_ms, int(due_in * 1000)))
        new, events = read_events(self.r, self.keys, str(cursor), block_ms=wait, count=100)
        for ev in events:
            name = STREAM_EVENTS.get(ev.type)
            if name is not None:
                self._queue(hooks, name, ev.id, ev.ms, ev.data)
        if now_due := time.monotonic() >= self._next_scan:
            self._next_scan = time.monotonic() + HOST_SCAN_EVERY
        if now_due and any("host_dead" in h.events for h in hooks):
            self._scan_hosts(hooks)
        self._send_due()
        if new != cursor:
            self.r.set(self.keys.webhook_cursor, new)

    def _queue(
        self, hooks: list[Webhook], name: str, did: str, ms: int, data: dict[str, Any]
    ) -> None:
        body = body_of(self.pool, name, did, ms, data)
        for h in hooks:
            if h.wants(name, did):
                self.pending.append(Delivery(h, name, did, body))
        if len(self.pending) > MAX_PENDING:
            dropped = len(self.pending) - MAX_PENDING
            del self.pending[:dropped]
            _LOG.warning("webhooks: %d deliveries dropped (more than %d waiting)", dropped,
                         MAX_PENDING)  # fmt: skip

    def _scan_hosts(self, hooks: list[Webhook]) -> None:
        """Queue ``host_dead`` for each host whose heartbeat is older than ``host_timeout``
        (once per death: ``webhooks:dead`` holds the hosts already reported)."""
        hosts = sorted(str(h) for h in self.r.smembers(self.keys.hosts))
        if not hosts:
            return
        pipe = self.r.pipeline(transaction=False)
        for h in hosts:
            pipe.hget(self.keys.host(h), "last_heartbeat")
        beats = pipe.execute()
        now = int(time.time() * 1000)
        timeout = self.host_timeout_ms()
        for host_id, hb in zip(hosts, beats, strict=True):
            if hb is None:
                continue  # (removed meanwhile)
            if host_alive(hb, now, timeout):
                self.r.srem(self.keys.webhook_dead, host_id)
            elif self.r.sadd(self.keys.webhook_dead, host_id):
                data = {"host_id": host_id, "last_heartbeat": int(hb or 0)}
                self._queue(hooks, "host_dead", f"host_dead-{host_id}-{hb}", now, data)

    def _send_due(self) -> None:
        now = time.monotonic()
        due = [d for d in self.pending if d.next_at <= now]
        for d in due:
            if self.stopping.is_set():
                return
            error = self._send(d)
            if error is None:
                self.pending.remove(d)
                self.store.note(d.hook.id, True)
                continue
            d.tries += 1
            tries = 1 + len(self.retry_delays)
            if d.tries >= tries:
                self.pending.remove(d)
                why = f"{d.name} {d.delivery_id}: gave up after {tries} tries: {error}"
                _LOG.warning("webhook %s: %s", d.hook.id, why)
                self.store.note(d.hook.id, False, why)
            else:
                d.next_at = time.monotonic() + self.retry_delays[d.tries - 1]
                self.store.note(d.hook.id, False, f"{d.name} {d.delivery_id}: {error} "
                                f"(try {d.tries} of {tries})")  # fmt: skip

    def _send(self, d: Delivery) -> str | None:
        """One POST; None on a 2xx answer, else what went wrong."""
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "deviceq-webhook",
            "X-Deviceq-Event": d.name,
            "X-Deviceq-Delivery": d.delivery_id,
            "X-Deviceq-Signature": sign(d.hook.secret, d.body),
        }
        try:
            status = self.post(d.hook.url, d.body, headers)
        except OSError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None if 200 <= status < 300 else f"HTTP {status}"


def start_deliverer(admin: Any, is_leader: Callable[[], bool]) -> Deliverer:
    """Run the webhooks of ``admin``'s pool (a `PoolAdmin`) from this scheduler process."""

    def timeout_ms() -> float:
        return float(admin.config().host_timeout) * 1000

    d = Deliverer(admin.redis, admin.keys, admin.pool, is_leader, timeout_ms)
    d.start()
    return d


__all__ = ["EVENTS", "Deliverer", "Webhook", "WebhookStore", "sign", "start_deliverer"]
