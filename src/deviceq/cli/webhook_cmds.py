"""``deviceq webhook add|list|remove``: HTTP receivers of a pool's events, delivered signed by
the leading scheduler (`deviceq.services.webhooks`)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..core.errors import InvalidInput
from ..services.webhooks import EVENTS, WebhookStore
from .app import main
from .context import Ctx, pass_ctx
from .files import check_output_path, output_option, write_output_file
from .render import echo_json


def _read_secret(path: str) -> str:
    """A webhook secret from its file (the text, stripped); InvalidInput when it is empty."""
    secret = Path(path).read_text().strip()
    if not secret:
        raise InvalidInput(f"{path} is empty")
    return secret


def _store(ctx: Ctx) -> WebhookStore:
    return WebhookStore(ctx.admin.redis, ctx.admin.keys)


@main.group()
def webhook() -> None:
    """Webhooks: POST chosen events (failed, quarantined, host_dead...) to an HTTP receiver,
    signed with HMAC-SHA256 (X-Deviceq-Signature), retried a bounded number of times by the
    leading scheduler."""


@webhook.command("add")
@click.argument("url")
@click.option(
    "--event",
    "events",
    multiple=True,
    required=True,
    help="Events to deliver, comma-separated or repeated: " + ", ".join(sorted(EVENTS)) + ".",
)
@click.option(
    "--secret-file",
    type=click.Path(dir_okay=False, exists=True, readable=True),
    help="Read the signing secret (16-256 characters) from FILE instead of generating one.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the webhook as JSON (no secret).")
@output_option("the generated secret")
@pass_ctx
def webhook_add(
    ctx: Ctx,
    url: str,
    events: tuple[str, ...],
    secret_file: str | None,
    as_json: bool,
    output: str | None,
) -> None:
    """Deliver EVENTS of the pool to URL. A generated secret is printed once (or written to
    -o FILE); the receiver checks X-Deviceq-Signature = sha256=HMAC-SHA256(secret, body).

    \b
    Example:
      deviceq webhook add https://ci.example.com/hooks/lab --event failed,quarantined,host_dead \\
          -o lab-hook.secret
    """
    secret = _read_secret(secret_file) if secret_file is not None else None
    if output is not None:
        check_output_path(output)
    hook = _store(ctx).add(url, events, secret)
    if as_json:
        echo_json(hook.public())
    else:
        click.echo(f"webhook {hook.id}: {', '.join(hook.events)} -> {hook.public()['url']}")
    if secret is None:  # generated: shown this once
        if output is not None:
            write_output_file(output, hook.secret + "\n")
            click.echo(f"secret of webhook {hook.id} written to {output}", err=True)
        elif not as_json:
            click.echo(f"secret (shown once): {hook.secret}")
        else:
            click.echo("the generated secret is not printed with --json: use -o FILE", err=True)


@webhook.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON (never the secrets).")
@pass_ctx
def webhook_list(ctx: Ctx, as_json: bool) -> None:
    """List the pool's webhooks with the outcome of their last delivery.

    \b
    Example:
      deviceq webhook list --json
    """
    hooks = [h.public() for h in _store(ctx).all()]
    if as_json:
        echo_json(hooks)
        return
    if not hooks:
        click.echo("no webhooks (add one with: deviceq webhook add URL --event failed)")
    for h in hooks:
        state = f"error: {h['last_error']}" if h["last_error"] else (
            "delivered" if h["last_ok_at"] else "nothing delivered yet")  # fmt: skip
        click.echo(f"{h['id']}  {h['url']}  {','.join(h['events'])}  ({state})")


@webhook.command("remove")
@click.argument("webhook_id")
@pass_ctx
def webhook_remove(ctx: Ctx, webhook_id: str) -> None:
    """Stop delivering to a webhook (deviceq webhook list shows the ids).

    \b
    Example:
      deviceq webhook remove wh-1a2b3c4d5e
    """
    _store(ctx).remove(webhook_id)
    click.echo(f"webhook {webhook_id} removed")


def _print_line(line: str) -> None:
    click.echo(line)
    sys.stdout.flush()  # at once, also into a file or a pipe


@webhook.command("listen")
@click.option(
    "--secret-file",
    required=True,
    type=click.Path(dir_okay=False, exists=True, readable=True),
    help="The webhook's secret (as written by `webhook add -o FILE`): each delivery's "
    "signature is checked against it.",
)
@click.option("--port", type=click.IntRange(1, 65535), default=8099, show_default=True,
              help="The port to listen on.")  # fmt: skip
@click.option("--bind", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option("--count", type=click.IntRange(0), default=0,
              help="Exit after COUNT distinct deliveries (a repeat is not counted; 0: run until "
                   "interrupted).")  # fmt: skip
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print each delivery's body as one JSON line, with signature_ok and repeat.",
)
def webhook_listen(secret_file: str, port: int, bind: str, count: int, as_json: bool) -> None:
    """Receive webhook deliveries and print one line each: EVENT, whether its signature
    matches the secret, and the task, device or host it is about. To try a webhook before
    pointing it at a real receiver (a bad signature is answered 401; a repeat of a delivery
    id is marked). Needs no Redis.

    \b
    Example:
      deviceq webhook add http://127.0.0.1:8099/deviceq --event failed -o hook.secret
      deviceq webhook listen --secret-file hook.secret
    """
    from ..services.webhook_listen import Listener

    secret = _read_secret(secret_file)
    try:
        listener = Listener(
            secret,
            _print_line,
            host=bind,
            port=port,
            as_json=as_json,
            count=count,
        )
    except OSError as e:
        raise InvalidInput(f"cannot listen on {bind}:{port}: {e.strerror or e}") from None
    click.echo(f"listening on http://{bind}:{listener.port}/ (Ctrl-C to stop)", err=True)
    try:
        listener.serve()
    except KeyboardInterrupt:
        listener.close()
