"""``deviceq task artifacts``: the files an attempt kept in the artifact store (listed, or
downloaded with their sha256 checked); ``deviceq artifacts prune``: retention."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .app import main, task
from .context import Ctx, pass_ctx
from .render import echo_json
from .via_api import refuse, via_api

if TYPE_CHECKING:
    from ..producer.http_client import ApiClient

STORE_HELP = (
    "The artifact store URL (file:///PATH or s3://BUCKET/PREFIX) [default: the pool's "
    "artifact_store setting]."
)


def artifacts_via_api(client: ApiClient, task_id: str, attempt: int | None, into: str | None,
                      store_url: str | None, store_options: tuple[str, ...],
                      as_json: bool) -> None:  # fmt: skip
    """``task artifacts`` through ``deviceq api``: listed, and downloaded from the pool's
    store by the service (each checked against its recorded sha256)."""
    from ..core.errors import DeviceqError

    refuse(artifact_store=store_url, artifact_store_option=store_options)
    rec = client.artifacts(task_id, attempt)
    got: list[Path] = []
    failed: list[str] = []
    if into is not None:
        for f in rec["artifacts"]:
            name = str(f["name"])
            try:
                got.append(client.download_artifact(task_id, int(rec["attempt"]), name, into))
            except (DeviceqError, OSError) as exc:  # (ApiError is a DeviceqError)
                failed.append(f"{name}: {_why(exc)}")
    show(task_id, int(rec["attempt"]), rec["artifacts"], rec["artifacts_error"], into, got,
         as_json, failed)  # fmt: skip


def _why(exc: BaseException) -> str:
    if isinstance(exc, IsADirectoryError):
        return "a folder, not a file (another recorded name is inside it)"
    if isinstance(exc, NotADirectoryError):
        return "a folder on its path is a file (another recorded name)"
    if isinstance(exc, OSError):
        return exc.strerror or type(exc).__name__
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text


def show(task_id: str, attempt: int, files: list[dict[str, Any]], error: str | None,
         into: str | None, got: list[Path], as_json: bool,
         failed: list[str] | None = None) -> None:  # fmt: skip
    """Print an attempt's recorded artifacts (and what was downloaded into ``into``); each
    file that could not be downloaded is one ``error:`` line on stderr, then exit 1."""
    failed = failed or []
    if as_json:
        out: dict[str, Any] = {"task_id": task_id, "attempt": attempt, "artifacts": files,
                               "artifacts_error": error}  # fmt: skip
        if into is not None:
            out["downloaded"] = [str(p) for p in got]
            out["failed"] = failed
        echo_json(out)
    else:
        if not files:
            click.echo(f"task {task_id} attempt {attempt}: no artifacts recorded")
        for f in files:
            click.echo(f"{f['name']}\t{f['size']}\t{f['sha256']}")
        if error:
            click.echo(f"artifacts_error: {error}", err=True)
        if into is not None:
            click.echo(f"downloaded {len(got)} file(s) into {into} (sha256 checked)", err=True)
    for line in failed:
        click.echo(f"error: {line}", err=True)
    if failed:
        raise SystemExit(1)


@task.command("artifacts")
@via_api(artifacts_via_api)
@click.argument("task_id")
@click.option(
    "--attempt", type=click.IntRange(1, 9999), help="Which attempt [default: the latest]."
)
@click.option(
    "--download",
    "into",
    type=click.Path(file_okay=False),
    metavar="DIR",
    help="Download the files into DIR (created), each checked against its recorded sha256.",
)
@click.option("--artifact-store", "store_url", metavar="URL", help=STORE_HELP)
@click.option(
    "--artifact-store-option",
    "store_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="An option of the store's filesystem (repeatable), e.g. endpoint_url=http://HOST:PORT.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_ctx
def task_artifacts(
    ctx: Ctx,
    task_id: str,
    attempt: int | None,
    into: str | None,
    store_url: str | None,
    store_options: tuple[str, ...],
    as_json: bool,
) -> None:
    """List the files an attempt of a task kept (name, size, sha256), or download them.

    \b
    Example:
      deviceq task artifacts t-123 --attempt 2 --download ./out
      deviceq task artifacts t-123 --json --api-url https://deviceq.lab:8300
    """
    from ..artifacts.records import download, recorded, store_for
    from ..artifacts.store import parse_store_options

    admin = ctx.admin
    rec = recorded(admin, task_id, attempt)
    got: list[Path] = []
    failed: list[str] = []
    if into is not None:
        store = store_for(admin, store_url, parse_store_options(store_options),
                          (task_id, rec.attempt))  # fmt: skip
        res = download(store, admin.pool, task_id, rec, Path(into))
        got, failed = res.paths, res.failed
    show(task_id, rec.attempt, rec.files, rec.error, into, got, as_json, failed)


__all__ = ["artifacts_prune", "task_artifacts"]


@main.group("artifacts")
def artifacts_group() -> None:
    """The artifact store's upkeep."""


@artifacts_group.command("prune")
@click.option("--artifact-store", "store_url", metavar="URL", help=STORE_HELP)
@click.option(
    "--artifact-store-option",
    "store_options",
    multiple=True,
    metavar="KEY=VALUE",
    help="An option of the store's filesystem (repeatable), e.g. endpoint_url=http://HOST:PORT.",
)
@click.option(
    "--limit",
    type=click.IntRange(1, 10_000),
    default=100,
    show_default=True,
    help="Remove the artifacts of at most this many tasks in this call.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_ctx
def artifacts_prune(
    ctx: Ctx, store_url: str | None, store_options: tuple[str, ...], limit: int, as_json: bool
) -> None:
    """Remove the stored artifacts of tasks past the pool's artifact_retention (seconds after
    the task finished; 0 = keep, the default): tasks that finished longer ago, or that are no
    longer in Redis at all. Bounded: at most --limit tasks per call; run it from cron (it
    says whether more are left: exit 0 either way).

    \b
    Example:
      deviceq config set artifact_retention 2592000   # 30 days
      deviceq artifacts prune --limit 500
    """
    from ..artifacts.records import store_for
    from ..artifacts.retention import prune
    from ..artifacts.store import parse_store_options

    admin = ctx.admin
    store = store_for(admin, store_url, parse_store_options(store_options))
    res = prune(admin, store, limit)
    if as_json:
        echo_json({"removed": res.removed, "scanned": res.scanned, "more": res.more})
        return
    click.echo(f"removed the artifacts of {len(res.removed)} task(s)"
               + ("; more are left: run it again" if res.more else ""))  # fmt: skip
