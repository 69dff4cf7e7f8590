"""``deviceq dashboard user add|list|remove``: the named users of a pool's dashboard, each a
viewer (reads) or an operator (acts too), with a password stored as an argon2 hash
(`deviceq.dashboard.users`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..core.errors import InvalidInput
from .context import Ctx, pass_ctx
from .dashboard_cmds import dashboard
from .render import echo_json


def _store(ctx: Ctx) -> Any:
    from ..dashboard.users import UserStore

    return UserStore(ctx.client.redis, ctx.client.keys)


def _read_password(password_file: str | None) -> str:
    """The password from its file (one trailing newline stripped) or typed twice at a
    hidden prompt. InvalidInput when it is empty or unreadable."""
    if password_file is not None:
        try:
            text = Path(password_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"cannot read the password file {password_file}: {exc}") from None
        password = text[:-1] if text.endswith("\n") else text
        password = password[:-1] if password.endswith("\r") else password
        if not password:
            raise InvalidInput(f"the password file {password_file} is empty")
        return password
    from ..dashboard.users import check_password

    password = str(click.prompt("Password", hide_input=True, default="", show_default=False))
    check_password(password)  # (empty or short: refused before it is asked again)
    again = str(click.prompt("Repeat the password", hide_input=True, default="",
                             show_default=False))  # fmt: skip
    if again != password:
        raise InvalidInput("the two passwords differ")
    return password


@dashboard.group("user")
def user_group() -> None:
    """Named dashboard users: viewers see every page, operators may also act. While the
    pool has any, the dashboard logs in by name and password (not by the operator token)."""


@user_group.command("add")
@click.argument("name")
@click.option(
    "--role",
    type=click.Choice(["viewer", "operator"]),
    required=True,
    help="viewer: every page, no action; operator: also cancel, retry, drain, quarantine.",
)
@click.option(
    "--password-file",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Read the password from FILE (its trailing newline stripped) instead of prompting "
    "for it twice.",
)
@click.option("--json", "as_json", is_flag=True, help="Print {name, role} as JSON.")
@pass_ctx
def user_add(ctx: Ctx, name: str, role: str, password_file: str | None, as_json: bool) -> None:
    """Add dashboard user NAME with a role and a password (a NAME already taken is refused).

    \b
    Example:
      deviceq dashboard user add alice --role operator          # prompts twice
      deviceq dashboard user add wall --role viewer --password-file wall.pw
    """
    from ..core.validation import validate_id
    from ..dashboard.users import check_password

    validate_id(name, "user name")
    password = check_password(_read_password(password_file))
    user = _store(ctx).add(name, role, password)
    if as_json:
        echo_json(user.as_dict())
    else:
        click.echo(f"dashboard user {user.name} added ({user.role})")


@user_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON (never a password hash).")
@pass_ctx
def user_list(ctx: Ctx, as_json: bool) -> None:
    """List the dashboard users: name and role (never a password or its hash).

    \b
    Example:
      deviceq dashboard user list --json
    """
    users = _store(ctx).list()
    if as_json:
        echo_json([u.as_dict() for u in users])
        return
    if not users:
        click.echo("no dashboard users (add one with: deviceq dashboard user add NAME --role "
                   "viewer)")  # fmt: skip
    for u in users:
        click.echo(f"{u.name}  {u.role}")


@user_group.command("remove")
@click.argument("name")
@pass_ctx
def user_remove(ctx: Ctx, name: str) -> None:
    """Remove dashboard user NAME (its sessions can act no more).

    \b
    Example:
      deviceq dashboard user remove alice
    """
    _store(ctx).remove(name)
    click.echo(f"dashboard user {name} removed")
