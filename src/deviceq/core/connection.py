"""One pool on one Redis connection: the base every client (producer, host, admin,
scheduler) builds on."""

from __future__ import annotations

import inspect
import os
import re
import ssl
from typing import Any
from urllib.parse import quote, unquote, unquote_plus

import redis
from redis.backoff import ExponentialBackoff
from redis.connection import SSLConnection
from redis.retry import Retry

from .config import PoolConfig, Settings
from .errors import ConfigError, NotFound
from .keys import Keys
from .models import WorkflowDefinition, validate_id
from .redirects import FollowingRedis
from .scripts import Scripts
from .sentinel import connect_sentinel, is_sentinel_url, parse_sentinel_url

URL_SCHEMES = ("redis://", "rediss://", "unix://")

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


PASSWORD_ENV = "DEVICEQ_REDIS_PASSWORD"
PASSWORD_FILE_ENV = "DEVICEQ_REDIS_PASSWORD_FILE"
MAX_PASSWORD_BYTES = 4096


def redis_password() -> str | None:
    """The Redis password when the URL gives none: ``DEVICEQ_REDIS_PASSWORD``, else the
    first line of the file ``DEVICEQ_REDIS_PASSWORD_FILE`` names (what the command line's
    ``--redis-password-file`` sets), else None. Neither is on a command line, where every
    user of the machine could read it (``/proc/PID/cmdline``); a child process (a daemon the
    command line starts) inherits them. ConfigError when the file cannot be read or is
    empty."""
    value = os.environ.get(PASSWORD_ENV)
    if value:
        return value
    path = os.environ.get(PASSWORD_FILE_ENV)
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_PASSWORD_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read the Redis password file {path}: {exc.strerror}") from None
    lines = raw.decode("utf-8", "replace").splitlines()
    if len(raw) > MAX_PASSWORD_BYTES or not lines or not lines[0]:
        raise ConfigError(
            f"the Redis password file {path} must hold the password on its first line"
        )
    return lines[0]


def _url_has_password(url: str) -> bool:
    userinfo, at, _ = url.partition("://")[2].split("/", 1)[0].rpartition("@")
    return bool(at) and ":" in userinfo


