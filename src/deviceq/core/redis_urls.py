"""Redis URLs: which are valid (`check_redis_url`), how they are shown (`redact_url`: never a
password), and the password a URL without one takes from the environment
(`redis_password`)."""

from __future__ import annotations

import os
from urllib.parse import unquote

from .errors import ConfigError
from .sentinel import is_sentinel_url, parse_sentinel_url

URL_SCHEMES = ("redis://", "rediss://", "unix://")


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


def url_has_password(url: str) -> bool:
    """Whether ``url``'s user info holds a password (``redis://:PW@...``, ``redis://u:PW@...``)."""
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
