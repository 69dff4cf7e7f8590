"""`Ctx`: what every command gets (where Redis is, which pool, clients made on first use),
and `pass_ctx`, the decorator that hands it to a command."""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import click
import redis

if TYPE_CHECKING:
    from ..core.connection import PoolConnection
    from ..ops.admin import PoolAdmin
    from ..producer.client import Client


ACTOR_ENV = "DEVICEQ_ACTOR"


def login_name() -> str:
    """This process's login name ('' when there is none, as in some containers)."""
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - getpass raises OSError or KeyError without a login
        return ""


def actor() -> str:
    """Who the command line acts as, recorded as ``by`` by the actions (cancel, retry,
    quarantine, drain, set-priority, pause): ``DEVICEQ_ACTOR`` when set (an id, else
    InvalidInput), or the login name when it is a valid id; '' (not recorded) otherwise. It
    is what the user says, not a checked identity: anyone who may run these scripts may
    write any name."""
    from ..core.errors import InvalidInput
    from ..core.validation import ID_RE

    given = os.environ.get(ACTOR_ENV)
    if given is not None:
        if not ID_RE.fullmatch(given):
            raise InvalidInput(
                f"{ACTOR_ENV}={given[:40]!r} is not a valid name: use 1-128 characters from "
                "A-Z a-z 0-9 . _ - (not starting with punctuation)"
            )
        return given
    name = login_name()
    return name if ID_RE.fullmatch(name) else ""


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
    _reader: PoolConnection | None = field(default=None, repr=False)

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
        return replace(self, pools=(pool,), _client=None, _admin=None, _reader=None)

    @property
    def redis_url(self) -> str:
        """The ``--redis-url``/``DEVICEQ_REDIS_URL`` value, validated (ConfigError if bad), with
        the TLS files of ``--redis-ca/--redis-cert/--redis-key`` in its query (ConfigError if
        one is given for a URL that is not ``rediss://``)."""
        from ..core.redis_urls import check_redis_url
        from ..core.tls import with_tls_files

        return with_tls_files(
            check_redis_url(self.raw_redis_url),
            ca=self.redis_ca,
            cert=self.redis_cert,
            key=self.redis_key,
            given_as="--redis-ca/--redis-cert/--redis-key",
        )

    @property
    def client(self) -> Client:
        from ..producer.client import Client

        if self._client is None:
            self._client = Client(
                self._reader.redis if self._reader is not None else self.redis_url, self.pool
            )
            if self._reader is None:
                self._warn_if_unsafe(self._client)
        return self._client

    @property
    def reader(self) -> PoolConnection:
        """The pool's connection without the producer's `Client` (and the models it imports):
        for commands that only read keys (``task show``). The client's, once there is one."""
        from ..core.connection import PoolConnection

        if self._client is not None:
            return self._client
        if self._reader is None:
            self._reader = PoolConnection(self.redis_url, self.pool)
            self._warn_if_unsafe(self._reader)
        return self._reader

    @staticmethod
    def _warn_if_unsafe(conn: PoolConnection) -> None:
        from ..core.durability import warn_if_unsafe

        with contextlib.suppress(redis.RedisError):  # unreachable: the command says so
            msg = warn_if_unsafe(conn.redis, "deviceq command line", log=None)
            if msg:
                click.echo(msg, err=True)

    def preflight(self, *, need_reachable: bool) -> None:
        """For daemons, before their retry loops start: one PING, so that a wrong or missing
        password (never transient) fails at once instead of being retried forever. An
        unreachable Redis fails too when ``need_reachable`` (one-shot runs); otherwise the
        daemon starts and waits for it. An ACL that does not allow PING is ignored. A failed
        TLS handshake (a certificate not accepted either way) is never transient either."""
        from ..core.tls import TLSError

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
        from ..core.vocabulary import TaskStatus

        conn = self.reader
        k = conn.keys
        # not the event stream: a scheduler's leader lease writes one even on a typo's pool
        keys = [k.hosts, k.devices, k.seq, k.config, k.workflows]
        keys += [k.status(s.value) for s in TaskStatus]
        try:
            if int(conn.redis.exists(*keys)):
                return False
        except redis.ResponseError:  # an ACL user without EXISTS: no warning, no failure
            return False
        click.echo(
            f"warning: pool {self.pool!r} has no hosts, devices or tasks — is the name right? "
            "(`deviceq status --all-pools` lists the pools of this Redis)",
            err=True,
        )
        return True


pass_ctx = click.make_pass_decorator(Ctx)


@contextlib.contextmanager
def said_on_stderr() -> Iterator[None]:
    """Within: a `PriorityIgnored` warning a library call gives is printed as one
    ``warning: ...`` line on stderr (once per text; stdout keeps what a script reads)."""
    from ..core.connection import PriorityIgnored

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PriorityIgnored)
        try:
            yield
        finally:
            seen: set[str] = set()
            for w in caught:
                text = str(w.message)
                if issubclass(w.category, PriorityIgnored) and text not in seen:
                    seen.add(text)
                    click.echo(f"warning: {text}", err=True)
                elif not issubclass(w.category, PriorityIgnored):
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
