"""``deviceq api``: serve the HTTP API of a pool, manage its tokens (``deviceq api token``);
and ``--api-url``: the producer commands (``submit``, ``task show|list|cancel|retry|wait``,
``events``) talking to such a service instead of Redis."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from ..api_client import ApiClient
from ..core.models import TaskStatus, validate_id
from .app import Ctx, F, echo_json, fail, main, pass_ctx

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
    type=click.FloatRange(0.1, 600),
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
    type=click.FloatRange(1, 86_400),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="The window of --max-auth-failures.",
)
@click.option(
    "--access-log/--no-access-log",
    default=True,
    show_default=True,
    help="Log one line per request (method, path, status; never a header or a body).",
)
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
    access_log: bool,
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
    serve(ctx, bind_host, port, tls_cert, tls_key, max_body, max_wait,
          max_auth_failures, auth_window, access_log)  # fmt: skip


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
) -> None:
    import uvicorn

    from ..api.app import create_app
    from ..api.auth import FailureLimiter
    from ..api.context import MAX_BODY, MAX_WAIT, ApiContext

    ctx.preflight(need_reachable=True)
    api_ctx = ApiContext(ctx.client.redis, ctx.pool, max_body or MAX_BODY, max_wait or MAX_WAIT)
    app = create_app(api_ctx, limiter=FailureLimiter(max_auth_failures, auth_window))
    scheme = "https" if tls_cert else "http"
    click.echo(f"deviceq api of pool {ctx.pool} on {scheme}://{bind_host}:{port}/api/v1")
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
    from .core_cmds import fmt_ms

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


# -- the producer commands over the API -----------------------------------------------------
API_OPTIONS = (
    click.option(
        "--api-url",
        envvar="DEVICEQ_API_URL",
        metavar="URL",
        help="Talk to this deviceq api service (http(s)://HOST:PORT) instead of Redis "
        "(env DEVICEQ_API_URL).",
    ),
    click.option(
        "--api-token-file",
        type=click.Path(exists=True, dir_okay=False, readable=True),
        metavar="FILE",
        help="With --api-url: file holding the API token (default: env DEVICEQ_API_TOKEN).",
    ),
    click.option(
        "--api-ca",
        type=click.Path(exists=True, dir_okay=False, readable=True),
        metavar="FILE",
        help="With --api-url: PEM CA bundle that verifies the service's certificate.",
    ),
)


def api_client_for(url: str, token_file: str | None, ca: str | None) -> ApiClient:
    """The `ApiClient` of the ``--api-*`` options (a token file's surrounding whitespace
    stripped; its text never shown)."""
    token = None
    if token_file is not None:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"cannot read --api-token-file {token_file}: {exc}", 2)
    return ApiClient(url, token, ca)


def via_api(impl: Callable[..., None]) -> Callable[[F], F]:
    """Give a producer command ``--api-url``/``--api-token-file``/``--api-ca``: with a URL,
    ``impl(client, **params)`` runs instead of the command, on an `ApiClient` (``impl``
    refuses the options the API form has not, with `refuse`)."""

    def deco(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, api_url: str | None, api_token_file: str | None,
                    api_ca: str | None, **params: Any) -> Any:  # fmt: skip
            if not api_url:
                if api_token_file or api_ca:
                    fail("--api-token-file and --api-ca go with --api-url", 2)
                return f(*args, **params)
            impl(api_client_for(api_url, api_token_file, api_ca), **params)
            return None

        for opt in reversed(API_OPTIONS):
            wrapper = opt(wrapper)
        return wrapper  # type: ignore[return-value]

    return deco


def refuse(**given: Any) -> None:
    """Exit 2 naming the first option given (truthy) that the API form does not take."""
    for name, value in given.items():
        if value:
            fail(f"--{name.replace('_', '-')} is not available with --api-url", 2)


FILTERS = {"statuses": "status", "driver_type": "driver_type", "tags": "tag",
           "host_id": "host", "tenant": "tenant", "older_than": "older_than"}  # fmt: skip
"""The filter options of ``task cancel|retry|wait`` (parameter -> option name)."""


def _no_filters(rest: dict[str, Any]) -> None:
    refuse(**{opt: rest.get(param) for param, opt in FILTERS.items()})


def _task_json(t: Any) -> Any:
    return t.model_dump(mode="json")


def submit_via_api(client: ApiClient, **p: Any) -> None:
    from .core_cmds import parse_role_options

    refuse(file=p["tasks_file"], not_before=p.get("not_before"), delay=p.get("delay"))

    tags = [t for value in p["tags"] for t in value.split(",")]
    task_id = client.submit(
        p["goal"], workflow=p["workflow_name"], driver_type=p["driver_type"], tags=tags,
        priority=p["priority"], max_attempts=p["max_attempts"],
        idempotency_key=p["idempotency_key"], queue_timeout=p["queue_timeout"],
        timeout=p["timeout"], reject_unmatched=p["reject_unmatched"], retry_on=p["retry_on"],
        retry_backoff=p["retry_backoff"], tenant=p["tenant"],
        roles=parse_role_options(p["roles"]) if p["roles"] else None,
    )  # fmt: skip
    if p["as_json"]:
        echo_json(_task_json(client.get(task_id)))
    else:
        click.echo(task_id)


def show_via_api(client: ApiClient, task_id: str, as_json: bool) -> None:
    t = client.get(task_id)
    if as_json:
        echo_json(_task_json(t))
        return
    for name, value in t.model_dump(mode="json", exclude={"attempts"}).items():
        click.echo(f"{name}: {'-' if value in (None, '', []) else value}")


def _one_id(task_ids: tuple[str, ...]) -> str:
    if len(task_ids) != 1:
        fail("with --api-url give exactly one task id (filters need Redis access)", 2)
    return validate_id(task_ids[0], "task id")


def cancel_via_api(client: ApiClient, task_ids: tuple[str, ...], reason: str, as_json: bool,
                   **rest: Any) -> None:  # fmt: skip
    _no_filters(rest)
    task_id = _one_id(task_ids)
    answer = client.cancel(task_id, reason)
    if as_json:
        echo_json({task_id: answer})
    elif answer == "cancelled":
        click.echo(f"{task_id} cancelled")
    elif answer == "requested":
        click.echo(f"{task_id} is running: cancel requested, its host will stop it")
    else:
        click.echo(f"{task_id} already {answer.split(':', 1)[-1]}: nothing to do")


def retry_via_api(client: ApiClient, task_ids: tuple[str, ...], as_json: bool,
                  **rest: Any) -> None:  # fmt: skip
    _no_filters(rest)
    refuse(rerun=rest.get("rerun"))
    task_id = _one_id(task_ids)
    new_id = client.retry(task_id)
    if as_json:
        echo_json({"id": new_id, "retry_of": task_id, "task": _task_json(client.get(new_id))})
    else:
        click.echo(f"{new_id} (retry of {task_id})")


def wait_via_api(client: ApiClient, task_ids: tuple[str, ...], timeout: float | None,
                 as_json: bool, **rest: Any) -> None:  # fmt: skip
    _no_filters(rest)
    task_id = _one_id(task_ids)
    try:
        t = client.wait(task_id, timeout=timeout)
    except TimeoutError as exc:
        click.echo(f"error: timed out: {exc}", err=True)
        sys.exit(124)
    if as_json:
        echo_json(_task_json(t))
    else:
        detail = f" ({t.failure_kind.value}: {t.error})" if t.failure_kind else ""
        click.echo(f"{t.id} {t.status.value}{detail}")
    sys.exit(0 if t.status == TaskStatus.done else 1)


def list_via_api(client: ApiClient, statuses: tuple[str, ...], driver_type: str | None,
                 tags: tuple[str, ...], host_id: str | None, tenant: str | None,
                 device_id: str | None, limit: int, as_json: bool, older_than: str | None,
                 since: str | None) -> None:  # fmt: skip
    refuse(older_than=older_than, since=since)
    if len(statuses) > 1:
        fail("with --api-url give --status at most once", 2)
    tasks = client.list(
        statuses[0] if statuses else None, limit=limit, driver_type=driver_type,
        tags=[t for v in tags for t in v.split(",") if t], host_id=host_id,
        device_id=device_id, tenant=tenant,
    )  # fmt: skip
    if as_json:
        echo_json([_task_json(t) for t in tasks])
        return
    for t in tasks:
        what = t.goal if t.kind == "goal" else f"workflow:{t.workflow}"
        click.echo(f"{t.id}  {t.status.value:<10} {what}")


def events_via_api(client: ApiClient, follow: bool, task_id: str | None, since: str | None,
                   as_json: bool, device_id: str | None, host_id: str | None,
                   types: tuple[str, ...], limit: int) -> None:  # fmt: skip
    from .ops_cmds import event_line

    refuse(device=device_id, host=host_id, type=types)

    try:
        for e in client.events(since=since or "0-0", task=task_id, follow=follow):
            click.echo(json.dumps(e.as_dict(), sort_keys=True) if as_json else event_line(e))
    except KeyboardInterrupt:
        return
