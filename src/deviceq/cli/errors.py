"""How a command fails: one line on stderr for a deviceq or Redis error (`describe_error`, the
one mapping; never a password) and for a usage error (`OneLineUsageError`), and `fail`."""

from __future__ import annotations

import os
import sys
from typing import Any

import click
import redis

from ..core.errors import DeviceqError


def fail(message: str, code: int = 1) -> None:
    """Print one line to stderr and exit non-zero."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _plain_to_tls_hint(exc: BaseException, redis_url: str | None) -> str:
    """A hint when a plain ``redis://`` server hung up at once: it may be a TLS port (TLS
    failures of ``rediss://`` URLs are ``TLSError``, a DeviceqError with its own message)."""
    if not redis_url or not redis_url.lower().startswith("redis://"):
        return ""
    text = str(exc).lower()
    if any(s in text for s in ("reset by peer", "closed by server", "eof occurred")):
        return " (if that port speaks TLS, use a rediss:// URL, with --redis-ca)"
    return ""


def describe_error(exc: BaseException, redis_url: str | None = None) -> str | None:
    """The one-line message for a deviceq or Redis error (None for any other exception).
    Never includes a password: Redis URLs are shown redacted."""
    from ..core.redis_urls import PASSWORD_ENV, PASSWORD_FILE_ENV, redact_url

    where = f" at {redact_url(redis_url)}" if redis_url else ""
    if isinstance(exc, DeviceqError):
        return _one_line(f"{type(exc).__name__}: {exc}")
    if isinstance(exc, redis.AuthenticationError):
        given = os.environ.get(PASSWORD_ENV) or os.environ.get(PASSWORD_FILE_ENV)
        if redis_url and "@" not in redis_url and not given:
            return _one_line(
                f"Redis{where} requires a password and none is given (--redis-password-file, "
                f"DEVICEQ_REDIS_PASSWORD, or redis://:PASSWORD@HOST:PORT/DB in --redis-url / "
                f"DEVICEQ_REDIS_URL): {exc}"
            )
        return _one_line(
            f"Redis{where} refused the credentials: check the user and password in "
            f"--redis-url / DEVICEQ_REDIS_URL ({exc})"
        )
    if isinstance(exc, redis.TimeoutError):
        return _one_line(f"Redis{where} did not answer in time: {exc}")
    if isinstance(exc, redis.ConnectionError):
        return _one_line(f"cannot reach Redis{where}: {exc}{_plain_to_tls_hint(exc, redis_url)}")
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return _one_line(f"Redis{where} refused a command (ACL): {exc}")
    if isinstance(exc, redis.exceptions.AskError):  # MOVED / ASK that did not settle
        return _one_line(
            f"the Redis Cluster{where} still sends this pool's slot {exc.slot_id} to "
            f"{exc.host}:{exc.port}, which does not answer: a failover or a resharding has "
            "not finished (or the cluster lost that shard); try again"
        )
    if isinstance(exc, redis.RedisError):
        return _one_line(f"Redis error: {exc}")
    return None


class OneLineUsageError(click.UsageError):
    """A usage error (unknown option, bad value, missing argument...) shown as one line on
    stderr, naming the help of the command it concerns, with exit code 2:
    ``deviceq: error: No such option '--bogus'. (see deviceq task show --help)``."""

    def __init__(self, exc: click.UsageError) -> None:
        super().__init__(exc.message, exc.ctx)
        self.cause = exc

    def format_message(self) -> str:
        return self.cause.format_message()

    def line(self) -> str:
        where = "deviceq"
        if self.ctx is not None:
            root = self.ctx.find_root().info_name or ""
            where = ("deviceq" + self.ctx.command_path[len(root) :]).strip()
        return f"deviceq: error: {_one_line(self.format_message())} (see {where} --help)"

    def show(self, file: Any = None) -> None:
        click.echo(self.line(), err=True)


def one_line_usage(exc: click.UsageError) -> click.UsageError:
    """``exc`` as a `OneLineUsageError` (a group called without its command, which shows its
    help, stays as it is)."""
    if isinstance(exc, OneLineUsageError | click.exceptions.NoArgsIsHelpError):
        return exc
    return OneLineUsageError(exc)
