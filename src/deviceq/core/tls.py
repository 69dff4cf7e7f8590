"""TLS to Redis (``rediss://``): the CA bundle and client certificate from the call, the URL's
query or the environment, checked before connecting (`tls_options`), and a failed handshake
as one `TLSError` saying what to check (`TLSConnection`)."""

from __future__ import annotations

import os
import re
import ssl
from typing import Any
from urllib.parse import quote, unquote_plus

import redis
from redis.connection import SSLConnection

from .errors import ConfigError
from .redis_urls import redact_url

# The TLS files: redis-py's keyword (and URL query) name -> the environment variable read when
# neither the call nor the URL gives it, and what a message calls it.
TLS_FILES: dict[str, tuple[str, str]] = {
    "ssl_ca_certs": ("DEVICEQ_REDIS_CA", "CA bundle"),
    "ssl_certfile": ("DEVICEQ_REDIS_CERT", "client certificate"),
    "ssl_keyfile": ("DEVICEQ_REDIS_KEY", "client key"),
}
TLS_QUERY = (*TLS_FILES, "ssl_cert_reqs")
CERT_REQS = ("none", "optional", "required")
_CLI_OPTION = {"ssl_ca_certs": "--redis-ca", "ssl_certfile": "--redis-cert",
               "ssl_keyfile": "--redis-key"}  # fmt: skip


class TLSError(ConfigError, redis.ConnectionError):
    """A TLS connection to Redis failed for a reason of its configuration: the server's
    certificate was not accepted (wrong CA bundle, a host name the certificate does not name),
    or the server refused the client (no client certificate, or one it does not trust). The
    message says what to check and never holds key material or a password.

    A ``ConfigError`` for callers, and still a ``redis.ConnectionError``: a daemon that meets
    it while running keeps retrying, as it does while Redis is unreachable, so that a fixed
    certificate revives it (``deviceq`` commands check once at start and fail in one line)."""


def scheme_is_tls(url: str) -> bool:
    """Whether ``url`` is a ``rediss://`` URL."""
    return url.lower().startswith("rediss://")


def _split_query(url: str) -> tuple[str, list[str], str]:
    """``url`` as (everything before ``?``, the raw ``key=value`` pieces, ``#fragment``)."""
    base, _, rest = url.partition("?")
    query, hashmark, frag = rest.partition("#")
    return base, [p for p in query.split("&") if p], hashmark + frag


def tls_query(url: str) -> tuple[str, dict[str, str]]:
    """Take the TLS options (``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``,
    ``ssl_cert_reqs``) out of ``url``'s query: returns the URL without them (every other
    query piece kept as written) and their values, decoded once as a query string is
    (``%2B`` is ``+``, ``+`` is a space). A key given twice with two values is a
    ConfigError."""
    base, pieces, frag = _split_query(url)
    found: dict[str, str] = {}
    kept: list[str] = []
    for piece in pieces:
        raw_key, _, raw_value = piece.partition("=")
        key = unquote_plus(raw_key)
        if key not in TLS_QUERY:
            kept.append(piece)
            continue
        value = unquote_plus(raw_value)
        if key in found and found[key] != value:
            raise ConfigError(f"{key} is given twice in the Redis URL, with two values")
        found[key] = value
    return base + ("?" + "&".join(kept) if kept else "") + frag, found


def with_tls_files(
    url: str,
    *,
    ca: str | None = None,
    cert: str | None = None,
    key: str | None = None,
    given_as: str = "TLS options",
) -> str:
    """``url`` with the given TLS files added to its query (``ssl_ca_certs``, ``ssl_certfile``,
    ``ssl_keyfile``, as absolute paths), which every deviceq client and daemon understands
    (see :func:`connect`): the way the command line hands ``--redis-ca/--redis-cert/--redis-key``
    to the clients it makes and to ``HostWorker``, which takes a URL. Nothing given: ``url``
    unchanged. ConfigError if a file is given for a URL that is not ``rediss://``, or the URL
    already names a different one (``given_as`` names the options in that message)."""
    files = {"ssl_ca_certs": ca, "ssl_certfile": cert, "ssl_keyfile": key}
    given = {k: os.path.abspath(os.path.expanduser(v)) for k, v in files.items() if v}
    if not given:
        return url
    if not scheme_is_tls(url):
        raise ConfigError(
            f"{given_as} need a TLS URL (rediss://HOST:PORT/DB), not {redact_url(url)!r}"
        )
    _, in_url = tls_query(url)
    base, pieces, frag = _split_query(url)
    for name, path in given.items():
        if name in in_url:
            if os.path.abspath(os.path.expanduser(in_url[name])) != path:
                raise ConfigError(
                    f"the Redis TLS {TLS_FILES[name][1]} is given twice, by {given_as} "
                    f"({path}) and by {name} in the URL ({in_url[name]}): give it once"
                )
            continue
        pieces.append(f"{name}={quote(path, safe='/')}")
    return base + "?" + "&".join(pieces) + frag


