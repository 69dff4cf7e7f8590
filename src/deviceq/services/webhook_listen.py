"""A webhook receiver to try a pool's webhooks with (``deviceq webhook listen``): a loopback
HTTP server that checks each delivery's ``X-Deviceq-Signature`` against the secret and
prints one line per delivery — ``EVENT signature ok SUBJECT`` (SUBJECT: the task, device or
host it is about), ``BAD`` for a signature that does not match (answered 401, so the
deliverer records the error) — or, with ``as_json``, the delivery's body with
``signature_ok`` and ``repeat`` added. A delivery id seen before (a retry, a new leader
resending) is marked ``(repeat)`` (among the last `REMEMBERED` ids). It is a tool for trying
webhooks, not a production receiver: one thread, bodies of at most `MAX_BODY` bytes."""

from __future__ import annotations

import hmac
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from .webhooks import sign

MAX_BODY = 1 << 20
"""The largest body read (bytes); a larger one is answered 413."""
REMEMBERED = 10_000
"""Delivery ids kept to mark repeats (the newest; an older repeat is not marked)."""


def subject(body: dict[str, Any]) -> str:
    """What a delivery is about: its task, else its device, else its host ('-' for none)."""
    data = body.get("data")
    if not isinstance(data, dict):
        return "-"
    for name in ("task_id", "device_id", "host_id", "task", "device", "host"):
        if data.get(name):
            return str(data[name])
    return "-"


class Listener:
    """The server: `serve` handles deliveries until `count` distinct ones were received (a
    repeat is not counted; 0: until `close`), calling `emit` with each delivery's line."""

    def __init__(
        self,
        secret: str,
        emit: Callable[[str], None],
        *,
        host: str = "127.0.0.1",
        port: int = 8099,
        as_json: bool = False,
        count: int = 0,
    ) -> None:
        self.secret, self.emit, self.as_json, self.count = secret, emit, as_json, count
        self.received = 0
        self.seen: OrderedDict[str, None] = OrderedDict()  # the newest REMEMBERED ids
        self.done = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                outer.handle(self)

            def log_message(self, *args: Any) -> None:  # the deliveries' lines say it all
                pass

        self.server = HTTPServer((host, port), Handler)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def handle(self, req: BaseHTTPRequestHandler) -> None:
        try:
            length = int(req.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self._answer(req, 413)
            return
        raw = req.rfile.read(length)
        given = req.headers.get("X-Deviceq-Signature") or ""
        ok = bool(given) and hmac.compare_digest(sign(self.secret, raw), given)
        delivery = req.headers.get("X-Deviceq-Delivery") or ""
        repeat = bool(delivery) and delivery in self.seen
        if delivery and not repeat:
            self.seen[delivery] = None
            if len(self.seen) > REMEMBERED:
                self.seen.popitem(last=False)
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            body = {"event": req.headers.get("X-Deviceq-Event") or "?", "data": {}}
        if self.as_json:
            line = json.dumps({**body, "signature_ok": ok, "repeat": repeat}, sort_keys=True)
        else:
            line = f"{body.get('event', '?')} signature {'ok' if ok else 'BAD'} {subject(body)}"
            line += " (repeat)" if repeat else ""
        self.emit(line)  # before the answer: a sender that got it finds the line written
        self._answer(req, 204 if ok else 401)
        if not repeat:  # (a sender's retry of one it already got is not a new delivery)
            self.received += 1
        if self.count and self.received >= self.count:
            self.done.set()

    @staticmethod
    def _answer(req: BaseHTTPRequestHandler, code: int) -> None:
        req.send_response(code)
        req.send_header("Content-Length", "0")
        req.end_headers()

    def serve(self) -> None:
        """Handle deliveries until `count` were received or `close` is called."""
        thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        thread.start()
        try:
            self.done.wait()
        finally:
            self.server.shutdown()
            self.server.server_close()

    def close(self) -> None:
        self.done.set()
