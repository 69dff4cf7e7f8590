"""The HTTP side of `ApiHostClient` (see `http_client`): one host's requests to ``deviceq
api`` (``/api/v1/hosts/HOST/...``), over kept-alive connections, with the host token and the
session; the answers back as JSON or as the `deviceq.core.errors` exception an error answer
stands for, an outage as `ApiUnreachable`. Standard library only (``http.client``, ``ssl``)."""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import redis

from .errors import ConfigError, DeviceqError, InvalidInput, NotConfirmed, from_reply
from .models import validate_id
from .tls import TLSError

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


class ApiTransport:
    """Requests of one host to ``deviceq api`` at ``url``: `_call` sends one and returns its
    JSON answer or raises the error it stands for."""

    keep_alive = True
    """Reuse one connection per thread (HTTP keep-alive) instead of one per request; a
    connection is dropped after any error and when idle for `IDLE_REUSE` seconds."""

    def __init__(
        self,
        url: str,
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
        self.host_id = validate_id(host_id, "host id")
        if not token or not isinstance(token, str):
            raise InvalidInput("a host token is required")
        self._token = token
        self.session = validate_id(session, "session id") if session else ""
        self.timeout = float(timeout)
        self._local = threading.local()  # this thread's kept-alive connection, last use
        self._conns: set[http.client.HTTPConnection] = set()  # every thread's (for close)
        self._conns_lock = threading.Lock()

    def __repr__(self) -> str:  # never shows the token
        return f"{type(self).__name__}(url={self.url!r}, host_id={self.host_id!r})"

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
