"""The one HTTP transport to ``deviceq api``, for both roles that talk to it: the producer's
`deviceq.producer.http_client.ApiClient` and the host's `deviceq.host.http_link.ApiHostClient`
send their requests through `HttpTransport` (kept-alive connections, one per thread) and read
the answers each its own way. Here too: the API URL and TLS checks of a host's
``--api-url``/``--api-ca``, and `ApiError`, an error answer of a code no other deviceq error
has. Standard library only (``http.client``, ``ssl``)."""

from __future__ import annotations

import http.client
import ssl
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from .errors import ConfigError, DeviceqError

API_PREFIX = "/api/v1"
IDLE_REUSE = 2.0
"""Seconds a kept-alive connection may sit idle and still be reused: well under the idle
timeout of ``deviceq api``'s server (uvicorn closes after 5 s), so a reused connection is
not one the server is closing."""
STALE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)
"""Errors of a reused connection the server closed meanwhile: the request may be sent once
more on a new connection (`HttpTransport.exchange`'s ``resend_stale``)."""


class ApiError(DeviceqError):
    """An error answer of the HTTP service with a code no other deviceq error has
    (``RATE_LIMITED``, ``TOO_LARGE``, ``UNAVAILABLE``, ``INTERNAL``...): ``code`` holds it,
    ``status`` the HTTP status (0 when not known)."""

    def __init__(self, code: str, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


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


class HttpTransport:
    """Requests to one HTTP(S) service at ``netloc`` (``HOST[:PORT]``; TLS when
    ``ssl_context`` is given): `exchange` sends one and returns its status and body."""

    keep_alive = True
    """Reuse one connection per thread (HTTP keep-alive) instead of one per request; a
    connection is dropped after any error and when idle for `IDLE_REUSE` seconds."""

    def __init__(self, netloc: str, ssl_context: ssl.SSLContext | None) -> None:
        self._netloc = netloc
        self._ssl = ssl_context
        self._local = threading.local()  # this thread's kept-alive connection, last use
        self._conns: set[http.client.HTTPConnection] = set()  # every thread's (for close)
        self._conns_lock = threading.Lock()

    def _new_connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._ssl is not None:
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

    def exchange(
        self,
        method: str,
        target: str,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout: float,
        *,
        resend_stale: bool = True,
    ) -> tuple[int, bytes]:
        """One request (``target``: the path and query) and its answer's status and body.
        A connection that failed is dropped and its error raised (an ``OSError`` or
        ``http.client.HTTPException``), but for a reused connection the server closed
        meanwhile (`STALE`): with ``resend_stale`` the request goes once more on a new one."""
        while True:
            conn, reused = self._connection(timeout)
            try:
                conn.request(method, target, body=body, headers=dict(headers))
                resp = conn.getresponse()
                status, payload = resp.status, resp.read()
            except (OSError, http.client.HTTPException) as exc:
                self._drop(conn)
                if reused and resend_stale and isinstance(exc, STALE):
                    continue  # closed by the server meanwhile: once more on a new connection
                raise
            if self.keep_alive and not resp.will_close:
                self._local.used = time.monotonic()
            else:
                self._drop(conn)
            return status, payload

    def close_own(self) -> None:
        """Close this thread's kept-alive connection (a later request opens a new one)."""
        self._drop(getattr(self._local, "conn", None))

    def close(self) -> None:
        """Close the kept-alive connections of every thread; a later request opens anew."""
        with self._conns_lock:
            conns, self._conns = self._conns, set()
        for conn in conns:
            conn.close()
        self._local = threading.local()
