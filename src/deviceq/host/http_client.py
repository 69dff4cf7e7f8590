"""`ApiHostClient`: a host's side of the protocol through the HTTP service ``deviceq api``
instead of Redis (a host that holds no Redis credentials), with `HostClient`'s interface
(`deviceq.host.client.HostLink`): the same methods, answers and errors, so the daemon runs
unchanged on either.

Every request carries the host token as ``Authorization: Bearer`` (never logged, never in a
message) and the daemon's session as ``X-Deviceq-Session``. The API's error answers come
back as the same `deviceq.core.errors` exceptions (AuthError, SessionSuperseded, Busy, ...);
an API that cannot be reached, or answers that it is unavailable (503, a proxy's 502/504, a
rate limit), raises `ApiUnreachable`, a ``redis.ConnectionError``: the daemon rides it out
with its backoff exactly as an unreachable Redis. A certificate the CA bundle does not accept
raises `deviceq.core.connection.TLSError` (configuration at start, retried while running).
Standard library only (``http.client`` and ``ssl``)."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import redis

from ..core.config import PoolConfig
from ..core.connection import TLSError
from ..core.errors import (
    AuthError,
    ConfigError,
    DeviceqError,
    InvalidInput,
    NotConfirmed,
    SessionSuperseded,
    from_reply,
)
from ..core.models import Assignment, FailureKind, ScheduledTask, WorkflowDefinition, validate_id
from .client import (
    DeviceReport,
    Heartbeat,
    Renewal,
    Report,
    SessionInfo,
    clean_reason,
    output_tail,
)
from .log_stream import LogChunk

API_PREFIX = "/api/v1"
SESSION_HEADER = "X-Deviceq-Session"
TRANSIENT_CODES = ("UNAVAILABLE", "RATE_LIMITED")
TRANSIENT_STATUS = (429, 502, 503, 504)
IDLE_REUSE = 2.0
"""Seconds a kept-alive connection may sit idle and still be reused: well under the idle
timeout of ``deviceq api``'s server (uvicorn closes after 5 s), so a reused connection is
not one the server is closing."""
STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)
"""Errors of a reused connection the server closed meanwhile: the request is sent once more
on a new connection (the daemon would retry the call anyway)."""


class ApiUnreachable(redis.ConnectionError):
    """The API could not be reached, or answered that it cannot serve now: the caller retries
    as while Redis is unreachable (the message names no secret)."""


class ApiError(DeviceqError):
    """An API error answer of a code deviceq has no class for (its ``code`` kept)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def check_api_url(url: object) -> str:
    """``url`` without a trailing ``/`` or ``/api/v1`` if it is an ``http://`` or ``https://``
    address with a host; ConfigError (one line) otherwise. Nothing is contacted."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError("the API URL is empty: give --api-url https://HOST[:PORT]")
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"invalid API URL {url[:80]!r}: use http(s)://HOST[:PORT] (the address of "
            "`deviceq api`)"
        )
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ConfigError(
            "the API URL carries no credentials, query or fragment: the host token goes in "
            "--token-file"
        )
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ConfigError(f"invalid API URL {url[:80]!r}: bad port") from None
    path = parts.path.rstrip("/")
    if path.endswith(API_PREFIX):
        path = path[: -len(API_PREFIX)]
    return f"{parts.scheme}://{parts.netloc}{path}"


def tls_context(ca: str | None) -> ssl.SSLContext:
    """The TLS settings of an ``https://`` API: the system's trust store, or the CA bundle
    ``ca`` (ConfigError when it cannot be read)."""
    if ca is None:
        return ssl.create_default_context()
    if not Path(ca).is_file():
        raise ConfigError(f"--api-ca {ca}: no such file")
    try:
        return ssl.create_default_context(cafile=ca)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"--api-ca {ca} is not a readable PEM CA bundle: {exc}") from None


class ApiHostClient:
    """A host's side of the protocol through ``deviceq api`` (see the module docstring).

    >>> host = ApiHostClient("https://deviceq.example.com", None, "lab-1", token)
    >>> host.heartbeat([DeviceReport("pixel-7", "android")])
    """

    keep_alive = True
    """Reuse one connection per thread (HTTP keep-alive) instead of one per request; a
    connection is dropped after any error and when idle for `IDLE_REUSE` seconds."""

    def __init__(
        self,
        url: str,
        pool: str | None,
        host_id: str,
        token: str,
        ca: str | None = None,
        *,
        session: str | None = None,
        timeout: float = 5.0,
    ) -> None:
        self.url = check_api_url(url)
        parts = urlsplit(self.url)
        self._https = parts.scheme == "https"
        if ca is not None and not self._https:
            raise ConfigError("--api-ca applies to an https:// API URL")
        self._ssl = tls_context(ca) if self._https else None
        self._netloc = parts.netloc
        self._base = parts.path + API_PREFIX
        self.pool = validate_id(pool, "pool name") if pool else ""
        self.host_id = validate_id(host_id, "host id")
        if not token or not isinstance(token, str):
            raise InvalidInput("a host token is required")
        self._token = token
        self.session = validate_id(session, "session id") if session else ""
        self.timeout = float(timeout)
        self._refused = threading.Event()  # the last control wait was refused
        self._local = threading.local()  # this thread's kept-alive connection, last use
        self._conns: set[http.client.HTTPConnection] = set()  # every thread's (for close)
        self._conns_lock = threading.Lock()

    def __repr__(self) -> str:  # never shows the token
        return f"ApiHostClient(url={self.url!r}, host_id={self.host_id!r})"

    # -- transport ---------------------------------------------------------------------------
    def _new_connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(self._netloc, timeout=timeout, context=self._ssl)
        return http.client.HTTPConnection(self._netloc, timeout=timeout)

    def _connection(self, timeout: float) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's kept-alive connection if fresh enough (and True), else a new one."""
        if not self.keep_alive:
            return self._new_connection(timeout), False
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is not None and time.monotonic() - self._local.used < IDLE_REUSE:
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            return conn, True
        self._drop(conn)
        conn = self._new_connection(timeout)
        self._local.conn = conn
        with self._conns_lock:
            self._conns.add(conn)
        return conn, False

    def _drop(self, conn: http.client.HTTPConnection | None) -> None:
        if conn is None:
            return
        conn.close()
        if getattr(self._local, "conn", None) is conn:
            self._local.conn = None
        with self._conns_lock:
            self._conns.discard(conn)

    def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None, wait: float = 0.0
    ) -> Any:
        """One request to ``/api/v1/hosts/HOST/path``: its JSON answer, or the error it
        stands for (see the module docstring). ``wait``: seconds the server may hold it."""
        target = f"{self._base}/hosts/{quote(self.host_id, safe='')}{path}"
        headers = {
            "Authorization": f"Bearer {self._token}",
            "Accept": "application/json",
            "User-Agent": "deviceq-host",
        }
        if self.session:
            headers[SESSION_HEADER] = self.session
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        while True:
            conn, reused = self._connection(self.timeout + wait)
            try:
                conn.request(method, target, body=data, headers=headers)
                resp = conn.getresponse()
                status, raw = resp.status, resp.read()
            except ssl.SSLCertVerificationError as exc:
                self._drop(conn)
                raise TLSError(
                    f"the API's certificate was not accepted ({exc.verify_message}): check "
                    "--api-ca and that the certificate names the URL's host"
                ) from None
            except (OSError, http.client.HTTPException) as exc:
                self._drop(conn)
                if reused and isinstance(exc, STALE):
                    continue  # closed by the server meanwhile: once more on a new connection
                raise ApiUnreachable(
                    f"cannot reach the API at {self.url}: {type(exc).__name__}"
                ) from None
            if self.keep_alive and not resp.will_close:
                self._local.used = time.monotonic()
            else:
                self._drop(conn)
            return self._answer(status, raw)

    def _answer(self, status: int, raw: bytes) -> Any:
        try:
            doc = json.loads(raw) if raw else None
        except ValueError:
            doc = None
        if 200 <= status < 300:
            if doc is None:
                raise ApiUnreachable(f"the API at {self.url} answered HTTP {status} without JSON")
            return doc
        err = doc.get("error") if isinstance(doc, dict) else None
        if not isinstance(err, dict):
            if status in TRANSIENT_STATUS or status >= 500:
                raise ApiUnreachable(f"the API at {self.url} answered HTTP {status}")
            raise ConfigError(
                f"the API at {self.url} answered HTTP {status}: is it `deviceq api` (check "
                "--api-url)?"
            )
        raise api_error(
            status, str(err.get("code", "")), str(err.get("message", "")), err.get("result")
        )

    # -- session -----------------------------------------------------------------------------
    def host_record(self) -> dict[str, str]:
        """The host's session fields as stored (session, session_owner, last_heartbeat)."""
        doc = self._call("GET", "/session")
        return {k: str(doc.get(k) or "") for k in ("session", "session_owner", "last_heartbeat")}

    def start_session(
        self, session: str, mode: str = "start", owner: str = "", expected: str = ""
    ) -> SessionInfo:
        """Start this client's session (see `HostClient.start_session`)."""
        validate_id(session, "session id")
        body = {"session": session, "mode": mode, "owner": owner, "expected": expected}
        doc = self._call("POST", "/session", body)
        self.session = session
        return SessionInfo(
            int(doc["epoch"]), str(doc.get("replaced") or ""), int(doc.get("handed_back") or 0)
        )

    def end_session(self) -> bool:
        """End this client's session if it is still current (a clean daemon exit)."""
        if not self.session:
            return False
        return bool(self._call("DELETE", "/session")["ended"])

    # -- protocol ----------------------------------------------------------------------------
    def heartbeat(self, devices: Iterable[DeviceReport]) -> Heartbeat:
        """Report this host alive and its full device snapshot."""
        devs = []
        for d in devices:
            did, driver, tags, state, reason = d.args()
            devs.append(
                {
                    "device_id": did,
                    "driver_type": driver,
                    "tags": [t for t in tags.split(",") if t],
                    "state": state,
                    "reason": reason,
                }
            )
        doc = self._call("POST", "/heartbeat", {"devices": devs})
        return Heartbeat(
            int(doc["devices"]),
            int(doc["idle"]),
            bool(doc["draining"]),
            bool(doc.get("stopping")),
            frozenset(doc.get("quarantined") or ()),
        )

    def claim(self, max_count: int = 1) -> list[Assignment]:
        """Take up to ``max_count`` assignments from this host's inbox to ``dispatched``."""
        doc = self._call("POST", "/claim", {"max": int(max_count)})
        return [Assignment.model_validate(a) for a in doc["assignments"]]

    def wait_for_work(self, timeout: float) -> bool:
        """Block until an assignment may be waiting (or ``timeout`` seconds pass). A refused
        wait (token rotated, session fenced) answers True: the next claim says why."""
        try:
            doc = self._call("POST", "/wait", {"timeout": max(0.0, timeout)}, wait=timeout)
        except (AuthError, SessionSuperseded):
            return True
        return bool(doc["woken"])

    def nudge(self) -> None:
        """Wake this host's own blocking inbox wait (its daemon is stopping)."""
        self._call("POST", "/nudge", {})

    def wait_for_control(self, timeout: float) -> str | None:
        """Block until a control message arrives for this host or ``timeout`` seconds pass
        (the first message; one poll drains the rest, they are hints). A refused wait (token
        rotated, session fenced) answers ``refused`` at once, the next one after waiting:
        the renewal and heartbeat it prompts say why."""
        timeout = max(0.01, timeout)
        if self._refused.is_set():
            time.sleep(timeout)  # refused last time too: do not spin
        try:
            doc = self._call("POST", "/control", {"timeout": timeout}, wait=timeout)
        except (AuthError, SessionSuperseded):
            self._refused.set()
            return "refused"
        self._refused.clear()
        msgs = doc.get("messages") or []
        return str(msgs[0]) if msgs else None

    def renew(self, leases: Sequence[tuple[str, str]]) -> list[Renewal]:
        """Extend leases given as (task_id, lease_id) pairs, in one call."""
        if not leases:
            return []
        body = {
            "leases": [
                {"task_id": validate_id(t, "task id"), "lease_id": validate_id(lid, "lease id")}
                for t, lid in leases
            ]
        }
        doc = self._call("POST", "/renew", body)
        out = []
        for r in doc["renewals"]:
            if r["status"] == "lost":
                out.append(Renewal(str(r["task_id"]), "lost", reason=str(r.get("reason") or "")))
            else:
                out.append(
                    Renewal(
                        str(r["task_id"]),
                        str(r["status"]),
                        expires_at=int(r["expires_at"]),
                        lease_ms=int(r.get("lease_ms") or 0),
                    )
                )
        return out

    def log_append(self, chunks: Sequence[LogChunk]) -> list[str]:
        """Append to live log streams (see `HostClient.log_append`)."""
        if not chunks:
            return []
        items = [
            {
                "task_id": validate_id(c.task_id, "task id"),
                "lease_id": validate_id(c.lease_id, "lease id"),
                "stream": c.stream,
                "text": c.text,
                "final": c.final,
            }
            for c in chunks
        ]
        return [str(a) for a in self._call("POST", "/logs", {"chunks": items})["answers"]]

    def record_artifacts(
        self,
        task_id: str,
        attempt: int,
        files: Sequence[tuple[str, int, str]],
        error: str = "",
    ) -> int:
        """Record the files (name, size, sha256) uploaded for one attempt this host ran (see
        `HostClient.record_artifacts`): AuthError for another host's attempt."""
        body = {
            "task_id": validate_id(task_id, "task id"),
            "attempt": int(attempt),
            "files": [{"name": n, "size": int(size), "sha256": sha} for n, size, sha in files],
            "error": error,
        }
        return int(self._call("POST", "/artifacts", body)["recorded"])

    def report_many(self, reports: Sequence[Report]) -> list[str]:
        """End attempts (see `HostClient.report_many`): NotConfirmed carries the answers."""
        if not reports:
            return []
        items = []
        for r in reports:
            kind = (
                r.failure_kind.value if isinstance(r.failure_kind, FailureKind) else r.failure_kind
            )
            items.append(
                {
                    "task_id": validate_id(r.task_id, "task id"),
                    "lease_id": validate_id(r.lease_id, "lease id"),
                    "outcome": r.outcome,
                    "failure_kind": None if r.outcome == "cancelled" else kind or None,
                    "payload": r.payload or "",
                }
            )
        return [str(a) for a in self._call("POST", "/report", {"reports": items})["answers"]]

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
        """Hand an attempt back: queued again at once, keeping its place."""
        return self.report(task_id, lease_id, "released", None, reason)

    def set_draining(self, draining: bool = True) -> str:
        """Mark this host's daemon as shutting down (no new assignments) or running again."""
        return str(self._call("POST", "/draining", {"draining": bool(draining)})["result"])

    # -- health checks -----------------------------------------------------------------------
    def _health(self, device_id: str, action: str, body: dict[str, Any] | None = None) -> Any:
        did = quote(validate_id(device_id, "device id"), safe="")
        return self._call("POST", f"/devices/{did}/health/{action}", body or {})

    def health_begin(self, device_id: str) -> bool:
        """Take one of this host's devices for a health check (see `HostClient`)."""
        return bool(self._health(device_id, "begin")["taken"])

    def health_next(self, device_id: str) -> bool:
        """Mark a device for a check after the task that holds it (see `HostClient`)."""
        return bool(self._health(device_id, "next")["taken"])

    def health_end(self, device_id: str, healthy: bool, output: str = "", reason: str = "") -> str:
        """Record the result of a check (the token scrubbed from what it printed)."""
        output = (output or "").replace(self._token, "[host token]")
        reason = "" if healthy else clean_reason(reason.replace(self._token, "[host token]"))
        body = {"healthy": bool(healthy), "output": output_tail(output), "reason": reason}
        return str(self._health(device_id, "end", body)["health"])

    def health_clear(self, device_id: str) -> str:
        """Forget a device's health; returns the health it had ('' for none)."""
        return str(self._health(device_id, "clear")["health"] or "")

    def device_health(self, device_ids: Sequence[str]) -> dict[str, str]:
        """The stored ``health`` of this host's devices ('' when never checked)."""
        ids = [validate_id(d, "device id") for d in device_ids]
        if not ids:
            return {}
        health = self._call("POST", "/devices/health", {"device_ids": ids})["health"]
        return {d: str(health.get(d) or "") for d in ids}

    # -- reads -------------------------------------------------------------------------------
    def part_statuses(self, task: ScheduledTask) -> list[str]:
        """The status of the other parts of a multi-device task (see `HostClient`)."""
        if not task.gang:
            return []
        tid = quote(validate_id(task.id, "task id"), safe="")
        return [str(s) for s in self._call("GET", f"/tasks/{tid}/parts")["statuses"]]

    def storage_warning(self, what: str) -> str | None:
        """Nothing to check from here: the API service warns about its Redis itself."""
        return None

    def config(self) -> PoolConfig:
        """The pool's settings, as the API serves them."""
        return PoolConfig.model_validate(self._call("GET", "/config"))

    def get_workflow(self, name: str) -> WorkflowDefinition:
        """A stored `WorkflowDefinition` (NotFound when there is none)."""
        doc = self._call("GET", f"/workflows/{quote(validate_id(name, 'workflow name'), safe='')}")
        return WorkflowDefinition.model_validate(doc)

    def close(self) -> None:
        """Close the kept-alive connections (of every thread); a later call opens anew."""
        with self._conns_lock:
            conns, self._conns = self._conns, set()
        for conn in conns:
            conn.close()
        self._local = threading.local()


def api_error(status: int, code: str, message: str, result: Any = None) -> Exception:
    """The exception an API error answer stands for: the `deviceq.core.errors` class of its
    code (NotConfirmed with ``result``), `ApiUnreachable` for an outage, `ApiError`
    otherwise."""
    message = message.splitlines()[0] if message else code or f"HTTP {status}"
    if code in TRANSIENT_CODES or (not code and status in TRANSIENT_STATUS):
        return ApiUnreachable(f"the API is unavailable (HTTP {status} {code}): {message}")
    if code == NotConfirmed.code:
        return NotConfirmed(message, [str(a) for a in result or []])
    typed = from_reply(f"{code} {message}") if code else None
    if typed is not None:
        return typed
    if status >= 500:
        return ApiUnreachable(f"the API failed (HTTP {status} {code}): {message}")
    return ApiError(code or f"HTTP_{status}", message)
