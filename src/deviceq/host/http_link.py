"""`ApiHostClient`: a host's side of the protocol through the HTTP service ``deviceq api``
instead of Redis (a host that holds no Redis credentials): the other transport of
`deviceq.host.link.HostLink`, with the same methods, answers and errors as `HostClient`, so
the daemon runs unchanged on either.

Every request carries the host token as ``Authorization: Bearer`` (never logged, never in a
message) and the daemon's session as ``X-Deviceq-Session``. The API's error answers come
back as the same `deviceq.core.errors` exceptions (AuthError, SessionSuperseded, Busy, ...);
an API that cannot be reached, or answers that it is unavailable (503, a proxy's 502/504, a
rate limit), raises `ApiUnreachable`, a ``redis.ConnectionError``: the daemon rides it out
with its backoff exactly as an unreachable Redis. A certificate the CA bundle does not accept
raises `deviceq.core.tls.TLSError` (configuration at start, retried while running).
Standard library only (``http.client`` and ``ssl``); the requests themselves are sent by
`deviceq.core.http`."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlsplit

import redis

from ..core.config import PoolConfig
from ..core.errors import (
    AuthError,
    ConfigError,
    InvalidInput,
    NotConfirmed,
    SessionSuperseded,
    from_reply,
)
from ..core.http import API_PREFIX, ApiError, HttpTransport, check_api_url, tls_context
from ..core.models import Assignment, ScheduledTask, WorkflowDefinition
from ..core.tls import TLSError
from ..core.validation import validate_id
from ..core.vocabulary import FailureKind
from .heartbeat_sync import GONE, Heartbeat, HeartbeatSync, Reply, Row
from .link import HostLink, Renewal, Report, SessionInfo
from .log_stream import LogChunk
from .progress import ProgressUpdate, checked_update

SESSION_HEADER = "X-Deviceq-Session"
TRANSIENT_CODES = ("UNAVAILABLE", "RATE_LIMITED")
TRANSIENT_STATUS = (429, 502, 503, 504)


class ApiUnreachable(redis.ConnectionError):
    """The API could not be reached, or answered that it cannot serve now: the caller retries
    as while Redis is unreachable (the message names no secret)."""


def api_error(status: int, code: str, message: str, result: Any = None) -> Exception:
    """The exception an API error answer stands for: the `deviceq.core.errors` class of its
    code (NotConfirmed with ``result``), `ApiUnreachable` for an outage,
    `deviceq.core.http.ApiError` otherwise."""
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
    return ApiError(code or f"HTTP_{status}", message, status)


class ApiHostClient(HttpTransport, HostLink):
    """A host's side of the protocol through ``deviceq api`` (see the module docstring).

    >>> host = ApiHostClient("https://deviceq.example.com", None, "lab-1", token)
    >>> host.heartbeat([DeviceReport("pixel-7", "android")])
    """

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
        https = parts.scheme == "https"
        if ca is not None and not https:
            raise ConfigError("--api-ca applies to an https:// API URL")
        super().__init__(parts.netloc, tls_context(ca) if https else None)
        self._base = parts.path + API_PREFIX
        self.host_id = validate_id(host_id, "host id")
        if not token or not isinstance(token, str):
            raise InvalidInput("a host token is required")
        self._token = token
        self.session = validate_id(session, "session id") if session else ""
        self.timeout = float(timeout)
        self.pool = validate_id(pool, "pool name") if pool else ""
        self._refused = threading.Event()  # the last control wait was refused
        self._hb = HeartbeatSync()

    def __repr__(self) -> str:  # never shows the token
        return f"{type(self).__name__}(url={self.url!r}, host_id={self.host_id!r})"

    # -- requests ----------------------------------------------------------------------------
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
        try:
            status, raw = self.exchange(method, target, data, headers, self.timeout + wait)
        except ssl.SSLCertVerificationError as exc:
            raise TLSError(
                f"the API's certificate was not accepted ({exc.verify_message}): check "
                "--api-ca and that the certificate names the URL's host"
            ) from None
        except (OSError, http.client.HTTPException) as exc:
            raise ApiUnreachable(
                f"cannot reach the API at {self.url}: {type(exc).__name__}"
            ) from None
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
    def heartbeat_call(
        self,
        mode: str,
        ver: str,
        arg: str,
        total: int,
        rows: Sequence[Row],
        leases: Sequence[tuple[str, str]] = (),
    ) -> Reply:
        """One heartbeat call through the API (``lua/heartbeat.lua``'s mode delta, full or
        commit): the body carries the mode, versions and device rows. The API's heartbeat
        renews no lease (``heartbeat_renews`` is False: the daemon renews them with `renew`),
        so ``leases`` are not sent."""
        devs: list[dict[str, Any]] = []
        for did, driver, tags, state, reason, *rest in rows:
            if state == GONE:
                devs.append({"device_id": did, "state": GONE})
                continue
            dev = {
                "device_id": did,
                "driver_type": driver,
                "tags": [t for t in tags.split(",") if t],
                "state": state,
                "reason": reason,
            }
            if rest and rest[0] is not None:  # (the attributes' change: heartbeat_sync)
                dev["attrs"] = rest[0]
            devs.append(dev)
        body = {"mode": mode, "ver": ver, "arg": arg, "total": int(total), "devices": devs}
        doc = self._call("POST", "/heartbeat", body)
        hb = Heartbeat(
            int(doc["devices"]),
            int(doc["idle"]),
            bool(doc["draining"]),
            bool(doc.get("stopping")),
            frozenset(doc.get("quarantined") or ()),
        )
        return Reply(str(doc.get("status") or "ok"), hb)

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

    def wait_and_claim(self, timeout: float, max_count: int) -> list[Assignment]:
        """`wait_for_work`, then `claim` (two requests)."""
        self.wait_for_work(timeout)
        return self.claim(max_count)

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

    def progress(self, updates: Sequence[ProgressUpdate]) -> list[str]:
        """Record how far running attempts are (see `HostClient.progress`)."""
        if not updates:
            return []
        items = []
        for u in updates:
            c = checked_update(u)
            items.append({"task_id": c.task_id, "lease_id": c.lease_id,
                          "fraction": c.fraction, "text": c.text})  # fmt: skip
        return [str(a) for a in self._call("POST", "/progress", {"updates": items})["answers"]]

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

    def attributes_call(self, entries: Sequence[Sequence[str]]) -> int:
        """Send encoded attribute entries of this host's devices (see `HostClient`)."""
        return int(
            self._call("POST", "/devices/attributes", {"entries": [list(e) for e in entries]})[
                "changed"
            ]
        )

    def health_end(self, device_id: str, healthy: bool, output: str = "", reason: str = "") -> str:
        """Record the result of a check (the token scrubbed from what it printed)."""
        output, reason = self._health_result(healthy, output, reason)
        body = {"healthy": bool(healthy), "output": output, "reason": reason}
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
