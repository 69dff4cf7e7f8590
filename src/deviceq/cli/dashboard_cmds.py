"""``deviceq dashboard``: serve the web dashboard of a pool (see ``deviceq.dashboard``); its
users are managed by ``deviceq dashboard user`` (`dashboard_user_cmds`)."""

from __future__ import annotations

import click

from .app import main
from .context import Ctx, pass_ctx
from .errors import fail
from .proxies import proxy_settings, trusted_proxy_option

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8180


@main.group("dashboard", invoke_without_command=True)
@click.option(
    "--host",
    "bind_host",
    default=DEFAULT_HOST,
    show_default=True,
    help="Address to listen on. The default serves this machine only; 0.0.0.0 serves every "
    "interface (the pages name hosts, devices and task goals).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="TCP port to listen on.",
)
@click.option(
    "--operator-token-file",
    type=click.Path(exists=True, dir_okay=False, readable=True),
    metavar="FILE",
    help="File holding the operator token (at least 16 characters). With it, operators who "
    "log in with that token may cancel and retry tasks, drain hosts and quarantine devices; "
    "without it the dashboard is read-only.",
)
@click.option(
    "--access-log/--no-access-log",
    default=True,
    show_default=True,
    help="Log one line per HTTP request (method, path, status; never form contents).",
)
@trusted_proxy_option
@pass_ctx
def dashboard(
    ctx: Ctx,
    bind_host: str,
    port: int,
    operator_token_file: str | None,
    access_log: bool,
    trusted_proxies: list[str],
) -> None:
    """Serve the web dashboard of the pool: fleet, queue, tasks and the live event stream.

    Pages update live over Server-Sent Events; every asset ships inside the package (no
    internet needed). Read-only unless --operator-token-file is given or the pool has
    dashboard users (deviceq dashboard user add): then viewers log in to read and operators
    to act, by name and password, and the token no longer logs in.

    \b
    Example:
      deviceq --pool lab dashboard                     # http://127.0.0.1:8180
      deviceq dashboard --port 9000 --operator-token-file ~/.deviceq-operator
    """
    if click.get_current_context().invoked_subcommand is not None:
        return  # deviceq dashboard user ...: serve nothing
    import uvicorn

    from ..dashboard import create_app
    from ..dashboard.auth import read_token_file

    token = None
    if operator_token_file:
        try:
            token = read_token_file(operator_token_file)
        except (OSError, ValueError) as exc:
            fail(str(exc))
    ctx.preflight(need_reachable=True)
    app = create_app(ctx.client, token)
    from ..dashboard.users import UserStore

    if UserStore(ctx.client.redis, ctx.client.keys).configured():
        mode = "users log in by name and password: deviceq dashboard user list"
    elif token:
        mode = "operator actions need a login with the token"
    else:
        mode = "read-only: no --operator-token-file and no dashboard users"
    click.echo(f"deviceq dashboard of pool {ctx.pool} on http://{bind_host}:{port} ({mode})")
    uvicorn.run(
        app,
        host=bind_host,
        port=port,
        log_level="warning" if ctx.log_level == "warning" else ctx.log_level,
        access_log=access_log,
        timeout_graceful_shutdown=2,
        server_header=False,
        **proxy_settings(trusted_proxies),
    )
