"""The ``deviceq`` command group, its sub-groups and the helpers every command module uses.

Command modules (``task_cmds``, ...) import the groups from here and add their commands;
``deviceq.cli`` imports them all."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
import redis

from ..core.errors import DeviceqError, InvalidInput

if TYPE_CHECKING:
    from rich.console import Console

    from ..ops.admin import PoolAdmin
    from ..producer import Client

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Ctx:
    """What every command gets: where Redis is and which pool; clients made on first use.

    ``redis_url`` is checked when a command first uses it (a malformed URL raises ConfigError,
    which every command reports as one line), so commands that never touch Redis (``--help``,
    ``scheduler strategies``) work whatever ``DEVICEQ_REDIS_URL`` holds.

    ``redis_ca``, ``redis_cert``, ``redis_key``: the TLS files given on the command line
    (``--redis-ca`` ...); ``redis_url`` carries them in its query, so that every client made
    from it (``HostWorker``'s too) uses them. The same files from the environment
    (``DEVICEQ_REDIS_CA`` ...) are not copied here: ``connect`` reads them itself."""

    raw_redis_url: str
    pools: tuple[str, ...]
    log_format: str = "text"
    log_level: str = "info"
    redis_ca: str | None = None
    redis_cert: str | None = None
    redis_key: str | None = None
    _client: Client | None = field(default=None, repr=False)
    _admin: PoolAdmin | None = field(default=None, repr=False)

    @property
    def pool(self) -> str:
        """The one pool this command acts on (``--pool`` given more than once: a usage error,
        but for the commands that serve several pools)."""
        if len(self.pools) != 1:
            raise click.UsageError(
                f"--pool was given {len(self.pools)} times: only `deviceq scheduler run` "
                "and `deviceq host run` serve several pools; other commands act on one"
            )
        return self.pools[0]

    def for_pool(self, pool: str) -> Ctx:
        """The same settings for one of ``pools`` (its own clients)."""
        return replace(self, pools=(pool,), _client=None, _admin=None)

    @property
    def redis_url(self) -> str:
        """The ``--redis-url``/``DEVICEQ_REDIS_URL`` value, validated (ConfigError if bad), with
        the TLS files of ``--redis-ca/--redis-cert/--redis-key`` in its query (ConfigError if
        one is given for a URL that is not ``rediss://``)."""
        from ..core.connection import check_redis_url, with_tls_files

        return with_tls_files(
            check_redis_url(self.raw_redis_url),
            ca=self.redis_ca,
            cert=self.redis_cert,
            key=self.redis_key,
            given_as="--redis-ca/--redis-cert/--redis-key",
        )

    @property
    def client(self) -> Client:
        from ..core.durability import warn_if_unsafe
        from ..producer import Client

        if self._client is None:
            self._client = Client(self.redis_url, self.pool)
            with contextlib.suppress(redis.RedisError):  # unreachable: the command says so
                msg = warn_if_unsafe(self._client.redis, "deviceq command line", log=None)
                if msg:
                    click.echo(msg, err=True)
        return self._client

    def preflight(self, *, need_reachable: bool) -> None:
        """For daemons, before their retry loops start: one PING, so that a wrong or missing
        password (never transient) fails at once instead of being retried forever. An
        unreachable Redis fails too when ``need_reachable`` (one-shot runs); otherwise the
        daemon starts and waits for it. An ACL that does not allow PING is ignored. A failed
        TLS handshake (a certificate not accepted either way) is never transient either."""
        from ..core.connection import TLSError

        try:
            self.client.redis.ping()
        except (redis.AuthenticationError, TLSError):
            raise
        except (redis.ConnectionError, redis.TimeoutError):
            if need_reachable:
                raise
        except redis.ResponseError:
            pass

    @property
    def admin(self) -> PoolAdmin:
        from ..ops.admin import PoolAdmin

        if self._admin is None:
            self._admin = PoolAdmin(self.client.redis, self.pool)
        return self._admin

    def warn_if_unknown_pool(self) -> bool:
        """For commands that only make sense on an existing pool: print a warning on stderr
        when the pool has no hosts, devices, tasks, settings or workflows (most likely a typo
        in --pool). Bounded: one EXISTS over a few keys, never a SCAN. Returns True if it
        warned."""
        from ..core.models import TaskStatus

        k = self.client.keys
        # not the event stream: a scheduler's leader lease writes one even on a typo's pool
        keys = [k.hosts, k.devices, k.seq, k.config, k.workflows]
        keys += [k.status(s.value) for s in TaskStatus]
        try:
            if int(self.client.redis.exists(*keys)):
                return False
        except redis.ResponseError:  # an ACL user without EXISTS: no warning, no failure
            return False
        click.echo(
            f"warning: pool {self.pool!r} has no hosts, devices or tasks — is the name right? "
            "(`deviceq status --all-pools` lists the pools of this Redis)",
            err=True,
        )
        return True


MAX_INPUT_BYTES = 64 * 1024 * 1024
"""The largest file (or stdin) a command reads as its input (``submit --file``, ``workflow
put``): read bounded, so ``/dev/zero`` or a runaway pipe is an error, not a hang."""


def read_input(path: str, limit: int = MAX_INPUT_BYTES) -> str:
    """A file's text ('-' = stdin), at most ``limit`` bytes; InvalidInput when it cannot be
    read, is larger or is not UTF-8."""
    name = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            data = sys.stdin.buffer.read(limit + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(limit + 1)
    except OSError as exc:
        raise InvalidInput(f"cannot read {name}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise InvalidInput(f"{name} is larger than {limit // (1024 * 1024)} MiB: not read")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"cannot read {name}: not UTF-8 text ({exc.reason})") from None


@contextlib.contextmanager
def nesting_guard(source: str, error: type[DeviceqError] = InvalidInput) -> Iterator[None]:
    """Parse JSON/YAML inside this: input nested deeper than the parser's recursion allows
    (``[[[[...``) is one ``error`` naming ``source``, never a RecursionError traceback."""
    try:
        yield
    except RecursionError:
        raise error(f"{source}: nested too deeply to parse") from None


def check_output_path(path: str) -> None:
    """Before a command changes anything: InvalidInput unless `write_output_file` can create
    ``path`` (its folder exists, is a folder and is writable; ``path`` is not a folder), so a
    token is never minted (or rotated) only to be lost."""
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise InvalidInput(f"cannot write {path}: it is a directory")
    if not folder.exists():
        raise InvalidInput(f"cannot write {path}: no such directory {folder}")
    if not folder.is_dir():
        raise InvalidInput(f"cannot write {path}: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InvalidInput(f"cannot write {path}: directory {folder} is not writable")


def use_password_file(path: str) -> None:
    """``--redis-password-file``: every client this process makes, and every daemon it
    starts, reads the Redis password from ``path`` (`deviceq.core.connection.redis_password`,
    through ``DEVICEQ_REDIS_PASSWORD_FILE``); the password itself is never on a command line.
    It replaces a ``DEVICEQ_REDIS_PASSWORD`` of the environment."""
    from ..core.connection import PASSWORD_ENV, PASSWORD_FILE_ENV

    os.environ.pop(PASSWORD_ENV, None)
    os.environ[PASSWORD_FILE_ENV] = os.path.abspath(path)


def write_output_file(path: str, text: str) -> None:
    """Write ``text`` to ``path`` only now that the command succeeded, atomically (a temporary
    file in the same directory, renamed over ``path``) and readable by its owner only (it may
    hold a secret): an error never leaves an empty or partial file behind."""
    target = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or Path("."))
    except OSError as exc:
        raise InvalidInput(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:  # mkstemp: mode 0600
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise InvalidInput(f"cannot write {path}: {exc.strerror or exc}") from None


def output_option(what: str) -> Callable[[F], F]:
    """``-o/--output FILE``: write ``what`` to FILE (atomically, mode 0600) instead of stdout."""
    return click.option(
        "-o",
        "--output",
        "output",
        type=click.Path(dir_okay=False, writable=False),
        help=f"Write {what} to FILE (created only on success, atomically, mode 0600) instead "
        "of stdout: unlike a shell redirect (> FILE), an error leaves no empty file behind.",
    )


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
    from ..core.connection import PASSWORD_ENV, PASSWORD_FILE_ENV, redact_url

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


PIPE_WIDTH = 10_000  # columns when not a terminal: tables are never cut or wrapped


def console_for_tables() -> Console:
    """The console for a command's tables: the terminal's width on a terminal; when piped or
    redirected, plain text wide enough that no column is cut (``task list | grep ...``)."""
    from rich.console import Console

    c = Console()
    if c.is_terminal:
        return c
    return Console(width=PIPE_WIDTH, no_color=True, highlight=False)


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True, default=str))


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
        root = next(p for p in main.params if p.name == name)
        assert isinstance(root, click.Option)
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
    from ..core.models import validate_id

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
    multiple=True,
    default=("default",),
    show_default=True,
    help="Pool (namespace) to act on (env DEVICEQ_POOL). `scheduler run` and `host run` take "
    "it more than once (--pool a --pool b; DEVICEQ_POOL='a b') to serve several pools.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    envvar="DEVICEQ_LOG_FORMAT",
    help="Format of daemon log lines.",
)
@click.option(
    "--redis-password-file",
    metavar="FILE",
    help="Read the Redis password from FILE's first line (for a URL without one), so it is "
    "not on the command line, where any user of the machine can read it (ps, "
    "/proc/PID/cmdline). Daemons this command starts use it too. Or set "
    "DEVICEQ_REDIS_PASSWORD in the environment.",
)
@click.option(
    "--redis-ca",
    metavar="FILE",
    help="TLS (rediss://): PEM CA bundle that verifies the Redis server's certificate "
    "(default: the system's CAs; env DEVICEQ_REDIS_CA).",
)
@click.option(
    "--redis-cert",
    metavar="FILE",
    help="TLS: PEM client certificate, for a Redis that requires one (env DEVICEQ_REDIS_CERT).",
)
@click.option(
    "--redis-key",
    metavar="FILE",
    help="TLS: the client certificate's unencrypted PEM key (env DEVICEQ_REDIS_KEY).",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    envvar="DEVICEQ_LOG_LEVEL",
    show_default=True,
    help="Daemon log level. At info a host logs a summary line now and then; each task's "
    "lines (claimed, runner started/finished, reported) are debug.",
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
    from ..core.models import validate_id

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


pass_ctx = click.make_pass_decorator(Ctx)