def _where(name: str) -> str:
    env, _ = TLS_FILES[name]
    return f"{name} / {_CLI_OPTION[name]} / {env}"


def _check_file(name: str, path: str) -> str:
    what = TLS_FILES[name][1]
    if not os.path.exists(path):
        raise ConfigError(f"the Redis TLS {what} {path} ({_where(name)}) does not exist")
    if not os.path.isfile(path):
        raise ConfigError(f"the Redis TLS {what} {path} ({_where(name)}) is not a file")
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
    except OSError as exc:
        raise ConfigError(
            f"cannot read the Redis TLS {what} {path} ({_where(name)}): {exc.strerror or exc}"
        ) from None
    marker = b"PRIVATE KEY-----" if name == "ssl_keyfile" else b"-----BEGIN CERTIFICATE-----"
    if marker not in data:
        kind = "PEM private key" if name == "ssl_keyfile" else "PEM certificate"
        raise ConfigError(f"the Redis TLS {what} {path} ({_where(name)}) holds no {kind}")
    return path


class _EncryptedKey(Exception):
    """Raised by the password callback: the key is encrypted (deviceq asks for no password)."""


def _no_password() -> bytes:
    raise _EncryptedKey


def _check_tls_files(files: dict[str, str]) -> None:
    """Load the files the way the connection will (ConfigError naming the file and the
    problem); nothing but the file names and OpenSSL's reason is ever shown."""
    for name, path in files.items():
        _check_file(name, path)
    ca, cert, key = (files.get(n) for n in TLS_FILES)
    if key and not cert:
        raise ConfigError(
            f"a Redis TLS client key ({_where('ssl_keyfile')}) needs its client certificate "
            f"({_where('ssl_certfile')})"
        )
    context = ssl.create_default_context()
    if ca:
        try:
            context.load_verify_locations(cafile=ca)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"cannot load the Redis TLS CA bundle {ca} ({_where('ssl_ca_certs')}): {exc}"
            ) from None
    if cert:
        if not key:
            with open(cert, "rb") as f:
                if b"PRIVATE KEY-----" not in f.read(1 << 20):
                    raise ConfigError(
                        f"the Redis TLS client certificate {cert} holds no private key: give "
                        f"the client key too ({_where('ssl_keyfile')})"
                    )
        try:
            context.load_cert_chain(cert, key, password=_no_password)
        except _EncryptedKey:
            raise ConfigError(
                f"the Redis TLS client key {key or cert} is encrypted: deviceq needs it "
                "unencrypted (e.g. openssl pkey -in KEY -out PLAIN_KEY), readable by this "
                "user only"
            ) from None
        except (ssl.SSLError, OSError) as exc:
            reason = getattr(exc, "reason", None)
            if reason == "KEY_VALUES_MISMATCH":
                why = "the key does not belong to the certificate"
            else:
                why = f"not a PEM certificate and its key? ({exc})"
            raise ConfigError(
                f"cannot load the Redis TLS client certificate {cert} with the key "
                f"{key or cert}: {why}"
            ) from None


def tls_options(url: str, given: dict[str, Any] | None = None) -> tuple[str, dict[str, str]]:
    """Resolve the TLS options of one connection: returns ``url`` without its TLS query
    options and the redis-py keyword arguments (``ssl_ca_certs``, ``ssl_certfile``,
    ``ssl_keyfile``, ``ssl_cert_reqs``) to connect with, the files checked (ConfigError).

    Each option comes from ``given`` (keyword arguments of :func:`connect`), else the URL's
    query, else, for the three files, the environment (``DEVICEQ_REDIS_CA``,
    ``DEVICEQ_REDIS_CERT``, ``DEVICEQ_REDIS_KEY``, through :class:`Settings`). A keyword
    argument and the URL giving two different values is a ConfigError. The environment is used
    only for ``rediss://`` URLs (a plain ``redis://`` or ``unix://`` URL ignores it); a keyword
    argument or a URL option with a URL that is not ``rediss://`` is a ConfigError."""
    bare, in_url = tls_query(url)
    explicit: dict[str, str] = {}
    for name, raw in (given or {}).items():
        if raw is None:
            continue
        if name not in TLS_QUERY:
            raise ConfigError(f"unknown TLS option {name}")
        if isinstance(raw, ssl.VerifyMode) and name == "ssl_cert_reqs":
            raw = {ssl.CERT_NONE: "none", ssl.CERT_OPTIONAL: "optional"}.get(raw, "required")
        value = os.fspath(raw) if isinstance(raw, str | os.PathLike) else None
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{name} must be a non-empty string (a path), not {raw!r}")
        explicit[name] = value
        if name in in_url and in_url[name] != value:
            raise ConfigError(
                f"{name} is given twice, as an argument and in the Redis URL, with two values"
            )
    chosen = {**in_url, **explicit}
    if not scheme_is_tls(url):
        if chosen:
            raise ConfigError(
                f"{', '.join(sorted(chosen))} need a TLS URL (rediss://HOST:PORT/DB), not "
                f"{redact_url(url)!r}"
            )
        return url, {}
    from .config import Settings  # (pydantic_settings: read for TLS URLs only)

    settings = Settings()
    from_env = {
        "ssl_ca_certs": settings.redis_ca,
        "ssl_certfile": settings.redis_cert,
        "ssl_keyfile": settings.redis_key,
    }
    for name, env_value in from_env.items():
        if env_value and name not in chosen:
            chosen[name] = env_value
    reqs = chosen.get("ssl_cert_reqs")
    if reqs is not None and reqs.lower() not in CERT_REQS:
        raise ConfigError(f"ssl_cert_reqs must be one of {', '.join(CERT_REQS)}, not {reqs!r}")
    files = {n: os.path.abspath(os.path.expanduser(chosen[n])) for n in TLS_FILES if chosen.get(n)}
    _check_tls_files(files)
    out: dict[str, str] = dict(files)
    if reqs is not None:
        out["ssl_cert_reqs"] = reqs.lower()
    return bare, out


