"""``deviceq verify``: audit a pool's state and event stream against deviceq's invariants
(`deviceq.ops.verify`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click

from ..ops.verify.model import DEFAULT_BATCH, MAX_BATCH, MIN_BATCH
from .app import main
from .context import Ctx, pass_ctx
from .render import echo_json

if TYPE_CHECKING:
    from ..ops.verify import Progress as ProgressFn
    from ..ops.verify import VerifyResult

PLAIN_EVERY_S = 5.0
"""Without a terminal on stderr, a progress line at most this often (quick runs print none)."""


@contextmanager
def _progress() -> Iterator[ProgressFn]:
    """A progress callback for `verify` that draws on stderr: a live bar on a terminal,
    otherwise a plain line every few seconds (so a big pool shows it is moving)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not console.is_terminal:
        started = last = time.monotonic()

        def plain(stage: str, done: int, total: int | None) -> None:
            nonlocal last
            now = time.monotonic()
            if now - last >= PLAIN_EVERY_S:
                last = now
                of = f"/{total}" if total is not None else ""
                click.echo(f"verify: {stage} {done}{of} ({now - started:.0f}s)", err=True)

        yield plain
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        stages: dict[str, object] = {}

        def live(stage: str, done: int, total: int | None) -> None:
            if stage not in stages:
                stages[stage] = bar.add_task(stage, total=total)
            bar.update(stages[stage], completed=done, total=total)  # type: ignore[arg-type]

        yield live


def _summary(result: VerifyResult) -> str:
    """The first line: pool, what was checked, the verdict, what could not be judged."""
    c = result.checked
    what = (
        f"{c.get('tasks', 0)} tasks, {c.get('devices', 0)} devices, "
        f"{c.get('index_entries', 0)} index entries, {c.get('events', 0)} events"
    )
    verdict = "ok" if result.ok else f"{len(result.violations)} violation(s)"
    skipped = ", ".join(f"{k} {v}" for k, v in result.skipped.items() if v)
    return f"pool {result.pool}: {verdict} ({what}){'; skipped: ' + skipped if skipped else ''}"


@main.command("verify")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object: {pool, violations: [{kind, task|device|host|key, detail}], "
    "checked, skipped}.",
)
@click.option(
    "--batch",
    type=click.IntRange(MIN_BATCH, MAX_BATCH),
    default=DEFAULT_BATCH,
    show_default=True,
    help="Commands per round trip and entries per reply (every read is bounded by it).",
)
@click.option(
    "--no-confirm",
    is_flag=True,
    help="Report what the first pass finds (by default a pass that finds violations is "
    "repeated and only what both find is reported: a busy pool's races are not).",
)
@click.option(
    "--scope",
    is_flag=True,
    help="Print what verify checks and what it cannot check (with --json as "
    '{"checks": [...], "cannot_check": [...]}), without reading the pool.',
)
@pass_ctx
def verify_cmd(ctx: Ctx, as_json: bool, batch: int, no_confirm: bool, scope: bool) -> None:
    """Check the pool's invariants from its Redis state and event stream (read-only, in
    bounded batches): one live lease per device and per task, terminal once, no report from a
    superseded lease accepted, whole attempt histories, consistent indexes and counters.
    Exits 0 when all hold, 1 when a violation is found (one line each). Progress goes to
    stderr. A pass that finds violations is repeated and only what both passes find is
    reported, so a transition between two reads of a busy pool is not taken for one.

    It cannot tell a record forged by a user with direct Redis access from the real thing
    when the forger repeats every write of the transition: --scope lists what it checks and
    what it cannot; the HTTP API is the boundary for producers and hosts not trusted.

    \b
    Example:
      deviceq verify
      deviceq verify --json | jq -r '.violations[] | "\\(.kind) \\(.task // .device)"'
      deviceq verify --scope
    """
    from ..ops.verify import verify
    from ..ops.verify.results import CANNOT_CHECK, CHECKS

    if scope:
        if as_json:
            echo_json({"checks": list(CHECKS), "cannot_check": list(CANNOT_CHECK)})
        else:
            click.echo("verify checks, from the pool's records:")
            click.echo("\n".join(f"  - {line}" for line in CHECKS))
            click.echo("it cannot check:")
            click.echo("\n".join(f"  - {line}" for line in CANNOT_CHECK))
        return

    with _progress() as progress:
        result = verify(ctx.admin, batch=batch, progress=progress, confirm=not no_confirm)
    if as_json:
        echo_json(result.as_dict())
    else:
        click.echo(_summary(result))
        for v in result.violations:
            click.echo(f"  {v.line()}")
        click.echo(
            "note: verify sees what Redis holds; a forgery by a direct-Redis user that repeats "
            "a transition's every write looks like the transition (deviceq verify --scope)",
            err=True,
        )
    if not result.ok:
        sys.exit(1)
