"""The root group's options (``--redis-url``, ``--pool``...) and the same options after any
subcommand (``deviceq host add lab-1 --pool lab``): `DqCommand` and `DqGroup` accept them,
show them in their help and apply them to the `Ctx` before the command runs."""

from __future__ import annotations

from typing import Any

import click

from ..core.errors import DeviceqError
from .context import Ctx
from .errors import fail
from .files import use_password_file

ROOT_OPTIONS: tuple[click.Option, ...] = (
    click.Option(
        ["--redis-url"],
        envvar="DEVICEQ_REDIS_URL",
        default="redis://localhost:6379/0",
        show_default=True,
        help="Redis to use (env DEVICEQ_REDIS_URL).",
    ),
    click.Option(
        ["--pool"],
        envvar="DEVICEQ_POOL",
        multiple=True,
        default=("default",),
        show_default=True,
        help="Pool (namespace) to act on (env DEVICEQ_POOL). `scheduler run` and `host run` take "
        "it more than once (--pool a --pool b; DEVICEQ_POOL='a b') to serve several pools.",
    ),
    click.Option(
        ["--log-format"],
        type=click.Choice(["text", "json"]),
        default="text",
        envvar="DEVICEQ_LOG_FORMAT",
        help="Format of daemon log lines.",
    ),
    click.Option(
        ["--redis-password-file"],
        metavar="FILE",
        help="Read the Redis password from FILE's first line (for a URL without one), so it is "
        "not on the command line, where any user of the machine can read it (ps, "
        "/proc/PID/cmdline). Daemons this command starts use it too. Or set "
        "DEVICEQ_REDIS_PASSWORD in the environment.",
    ),
    click.Option(
        ["--redis-ca"],
        metavar="FILE",
        help="TLS (rediss://): PEM CA bundle that verifies the Redis server's certificate "
        "(default: the system's CAs; env DEVICEQ_REDIS_CA).",
    ),
    click.Option(
        ["--redis-cert"],
        metavar="FILE",
        help="TLS: PEM client certificate, for a Redis that requires one (env DEVICEQ_REDIS_CERT).",
    ),
    click.Option(
        ["--redis-key"],
        metavar="FILE",
        help="TLS: the client certificate's unencrypted PEM key (env DEVICEQ_REDIS_KEY).",
    ),
    click.Option(
        ["--log-level"],
        type=click.Choice(["debug", "info", "warning", "error"]),
        default="info",
        envvar="DEVICEQ_LOG_LEVEL",
        show_default=True,
        help="Daemon log level. At info a host logs a summary line now and then; each task's "
        "lines (claimed, runner started/finished, reported) are debug.",
    ),
)
"""The root group's options (``deviceq --redis-url URL ...``), with their defaults and
environment variables."""


GLOBAL_OPTIONS: tuple[tuple[str, str, str], ...] = (
    ("--redis-url", "redis_url", "Redis to use (env DEVICEQ_REDIS_URL)."),
    (
        "--redis-password-file",
        "redis_password_file",
        "The Redis password from FILE's first line, not argv (env DEVICEQ_REDIS_PASSWORD).",
    ),
    ("--pool", "pool", "Pool (namespace) to act on (env DEVICEQ_POOL)."),
    ("--log-format", "log_format", "Format of daemon log lines."),
    ("--log-level", "log_level", "Daemon log level."),
    ("--redis-ca", "redis_ca", "TLS: PEM CA bundle that verifies the Redis server."),
    ("--redis-cert", "redis_cert", "TLS: PEM client certificate."),
    ("--redis-key", "redis_key", "TLS: the client certificate's unencrypted PEM key."),
)
"""The root group's options that every subcommand accepts too (``deviceq host add lab-1
--pool lab``): a value given after the subcommand overrides one given before it."""

_GLOBAL_PREFIX = "_global_"


def _global_params(taken: set[str]) -> list[click.Parameter]:
    """Copies of the root's global options for a subcommand: no default and no environment
    variable (only a value typed after the subcommand counts), under a private name; an
    option name the command already uses for itself (``acl --pool``, ``demo --redis-url``)
    is left out."""
    out: list[click.Parameter] = []
    for opt, name, help_text in GLOBAL_OPTIONS:
        if opt in taken:
            continue
        root = next(p for p in ROOT_OPTIONS if p.name == name)
        out.append(
            click.Option(
                [opt, _GLOBAL_PREFIX + name],
                type=root.type,
                multiple=root.multiple,
                metavar=root.metavar,
                default=None,
                help=help_text,
            )
        )
    return out


def _apply_globals(ctx: click.Context) -> None:
    """Move the global options given after a (sub)command from its params into ``Ctx``."""
    from ..core.validation import validate_id

    given = {
        k[len(_GLOBAL_PREFIX) :]: ctx.params.pop(k)
        for k in list(ctx.params)
        if k.startswith(_GLOBAL_PREFIX)
    }
    values = {k: v for k, v in given.items() if v not in (None, ())}
    if not values:
        return
    obj = ctx.find_object(Ctx)
    if obj is None:  # the root callback did not run (``--help``): nothing to override
        return
    if "pool" in values:
        try:
            for p in values["pool"]:
                validate_id(p, "pool name")
        except DeviceqError as exc:
            fail(str(exc))
        obj.pools = tuple(dict.fromkeys(values.pop("pool")))
    if "redis_url" in values:
        obj.raw_redis_url = values.pop("redis_url")
    if "redis_password_file" in values:
        use_password_file(values.pop("redis_password_file"))
    for k, v in values.items():
        setattr(obj, k, v)
    obj._client = None  # made on first use, from the final settings
    obj._admin = None


class _GlobalsMixin:
    """Adds the root's global options to a subcommand (or sub-group), shows them in its
    ``--help`` under "Global options", and applies them before it runs."""

    params: list[click.Parameter]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        taken = {o for p in self.params for o in getattr(p, "opts", ())}
        self.params.extend(_global_params(taken))

    def invoke(self, ctx: click.Context) -> Any:
        _apply_globals(ctx)
        return super().invoke(ctx)  # type: ignore[misc]

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        own: list[tuple[str, str]] = []
        glob: list[tuple[str, str]] = []
        for p in self.get_params(ctx):  # type: ignore[attr-defined]
            rec = p.get_help_record(ctx)
            if rec is not None:
                (glob if (p.name or "").startswith(_GLOBAL_PREFIX) else own).append(rec)
        if own:
            with formatter.section("Options"):
                formatter.write_dl(own)
        if glob:
            with formatter.section("Global options (before or after the command; after wins)"):
                formatter.write_dl(glob)
        if isinstance(self, click.Group):
            self.format_commands(ctx, formatter)


class DqCommand(_GlobalsMixin, click.Command):
    """A deviceq leaf command: accepts the global options after its name too."""


class DqGroup(_GlobalsMixin, click.Group):
    """A deviceq sub-group (``task``, ``host``...): its commands are `DqCommand`s, and it
    accepts the global options too (``deviceq task --pool lab list``)."""

    command_class = DqCommand


DqGroup.group_class = DqGroup
