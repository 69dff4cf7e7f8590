"""``deviceq task logs``: an attempt's live log (what its run printed), while it runs and
after (until ``retention`` past its end)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING

import click

from ..core.errors import NotFound
from .app import task
from .context import Ctx, pass_ctx
from .errors import fail
from .lazy import DurationRange
from .render import visible
from .via_api import via_api

if TYPE_CHECKING:
    from ..core.live_logs import LogEntry
    from ..producer.http_client import ApiClient

MARKS = {"stdout": "", "stderr": "[stderr] ", "log": "[log] "}
"""What starts each line of a stream in the text form (stdout is left as it is)."""


class TextPrinter:
    """Prints entries as text: each line of stderr and log chunks marked (`MARKS`), a line
    cut across two chunks marked once; control characters shown as escapes (`visible`: what
    a run printed never drives the terminal) unless ``raw``."""

    def __init__(self, raw: bool = False) -> None:
        self.at_line_start: dict[str, bool] = {}
        self.raw = raw

    def __call__(self, e: LogEntry) -> None:
        mark = MARKS.get(e.stream, f"[{e.stream}] ")
        text = e.text if self.raw else visible(e.text)
        if not mark:
            sys.stdout.write(text)
        else:
            out = []
            start = self.at_line_start.get(e.stream, True)
            for piece in text.splitlines(keepends=True):
                out.append((mark if start else "") + piece)
                start = piece.endswith("\n")
            self.at_line_start[e.stream] = start
            sys.stdout.write("".join(out))
        sys.stdout.flush()


def print_entries(entries: Iterable[LogEntry], as_json: bool, raw: bool = False) -> None:
    show = TextPrinter(raw)
    for e in entries:
        if as_json:
            click.echo(json.dumps(e.json(), sort_keys=True))
        else:
            show(e)


def logs_via_api(client: ApiClient, task_id: str, attempt: int | None, follow: bool,
                 timeout: float | None, as_json: bool, raw: bool) -> None:  # fmt: skip
    """``task logs`` through ``deviceq api`` (``GET /tasks/ID/logs``): the same output and
    exit codes."""
    from ..core.validation import validate_id
    from ..core.vocabulary import TaskStatus

    validate_id(task_id, "task id")
    if timeout is not None and not follow:
        fail("--timeout goes with --follow", 2)
    n = attempt if attempt is not None else max(1, client.get(task_id).attempt)
    if not follow:
        print_entries(client.logs(task_id, n), as_json, raw)
        return
    try:
        print_entries(client.logs(task_id, n, follow=True, timeout=timeout), as_json, raw)
    except TimeoutError as exc:
        click.echo(f"error: timed out: {exc}", err=True)
        sys.exit(124)
    t = client.get(task_id)
    sys.exit(0 if t.attempt == n and t.status == TaskStatus.done else 1)


@task.command("logs")
@via_api(logs_via_api)
@click.argument("task_id")
@click.option("--attempt", type=click.IntRange(min=1), default=None,
              help="Which attempt's log (1, 2, ...; default: the latest).")  # fmt: skip
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing as the run writes, until the attempt ends; exit 0 when it "
              "ended done, 1 when it failed or was cancelled (like `task wait`).")  # fmt: skip
@click.option("--timeout", type=DurationRange(min=0), default=None,
              help="With --follow: give up after SECONDS (exit 124).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True,
              help='One JSON object per chunk: {"time_ms", "stream": "stdout"|"stderr"|"log", '
              '"text"}.')  # fmt: skip
@click.option("--raw", is_flag=True,
              help="Write the output's bytes as they are, terminal control sequences "
              "included (by default they are shown as escapes: \\e[31m, \\r).")  # fmt: skip
@pass_ctx
def task_logs(ctx: Ctx, task_id: str, attempt: int | None, follow: bool,
              timeout: float | None, as_json: bool, raw: bool) -> None:  # fmt: skip
    """Print what an attempt of a task wrote (stdout, stderr marked [stderr], task.log lines
    marked [log]), while it runs and for `retention` after it ended. Control characters and
    escape sequences in it are shown as escapes (\\e]0;title\\a, \\r); --raw writes them.

    \b
    Example:
      deviceq task logs 3f2a9c0d1e2b4a5f
      deviceq task logs 3f2a9c0d1e2b4a5f --follow --timeout 600
      deviceq task logs 3f2a9c0d1e2b4a5f --attempt 1 --json
      deviceq task logs 3f2a9c0d1e2b4a5f -f --api-url https://deviceq.lab:8300
    """
    from ..core.live_logs import LogReader
    from ..core.validation import validate_id

    validate_id(task_id, "task id")
    if timeout is not None and not follow:
        fail("--timeout goes with --follow", 2)
    reader = LogReader(ctx.client.redis, ctx.client.keys)
    try:
        n = reader.attempt_for(task_id, attempt)
    except NotFound as exc:
        fail(str(exc), 1)
        return
    if not follow:
        print_entries(reader.all(task_id, n), as_json, raw)
        return
    try:
        print_entries(reader.follow(task_id, n, timeout), as_json, raw)
    except TimeoutError as exc:
        click.echo(f"error: timed out: {exc}", err=True)
        sys.exit(124)
    sys.exit(0 if reader.state(task_id).succeeded(n) else 1)
