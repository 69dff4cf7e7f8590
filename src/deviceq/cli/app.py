"""The ``deviceq`` command group, its sub-groups and the helpers every command module uses.

Command modules (``core_cmds``, ...) import the groups from here and add their commands;
``deviceq.cli`` imports them all."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click
import redis

from ..client import Client
from ..errors import DeviceqError
from ..models import validate_id
from ..pool import PoolAdmin

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Ctx:
    """What every command gets: where Redis is and which pool; clients made on first use."""

    redis_url: str
    pool: str
    log_format: str = "text"
    _client: Client | None = field(default=None, repr=False)
    _admin: PoolAdmin | None = field(default=None, repr=False)

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = Client(self.redis_url, self.pool)
        return self._client

    @property
    def admin(self) -> PoolAdmin:
        if self._admin is None:
            self._admin = PoolAdmin(self.client.redis, self.pool)
        return self._admin


def fail(message: str, code: int = 1) -> None:
    """Print one line to stderr and exit non-zero."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def handle_errors(fn: F) -> F:
    """Turn deviceq and Redis errors into one line on stderr and a non-zero exit."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except DeviceqError as exc:
            fail(f"{type(exc).__name__}: {exc}")
        except redis.ConnectionError as exc:
            fail(f"cannot reach Redis: {exc}")
        except redis.RedisError as exc:
            fail(f"Redis error: {exc}")

    return wrapper  # type: ignore[return-value]


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except DeviceqError as exc:
            fail(f"{type(exc).__name__}: {exc}")
        except redis.ConnectionError as exc:
            fail(f"cannot reach Redis: {exc}")


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--redis-url",
    envvar="DEVICEQ_REDIS_URL",
    default="redis://localhost:6379/0",
    show_default=True,
    help="Redis to use (env DEVICEQ_REDIS_URL).",
)
@click.option(
    "--pool",
    envvar="DEVICEQ_POOL",
    default="default",
    show_default=True,
    help="Pool (namespace) to act on (env DEVICEQ_POOL).",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    envvar="DEVICEQ_LOG_FORMAT",
    help="Format of daemon log lines.",
)
@click.version_option(package_name="deviceq")
@click.pass_context
def main(ctx: click.Context, redis_url: str, pool: str, log_format: str) -> None:
    """deviceq: schedule tasks onto a fleet of devices owned by hosts, through Redis.

    \b
    Example:
      deviceq host add lab-1            # prints the host's token once
      deviceq submit "open settings" --driver-type android --tag wifi
      deviceq task wait 3f2a9c0d1e2b4a5f --timeout 60
    """
    try:
        validate_id(pool, "pool name")
    except DeviceqError as exc:
        fail(str(exc))
    ctx.obj = Ctx(redis_url=redis_url, pool=pool, log_format=log_format)


@main.group()
def task() -> None:
    """Inspect and control tasks (show, list, cancel, retry, wait)."""


@main.group()
def host() -> None:
    """Manage hosts: add (prints a token), list, drain, run the worker daemon."""


@main.group()
def device() -> None:
    """Inspect devices and take them in or out of service."""


@main.group()
def config() -> None:
    """Read and change pool settings (durations in seconds)."""


@main.group()
def workflow() -> None:
    """Store and inspect workflow definitions (YAML or JSON files)."""


@main.group()
def scheduler() -> None:
    """Run the scheduler daemon."""


pass_ctx = click.make_pass_decorator(Ctx)
