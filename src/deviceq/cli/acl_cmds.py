"""``deviceq acl``: print the Redis ACL users of a pool's roles (never contacts Redis)."""

from __future__ import annotations

import click

from ..core.errors import InvalidInput
from .app import main
from .context import Ctx, pass_ctx
from .lazy import LazyChoice, resolve
from .render import echo_json


@main.command("acl")
@click.option("--pool", "acl_pool", help="Pool of the users (default: the global --pool).")
@click.option(
    "--role",
    "roles",
    type=LazyChoice(lambda: resolve("deviceq.ops.acl:ROLES")),
    multiple=True,
    help="Print only this role's user (repeatable; default: all four).",
)
@click.option(
    "--host-id",
    help="Bind the host user to this host id (user dq-POOL-host-HOST): it can then write "
    "only that host's keys.",
)
@click.option(
    "--password-file",
    type=click.Path(dir_okay=False),
    help="File holding the user's password (first line); the line carries its SHA-256 "
    "(#...), never the password. Needs exactly one --role: each role gets its own password.",
)
@click.option(
    "--redis-version",
    default="7.0",
    show_default=True,
    help="Version of the Redis server (MAJOR.MINOR): from 7.2 the users may also run "
    "CLIENT SETINFO, which redis-py sends on connect.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print each user as JSON: its line, keys and every command with why it is needed.",
)
@pass_ctx
def acl_cmd(
    ctx: Ctx,
    acl_pool: str | None,
    roles: tuple[str, ...],
    host_id: str | None,
    password_file: str | None,
    redis_version: str,
    as_json: bool,
) -> None:
    """Print the ACL SETUSER line of each role's Redis user on a pool: producer, scheduler,
    host, operator (all four unless --role). Each user gets only the pool's keys
    (dq:{POOL}:*; all but the operator write only what their scripts write) and only the
    commands its processes and their Lua scripts send: never FLUSHALL, FLUSHDB, KEYS,
    CONFIG, SCRIPT, FUNCTION, DEBUG, SHUTDOWN, MONITOR, SLOWLOG or ACL. Without
    --password-file the password is the placeholder <password>. Run the lines as an
    administrator (redis-cli reads them from stdin); then give each process its user in
    its URL: redis://USER:PASSWORD@HOST:6379/0.

    The producer and host users do not confine an untrusted producer or host (Redis runs a
    script with its caller's rights: a warning on stderr says what they do not prevent);
    those go through the HTTP API (deviceq api), where a host can act only as itself.

    \b
    Example:
      deviceq acl --pool lab
      deviceq acl --pool lab --role host --host-id lab-1 --password-file lab-1.pw \\
        | redis-cli --user admin --askpass
      deviceq acl --pool lab --role operator --json | jq '.[0].commands'
    """
    from ..ops.acl import (
        DIRECT_MODE_LIMITS,
        ROLES,
        acl_users,
        parse_version,
        password_rule,
        read_password_file,
    )

    pool = acl_pool if acl_pool is not None else ctx.pool
    selected = tuple(dict.fromkeys(roles)) or ROLES
    if host_id is not None and "host" not in selected:
        raise InvalidInput("--host-id binds the host user: give it with --role host")
    if password_file is not None and len(selected) != 1:
        raise InvalidInput(
            "--password-file needs exactly one --role: each role gets its own password"
        )
    password = read_password_file(password_file) if password_file is not None else None
    rule = password_rule(password)
    users = acl_users(pool, selected, host_id=host_id, redis_version=parse_version(redis_version))
    for role in selected:  # (stderr: stdout stays the lines redis-cli reads)
        if role in DIRECT_MODE_LIMITS:
            click.echo(f"warning: dq-{pool}-{role}: {DIRECT_MODE_LIMITS[role]}", err=True)
    if as_json:
        echo_json([u.as_dict(rule) for u in users])
        return
    for u in users:
        click.echo(u.line(rule))
    if "host" in selected and host_id is None:
        click.echo(
            f"note: dq-{pool}-host may write every host's keys (so it could rotate another "
            "host's token by running host_add.lua itself); --host-id HOST prints a user bound "
            "to one host",
            err=True,
        )