def redact_url(url: str) -> str:
    """``url`` with the password (everything of the user info but the user name) replaced by
    ``***``, for messages and logs. Works on malformed URLs too (no scheme, bad port)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    userinfo, at, hostpart = rest.rpartition("@")
    if not at:
        return url
    user, colon, _ = userinfo.partition(":")
    shown = f"{user}:***" if colon else "***"
    return f"{scheme}{sep}{shown}@{hostpart}"


def check_redis_url(url: object) -> str:
    """Return ``url`` if redis-py can use it (``redis://``, ``rediss://``, ``unix://`` or
    ``redis+sentinel://``, a valid port, a numeric database); raise ConfigError with a
    one-line reason (the password redacted) otherwise. Nothing is contacted."""
    from redis.connection import parse_url

    if not isinstance(url, str) or not url.strip():
        raise ConfigError("the Redis URL is empty: give --redis-url or DEVICEQ_REDIS_URL")
    shown = redact_url(url)
    if is_sentinel_url(url):
        parse_sentinel_url(url, shown)
        return url
    if not url.lower().startswith(URL_SCHEMES):
        hostport = url.rpartition("@")[2].partition("/")[0] or "localhost:6379"
        raise ConfigError(
            f"invalid Redis URL {shown!r}: it must start with redis://, rediss://, unix:// "
            f"or redis+sentinel:// "
            f"(e.g. {'redis://' + hostport + '/0'!r})"
        )
    try:
        parse_url(url)
    except ValueError as exc:
        raise ConfigError(f"invalid Redis URL {shown!r}: {exc}") from None
    if not url.lower().startswith("unix://"):
        path = url.partition("://")[2].partition("?")[0].partition("#")[0]
        db = unquote(path.partition("/")[2]) if "/" in path else ""
        if db not in ("", "/") and not db.strip("/").isdigit():
            raise ConfigError(
                f"invalid Redis URL {shown!r}: the database after the host must be a number "
                f"(e.g. /0), not {db!r}"
            )
    return url


class TLSError(ConfigError, redis.ConnectionError):
    """A TLS connection to Redis failed for a reason of its configuration: the server's
    certificate was not accepted (wrong CA bundle, a host name the certificate does not name),
    or the server refused the client (no client certificate, or one it does not trust). The
    message says what to check and never holds key material or a password.

    A ``ConfigError`` for callers, and still a ``redis.ConnectionError``: a daemon that meets
    it while running keeps retrying, as it does while Redis is unreachable, so that a fixed
    certificate revives it (``deviceq`` commands check once at start and fail in one line)."""


def _scheme_is_tls(url: str) -> bool:
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
    if not _scheme_is_tls(url):
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
    if not _scheme_is_tls(url):
        if chosen:
            raise ConfigError(
                f"{', '.join(sorted(chosen))} need a TLS URL (rediss://HOST:PORT/DB), not "
                f"{redact_url(url)!r}"
            )
        return url, {}
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


class _Retry(Retry):
    """redis-py's ``Retry`` that does not retry a :class:`TLSError` within one call: a
    certificate that was not accepted will not be on the next try (a daemon's own loop still
    tries again later)."""

    def call_with_retry(
        self, do: Any, fail: Any, is_retryable: Any = None, with_failure_count: bool = False
    ) -> Any:
        def retryable(exc: Exception) -> bool:
            return not isinstance(exc, TLSError) and (
                is_retryable is None or bool(is_retryable(exc))
            )

        return super().call_with_retry(do, fail, retryable, with_failure_count)


# redis-py before 6 has no ``is_retryable``: there a TLS failure is retried like the others
_RETRY = _Retry if "is_retryable" in inspect.signature(Retry.call_with_retry).parameters else Retry


def connect(
    url: str,
    *,
    socket_timeout: float = 30.0,
    connect_timeout: float = 5.0,
    retries: int = 3,
    backoff_cap: float = 1.0,
    health_check_interval: int = 30,
    ssl_ca_certs: str | os.PathLike[str] | None = None,
    ssl_certfile: str | os.PathLike[str] | None = None,
    ssl_keyfile: str | os.PathLike[str] | None = None,
    ssl_cert_reqs: str | ssl.VerifyMode | None = None,
) -> redis.Redis:
    """THE way deviceq opens a Redis client: decoded responses, keepalive, health checks and a
    short retry on a dropped connection. ``socket_timeout`` must exceed the longest blocking
    read made on the client (XREAD/BLPOP wait a few seconds; redis-py's default is 5 s): the
    host daemon uses short ones per purpose. A malformed ``url`` raises ConfigError (see
    :func:`check_redis_url`).

    Redis Cluster: ``url`` may name any node; the client follows ``MOVED`` redirects to the
    node serving the pool (every key of a pool is in one slot), see
    `deviceq.core.redirects`. Redis Sentinel: a
    ``redis+sentinel://HOST:PORT[,HOST:PORT]/SERVICE`` URL follows the service's primary
    across failovers, see `deviceq.core.sentinel`.

    TLS: a ``rediss://`` URL. The server's certificate is verified against ``ssl_ca_certs`` (a
    PEM CA bundle; default: the system's CAs) and must name the URL's host; ``ssl_certfile``
    and ``ssl_keyfile`` (PEM, the key unencrypted) are the client certificate for servers that
    require one (``tls-auth-clients yes``); ``ssl_cert_reqs`` is ``required`` (the default),
    ``optional`` or ``none`` (no verification: tests only), or an ``ssl.VerifyMode``. Each
    may be a keyword argument (paths: ``str`` or ``os.PathLike``), a query option of the URL
    (``rediss://h:6380/0?ssl_ca_certs=/etc/deviceq/ca.pem``) or, for the three files, the
    environment (``DEVICEQ_REDIS_CA``, ``DEVICEQ_REDIS_CERT``, ``DEVICEQ_REDIS_KEY``) when
    neither says: see :func:`tls_options`. The password, when the URL gives none, may come
    from the environment (:func:`redis_password`). A missing or unreadable file, or one that is not
    what it should be, raises ConfigError here; a failed handshake (a certificate not
    accepted either way) raises :class:`TLSError` on first use."""
    given = {
        "ssl_ca_certs": ssl_ca_certs,
        "ssl_certfile": ssl_certfile,
        "ssl_keyfile": ssl_keyfile,
        "ssl_cert_reqs": ssl_cert_reqs,
    }
    options: dict[str, Any] = {
        "decode_responses": True,
        "health_check_interval": health_check_interval,
        "socket_keepalive": True,
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "retry": _RETRY(ExponentialBackoff(cap=backoff_cap, base=0.05), retries),
        "retry_on_error": [redis.ConnectionError, redis.TimeoutError],
    }
    if is_sentinel_url(check_redis_url(url)):
        if any(v is not None for v in given.values()) or "?" in url:
            raise ConfigError("TLS options are not supported with redis+sentinel:// URLs yet")
        return connect_sentinel(parse_sentinel_url(url, redact_url(url)), **options)
    bare, tls = tls_options(url, given)
    extra: dict[str, Any] = {}
    if _scheme_is_tls(bare):
        extra = {"connection_class": TLSConnection, **tls}
    password = None if _url_has_password(bare) else redis_password()
    if password is not None:
        extra["password"] = password
    return FollowingRedis.from_url(bare, **options, **extra)


class PoolConnection:
    """A validated pool name, its key layout and its scripts on one Redis client."""

    def __init__(self, redis_or_url: redis.Redis | str | None = None, pool: str | None = None):
        settings = Settings() if redis_or_url is None or pool is None else None
        if redis_or_url is None:
            redis_or_url = settings.redis_url  # type: ignore[union-attr]
        self.pool = validate_id(pool if pool is not None else settings.pool, "pool name")  # type: ignore[union-attr]
        self.redis: redis.Redis = (
            connect(redis_or_url) if isinstance(redis_or_url, str) else redis_or_url
        )
        self.keys = Keys(self.pool)
        self.scripts = Scripts(self.redis)

    def _run(self, name: str, args: list[Any]) -> Any:
        return self.scripts.run(name, self.keys.prefix, args)

    def server_time_ms(self) -> int:
        sec, usec = self.redis.time()
        return int(sec) * 1000 + int(usec) // 1000

    def get_workflow(self, name: str) -> WorkflowDefinition:
        """A stored `WorkflowDefinition` (producers store them; hosts load them to run a
        workflow task). Raises NotFound."""
        validate_id(name, "workflow name")
        raw = self.redis.get(self.keys.workflow(name))
        if raw is None:
            raise NotFound(f"no workflow {name} in pool {self.pool}")
        return WorkflowDefinition.model_validate_json(raw)

    def pin(self) -> None:
        """Send one keyed read, so that a client made from a Redis Cluster node's URL points
        at the node serving this pool (see `deviceq.core.redirects`) before keyless reads
        such as ``SCAN``. Nothing changes on a standalone server."""
        self.redis.exists(self.keys.config)

    def config(self) -> PoolConfig:
        """The pool's settings: stored values over the defaults."""
        stored = self.redis.hgetall(self.keys.config)
        return PoolConfig.model_validate(
            {k: v for k, v in stored.items() if k in PoolConfig.model_fields}
        )

    def close(self) -> None:
        self.redis.close()

    def __enter__(self) -> PoolConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
