"""``--api-url``: the producer commands (``submit``, ``task show|list|cancel|retry|wait``,
``events``) talking to a ``deviceq api`` service instead of Redis (`via_api` gives a command
the options; each ``*_via_api`` is a command's API form)."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from .errors import fail
from .files import F
from .options import parse_role_options
from .render import echo_json, event_line, task_text, visible

if TYPE_CHECKING:
    from ..producer.http_client import ApiClient


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
    from ..producer.http_client import ApiClient

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
    refuse(file=p["tasks_file"], not_before=p.get("not_before"), delay=p.get("delay"))

    tags = [t for value in p["tags"] for t in value.split(",")]
    task_id = client.submit(
        p["goal"], workflow=p["workflow_name"], driver_type=p["driver_type"], tags=tags,
        priority=p["priority"], max_attempts=p["max_attempts"],
        idempotency_key=p["idempotency_key"], queue_timeout=p["queue_timeout"],
        timeout=p["timeout"], reject_unmatched=p["reject_unmatched"], retry_on=p["retry_on"],
        retry_backoff=p["retry_backoff"], tenant=p["tenant"],
        roles=parse_role_options(p["roles"]) if p["roles"] else None,
        priority_class=p.get("priority_class"),
    )  # fmt: skip
    if p["as_json"]:
        echo_json(_task_json(client.get(task_id)))
    else:
        click.echo(task_id)


def show_via_api(client: ApiClient, task_id: str, as_json: bool, raw: bool) -> None:
    t = client.get(task_id)
    if as_json:
        echo_json(_task_json(t))
        return
    text = task_text(_task_json(t))
    click.echo(text if raw else visible(text))


def _one_id(task_ids: tuple[str, ...]) -> str:
    from ..core.validation import validate_id

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
    from ..core.vocabulary import TaskStatus

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
        click.echo(visible(f"{t.id} {t.status.value}{detail}"))
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
    refuse(device=device_id, host=host_id, type=types)

    try:
        for e in client.events(since=since or "0-0", task=task_id, follow=follow):
            click.echo(json.dumps(e.as_dict(), sort_keys=True) if as_json else event_line(e))
    except KeyboardInterrupt:
        return
