"""``deviceq api``: serve the HTTP API of a pool and manage its tokens (``deviceq api token``).
The producer commands' ``--api-url`` forms are in `via_api`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import click

from .app import main
from .context import Ctx, pass_ctx
from .errors import fail
from .lazy import DurationRange
from .proxies import proxy_settings, trusted_proxy_option
from .render import echo_json, fmt_ms
from .tracing_option import otel_option

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8300


@main.group("api", invoke_without_command=True)
@click.option(
    "--host",
    "bind_host",
    default=DEFAULT_HOST,
    show_default=True,
    help="Address to listen on. The default serves this machine only; 0.0.0.0 serves every "
    "interface (then use --tls-cert/--tls-key: tokens travel in every request).",
)
@click.option(
    "--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
    help="TCP port to listen on.",
)  # fmt: skip
@click.option(
    "--tls-cert",
    type=click.Path(exists=True, dir_okay=False, readable=True),
    metavar="FILE",
    help="Serve HTTPS with this PEM certificate (chain); needs --tls-key.",
)
@click.option(
    "--tls-key",
    type=click.Path(exists=True, dir_okay=False, readable=True),
    metavar="FILE",
    help="The unencrypted PEM key of --tls-cert.",
)
@click.option(
    "--max-body",
    type=click.IntRange(1024, 64 * 1024 * 1024),
    default=None,
    metavar="BYTES",
    help="Largest request body accepted (larger: 413). Default 1 MiB.",
)
@click.option(
    "--max-wait",
    type=DurationRange(min=0.1, max=600),
    default=None,
    metavar="SECONDS",
    help="Longest a long poll (task wait) holds a request. Default 30.",
)
@click.option(
    "--max-auth-failures",
    type=click.IntRange(1, 100_000),
    default=10,
    show_default=True,
    help="Failed authentications allowed per client address per --auth-window; past it "
    "the address gets 429 (with Retry-After) until the window ends.",
)
@click.option(
    "--auth-window",
    type=DurationRange(min=1, max=86_400),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="The window of --max-auth-failures.",
)
@click.option(
    "--max-waits-per-host",
    type=click.IntRange(1, 10_000),
    default=8,
    show_default=True,
    help="Long polls (claim and control waits) one host holds at once; one more is "
    "answered 429 with Retry-After at once (a daemon holds 2).",
)
@click.option(
    "--max-waits-per-token",
    type=click.IntRange(1, 10_000),
    default=32,
    show_default=True,
    help="Task waits and event and log streams one API token holds at once; one more is "
    "answered 429 with Retry-After at once.",
)
@click.option(
    "--max-waits",
    type=click.IntRange(1, 10_000),
    default=512,
    show_default=True,
    help="Long polls and streams the service holds at once, all hosts and tokens together; "
    "they run on Redis connections of their own, so short calls never wait for them.",
)
@click.option(
    "--access-log/--no-access-log",
    default=True,
    show_default=True,
    help="Log one line per request (method, path, status; never a header or a body).",
)
@trusted_proxy_option
@otel_option("deviceq-api")
@click.pass_context
def api(
    cctx: click.Context,
    bind_host: str,
    port: int,
    tls_cert: str | None,
    tls_key: str | None,
    max_body: int | None,
    max_wait: float | None,
    max_auth_failures: int,
    auth_window: float,
    max_waits_per_host: int,
    max_waits_per_token: int,
    max_waits: int,
    access_log: bool,
    trusted_proxies: list[str],
) -> None:
    """Serve the pool's HTTP API (JSON under /api/v1; OpenAPI at /api/v1/openapi.json):
    producers submit and follow tasks with an API token (`deviceq api token add`), hosts
    without Redis credentials run with their own host token.

    \b
    Example:
      deviceq --pool lab api                             # http://127.0.0.1:8300/api/v1
      deviceq api --host 0.0.0.0 --tls-cert api.pem --tls-key api.key
      deviceq api token add ci --role producer           # prints the token once
    """
    if cctx.invoked_subcommand is not None:
        return
    if (tls_cert is None) != (tls_key is None):
        fail("--tls-cert and --tls-key go together: give both or neither", 2)
    ctx = cctx.find_object(Ctx)
    assert ctx is not None
    polls = LongPollBounds(max_waits_per_host, max_waits_per_token, max_waits)
    serve(ctx, bind_host, port, tls_cert, tls_key, max_body, max_wait,
          max_auth_failures, auth_window, access_log, polls, trusted_proxies)  # fmt: skip


@dataclass(frozen=True)
class LongPollBounds:
    """``deviceq api``'s bounds on blocking calls (see `deviceq.api.limits.LongPolls`)."""

    per_host: int = 8
    per_token: int = 32
    total: int = 512