def _tls_cause(exc: BaseException) -> BaseException | None:
    """What made a redis-py connection error a TLS failure: an ``ssl.SSLError`` in its cause or
    context chain, or a handshake that timed out; None for any other failure."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, ssl.SSLError):
            return cur
        if isinstance(cur, TimeoutError) and "handshake" in str(cur):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def _ssl_text(err: BaseException) -> str:
    """OpenSSL's reason in words (``tlsv13 alert certificate required``), without the
    ``(_ssl.c:NNN)`` source location."""
    reason = getattr(err, "reason", None)
    if reason:
        return str(reason).replace("_", " ").lower()
    text = str(err.args[1] if isinstance(err, OSError) and len(err.args) > 1 else err)
    return re.sub(r"\s*\(?_ssl\.c:\d+\)?:?\s*", " ", text).strip().rstrip(".") or "no reason given"


def describe_tls_failure(err: BaseException, where: str, *, client_cert: bool) -> str:
    """One line saying why a TLS connection to ``where`` (``host:port``) failed and what to
    check, from OpenSSL's reason (never key material)."""
    if isinstance(err, ssl.SSLCertVerificationError):
        why = err.verify_message or _ssl_text(err)
        return (
            f"TLS: the certificate of Redis at {where} was not accepted ({why}): give the CA "
            f"bundle that signed it ({_where('ssl_ca_certs')}) and a host name it names"
        )
    if not isinstance(err, ssl.SSLError):  # the handshake timed out
        return (
            f"TLS: Redis at {where} did not answer the TLS handshake ({_ssl_text(err)}): is "
            "that its TLS port (tls-port)? A plain port never answers one"
        )
    reason = (err.reason or "").upper()
    refused = any(r in reason for r in ("CERTIFICATE_REQUIRED", "HANDSHAKE_FAILURE",
                  "UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_UNKNOWN", "ACCESS_DENIED",
                  "CERTIFICATE_EXPIRED", "DECRYPT_ERROR"))  # fmt: skip
    closed = isinstance(err, ssl.SSLEOFError | ssl.SSLZeroReturnError)
    if not client_cert and (refused or closed):
        return (
            f"TLS: Redis at {where} refused the connection ({_ssl_text(err)}): it requires a "
            f"client certificate; give one ({_where('ssl_certfile')}) and its key "
            f"({_where('ssl_keyfile')})"
        )
    if client_cert and (refused or closed):
        return (
            f"TLS: Redis at {where} refused the client certificate ({_ssl_text(err)}): it must "
            "be signed by a CA the server trusts (its tls-ca-cert-file) and be valid now"
        )
    return f"TLS: the connection to Redis at {where} failed ({_ssl_text(err)})"


class TLSConnection(SSLConnection):
    """redis-py's ``SSLConnection`` (every ``rediss://`` client deviceq makes uses it) whose
    TLS failures raise :class:`TLSError`, one line saying what to check, instead of redis-py's
    generic connection error; and whose handshake is bounded by the connect timeout, not by
    the (long) read timeout, so that a plain port given a ``rediss://`` URL fails in seconds."""

    def _connect(self) -> Any:
        read_timeout = self.socket_timeout
        self.socket_timeout = self.socket_connect_timeout  # during connect and handshake
        try:
            sock = super()._connect()
        finally:
            self.socket_timeout = read_timeout
        sock.settimeout(read_timeout)
        return sock

    def _raise_tls_error(self, exc: redis.RedisError) -> None:
        if isinstance(exc, TLSError):
            return
        cause = _tls_cause(exc)
        if cause is not None:
            where = f"{self.host}:{self.port}"
            msg = describe_tls_failure(cause, where, client_cert=bool(self.certfile))
            raise TLSError(msg) from exc

    def connect(self) -> None:
        try:
            super().connect()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._raise_tls_error(exc)
            raise

    def connect_check_health(self, *args: Any, **kwargs: Any) -> None:
        try:
            super().connect_check_health(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._raise_tls_error(exc)
            raise
