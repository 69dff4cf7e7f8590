"""``submit --file``: a JSONL file of task specs, validated whole, then submitted in chunks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

import click

from ..core.errors import DeviceqError, InvalidInput, NotConfirmed, QueueFull
from ..core.input_files import nesting_guard, read_input
from .context import Ctx
from .errors import fail
from .render import echo_json

if TYPE_CHECKING:
    from ..core.models import TaskSpec

SUBMIT_FILE_CHUNK = 500  # tasks per progress step (each step: submit_many's atomic chunks)


def read_task_file(path: str) -> list[tuple[int, TaskSpec]]:
    """Parse and validate a JSONL file of TaskSpec objects ('-' = stdin): ``(line number,
    spec)`` pairs. Raises InvalidInput naming the first bad line."""
    from ..producer.submission import spec_from

    text = read_text(path)
    specs: list[tuple[int, TaskSpec]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            with nesting_guard(f"line {n}"):
                data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"line {n}: not valid JSON: {exc.msg}") from None
        if not isinstance(data, dict):
            raise InvalidInput(f"line {n}: expected a JSON object (a task spec)")
        try:
            specs.append((n, spec_from(data)))
        except DeviceqError as exc:
            raise InvalidInput(f"line {n}: {exc}") from None
    if not specs:
        raise InvalidInput(f"{path}: no tasks (one JSON object per line)")
    return specs


def _chunks(specs: list[TaskSpec], size: int) -> Iterator[list[TaskSpec]]:
    for i in range(0, len(specs), size):
        yield specs[i : i + size]


SUBMIT_FILE_EXCLUSIVE = (
    "goal",
    "tenant",
    "retry_on",
    "retry_backoff",
    "workflow_name",
    "driver_type",
    "tags",
    "priority",
    "max_attempts",
    "idempotency_key",
    "queue_timeout",
    "timeout",
)


def queued_before(exc: DeviceqError) -> list[str]:
    """The ids a refused `Client.submit_many` call queued before it stopped."""
    if isinstance(exc, QueueFull):
        return exc.queued_ids
    if isinstance(exc, NotConfirmed):
        return [str(i) for i in exc.result or []]
    return []


def submit_file(ctx: Ctx, path: str, as_json: bool, reject_unmatched: bool | None) -> None:
    """``submit --file``: validate every line first, then submit in chunks with a progress
    bar. Prints the ids (or a JSON list). A refused chunk (e.g. QueueFull) stops it: the ids
    submitted so far are printed, then the error."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    cctx = click.get_current_context()
    given = [
        p
        for p in cctx.command.params
        if p.name in SUBMIT_FILE_EXCLUSIVE
        and cctx.params.get(p.name) not in (None, ())
        and cctx.get_parameter_source(p.name) != click.core.ParameterSource.DEFAULT
    ]
    if given:
        opts = ", ".join(
            p.opts[0] if isinstance(p, click.Option) else p.human_readable_name for p in given
        )
        raise InvalidInput(f"--file takes every task from the file; do not combine it with {opts}")
    numbered = read_task_file(path)
    specs = [s for _, s in numbered]
    if any(s.workflow for s in specs):
        known: set[str] = set(ctx.client.list_workflows())
        for n, s in numbered:
            if s.workflow and s.workflow not in known:
                raise InvalidInput(f"line {n}: unknown workflow {s.workflow}")
    if reject_unmatched is not None:
        specs = [
            s
            if s.reject_unmatched is not None
            else s.model_copy(update={"reject_unmatched": reject_unmatched})
            for s in specs
        ]
    err_console = Console(stderr=True)
    ids: list[str] = []
    error: DeviceqError | None = None
    with Progress(
        TextColumn("submitting"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=not err_console.is_terminal,
    ) as progress:
        bar = progress.add_task("submit", total=len(specs))
        for part in _chunks(specs, SUBMIT_FILE_CHUNK):
            try:
                ids += ctx.client.submit_many(part)
            except DeviceqError as exc:
                ids += queued_before(exc)
                error = exc
                break
            progress.advance(bar, len(part))
    from ..core.fleet import unknown_attributes, where_keys

    names = where_keys(w for s in specs for w in s.all_where())
    for line in unknown_attributes(ctx.admin.redis, ctx.admin.keys, names):
        click.echo(f"warning: {line}", err=True)
    if as_json:
        echo_json(ids)
    else:
        for i in ids:
            click.echo(i)
    if error is not None:
        fail(
            f"{type(error).__name__}: {error} ({len(ids)} of {len(specs)} tasks submitted"
            f"{', ids above' if ids else ''})"
        )


def read_text(path: str) -> str:
    """A file's text ('-' = stdin), bounded (`read_input`); InvalidInput when it cannot be
    read."""
    return read_input(path)