def serve(
    ctx: Ctx,
    bind_host: str,
    port: int,
    tls_cert: str | None,
    tls_key: str | None,
    max_body: int | None,
    max_wait: float | None,
    max_auth_failures: int,
    auth_window: float,
    access_log: bool,
    polls: LongPollBounds = LongPollBounds(),
    trusted_proxies: list[str] | None = None,
) -> None:
    import uvicorn

    from ..api.app import create_app, worker_threads
    from ..api.auth import FailureLimiter
    from ..api.context import MAX_BODY, MAX_WAIT, ApiContext
    from ..api.limits import LongPolls
    from ..core.connection import connect

    ctx.preflight(need_reachable=True)
    api_ctx = ApiContext(
        # a connection for every worker thread (short calls never find the pool exhausted)
        connect(ctx.redis_url, max_connections=worker_threads(polls.total)),
        ctx.pool, max_body or MAX_BODY, max_wait or MAX_WAIT,
        # the blocking calls on connections of their own: one more than they may hold
        blocking_redis=connect(ctx.redis_url, max_connections=polls.total + 1),
        long_polls=LongPolls(polls.per_host, polls.per_token, polls.total),
    )  # fmt: skip
    app = create_app(api_ctx, limiter=FailureLimiter(max_auth_failures, auth_window))
    scheme = "https" if tls_cert else "http"
    click.echo(f"deviceq api of pool {ctx.pool} on {scheme}://{bind_host}:{port}/api/v1")
    from ..core import heap

    heap.settle()
    try:
        uvicorn.run(
            app,
            host=bind_host,
            port=port,
            ssl_certfile=tls_cert,
            ssl_keyfile=tls_key,
            log_level="warning" if ctx.log_level == "warning" else ctx.log_level,
            access_log=access_log,
            timeout_graceful_shutdown=2,
            server_header=False,
            **proxy_settings(trusted_proxies or []),
        )
    except (OSError, ValueError) as exc:  # a bad certificate or key, a port in use
        fail(f"cannot serve on {bind_host}:{port}: {' '.join(str(exc).split())}")


@api.group("token")
def token_group() -> None:
    """Manage the API tokens producers and operators authenticate with (only a sha256
    digest of each is stored; a token is shown once)."""


def _store(ctx: Ctx) -> Any:
    from ..api.tokens import TokenStore

    return TokenStore(ctx.client.redis, ctx.client.keys)


@token_group.command("add")
@click.argument("name")
@click.option(
    "--role",
    type=click.Choice(["producer", "operator"]),
    required=True,
    help="producer: submit, inspect, cancel, retry and wait for tasks, follow events; "
    "operator: that too, and the operator routes.",
)
@click.option("--json", "as_json", is_flag=True, help="Print {name, role, token} as JSON.")
@pass_ctx
def token_add(ctx: Ctx, name: str, role: str, as_json: bool) -> None:
    """Make an API token NAME and print it once (a NAME already taken is refused).

    \b
    Example:
      deviceq api token add ci --role producer > ci.token
    """
    from ..core.validation import validate_id

    validate_id(name, "token name")
    token = _store(ctx).add(name, role)
    if as_json:
        click.echo(json.dumps({"name": name, "role": role, "token": token}, sort_keys=True))
    else:
        click.echo(token)


@token_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_ctx
def token_list(ctx: Ctx, as_json: bool) -> None:
    """List the API tokens: name, role and creation time (never a token or digest).

    \b
    Example:
      deviceq api token list --json | jq -r '.[].name'
    """
    tokens = _store(ctx).list()
    if as_json:
        echo_json([t.as_dict() for t in tokens])
        return
    for t in tokens:
        click.echo(f"{t.name}  {t.role}  {fmt_ms(t.created_at)}")


@token_group.command("remove")
@click.argument("name")
@pass_ctx
def token_remove(ctx: Ctx, name: str) -> None:
    """Revoke the API token NAME (requests with it fail from now on).

    \b
    Example:
      deviceq api token remove ci
    """
    _store(ctx).remove(name)
    click.echo(f"API token {name} removed")
