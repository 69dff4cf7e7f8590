"""The ``deviceq`` command group and its sub-groups (``task``, ``host``, ``device``,
``config``, ``workflow``, ``scheduler``): a deviceq or Redis error any command raises ends as
one line on stderr.

Command modules (``task_cmds``, ...) import the groups from here and add their commands;
``deviceq.cli`` imports them all. The helpers they share live in the module of their concern
(`context`, `files`, `errors`, `render`, `global_options`, `deviceq.core.input_files`)."""

from __future__ import annotations

from typing import Any

import click
import redis

from ..core.errors import DeviceqError
from .context import Ctx
from .errors import describe_error, fail, one_line_usage
from .files import (
    use_password_file,
)
from .global_options import ROOT_OPTIONS, DqCommand, DqGroup


class _Group(click.Group):
    """The root group: whatever command runs, a deviceq or Redis error it raises ends as one
    line on stderr (`describe_error`, the one mapping) and exit 1; a usage error as one line
    too (`OneLineUsageError`) and exit 2. Its commands and groups accept its global options
    too (`DqCommand`, `DqGroup`)."""

    command_class = DqCommand
    group_class = DqGroup

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as exc:
            raise one_line_usage(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise one_line_usage(exc) from None
        except (DeviceqError, redis.RedisError) as exc:
            obj = ctx.find_object(Ctx)
            fail(describe_error(exc, obj.raw_redis_url if obj else None) or str(exc))


@click.group(
    cls=_Group,
    params=list(ROOT_OPTIONS),
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(package_name="deviceq")
@click.pass_context
def main(
    ctx: click.Context,
    redis_url: str,
    pool: tuple[str, ...],
    log_format: str,
    log_level: str,
    redis_ca: str | None,
    redis_cert: str | None,
    redis_key: str | None,
    redis_password_file: str | None,
) -> None:
    """deviceq: schedule tasks onto a fleet of devices owned by hosts, through Redis.

    \b
    Example:
      deviceq host add lab-1            # prints the host's token once
      deviceq submit "open settings" --driver-type android --tag wifi
      deviceq task wait 3f2a9c0d1e2b4a5f --timeout 60
      deviceq --redis-url rediss://redis.lab:6380/0 --redis-ca ca.pem status   # TLS
    """
    from ..core.validation import validate_id

    try:
        for p in pool:
            validate_id(p, "pool name")
    except DeviceqError as exc:
        fail(str(exc))
    if redis_password_file:
        use_password_file(redis_password_file)
    ctx.obj = Ctx(
        raw_redis_url=redis_url,
        pools=tuple(dict.fromkeys(pool)),  # in order, each once
        log_format=log_format,
        log_level=log_level,
        redis_ca=redis_ca,
        redis_cert=redis_cert,
        redis_key=redis_key,
    )


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
