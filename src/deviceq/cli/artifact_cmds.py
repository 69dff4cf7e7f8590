"""``deviceq task artifacts``: the files an attempt kept in the artifact store (listed, or
downloaded with their sha256 checked); ``deviceq artifacts prune``: retention."""

from __future__ import annotations

from pathlib import Path

import click

from ..host.artifacts import download, parse_store_options, recorded, store_for
from .app import Ctx, echo_json, main, pass_ctx, task

STORE_HELP = (
    "The artifact store URL (file:///PATH or s3://BUCKET/PREFIX) [default: the pool's "
    "artifact_store setting]."
)


@task.command("artifacts")
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
    """
    admin = ctx.admin
    rec = recorded(admin, task_id, attempt)
    got: list[Path] = []
    if into is not None:
        store = store_for(admin, store_url, parse_store_options(store_options))
        got = download(store, admin.pool, task_id, rec, Path(into))
    if as_json:
        out = {"task_id": task_id, "attempt": rec.attempt, "artifacts": rec.files,
               "artifacts_error": rec.error}  # fmt: skip
        if into is not None:
            out["downloaded"] = [str(p) for p in got]
        echo_json(out)
        return
    if not rec.files:
        click.echo(f"task {task_id} attempt {rec.attempt}: no artifacts recorded")
    for f in rec.files:
        click.echo(f"{f['name']}\t{f['size']}\t{f['sha256']}")
    if rec.error:
        click.echo(f"artifacts_error: {rec.error}", err=True)
    if into is not None:
        click.echo(f"downloaded {len(got)} file(s) into {into} (sha256 checked)", err=True)


__all__ = ["main", "task_artifacts"]
