"""``deviceq suite submit|list|show|wait|cancel|artifacts``: a list of tests sharded over the
devices that match (`deviceq.suites`), its per-test results and ETA."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ..core.errors import InvalidInput
from .app import main
from .context import Ctx, pass_ctx
from .options import parse_duration_ms
from .render import echo_json, fmt_ms

if TYPE_CHECKING:
    from ..suites.model import Suite


def _usage(exc: InvalidInput) -> click.UsageError:
    """Bad input as one line and exit 2, nothing submitted."""
    return click.UsageError(str(exc))


SHOWN = 20
"""Failed (and flaky) tests ``suite show`` prints at most; ``--json`` has them all."""


def fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "unknown (no matching device now)"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


@main.group()
def suite() -> None:
    """Suites: a list of tests split into shards, each an ordinary task, over the devices
    that match; balanced on the tests' past durations, with per-test results from the JUnit
    files the runs keep in their artifacts, an ETA, failed tests retried on another device,
    or every test on every device. The leading scheduler records the results."""


@suite.command("submit")
@click.argument("name")
@click.option("--tests", "tests_file", required=True, metavar="FILE",
              help="The tests, one test id a line ('-': stdin; blank lines and # comments "
              "skipped).")  # fmt: skip
@click.option("--goal", metavar="TEMPLATE",
              help="Each shard's goal: TEMPLATE with {tests} replaced by its test ids (space "
              "separated). Whatever the runner, the run also finds them, one a line, in the "
              "file named by $DEVICEQ_TESTS_FILE (a Python runner: task.tests_file).")  # fmt: skip
@click.option("--command", metavar="TEMPLATE",
              help="Each shard's command (for a host running goals as commands): TEMPLATE "
              "with {tests} replaced by its test ids, each shell-quoted; the command also "
              "finds them, one a line, in the file $DEVICEQ_TESTS_FILE (then {tests} may be "
              "left out: a shard's goal is at most 16 KiB, its list of tests 1 MiB).")  # fmt: skip
@click.option("--driver-type", help="Only devices of this driver type.")
@click.option("--tag", "tags", multiple=True, help="A capability tag the devices need (repeat).")
@click.option("--priority", type=click.IntRange(0, 9), default=0, show_default=True)
@click.option("--tenant", help="Who the suite runs for (fair share, caps).")
@click.option("--timeout", metavar="DURATION", help="The longest one shard may run (10m, 1h).")
@click.option("--max-attempts", type=click.IntRange(1, 1000),
              help="Attempts of a shard's task after a fault (default: the pool's).")  # fmt: skip
@click.option("--shards", type=int, metavar="N",
              help="Split into N shards, balanced on the suite's duration history.")  # fmt: skip
@click.option("--deadline", metavar="DURATION",
              help="The fewest shards that end within DURATION on the devices matching now "
              "(at most --max-devices); refused on one line when it cannot be met.")  # fmt: skip
@click.option("--max-devices", type=int, metavar="N", help="With --deadline: at most N shards.")
@click.option("--each-device", is_flag=True,
              help="Every test on every device matching now: one task pinned to each.")  # fmt: skip
@click.option("--include-joining", metavar="DURATION",
              help="With --each-device: each matching device that registers within DURATION "
              "after the submit (10m; at most 7d) gets its pinned task too; the suite ends "
              "once the window has passed and every shard has ended.")  # fmt: skip
@click.option("--retry-failed", type=click.IntRange(0, 5), default=0, show_default=True,
              help="Rounds re-running only a shard's failed tests, as a new shard on another "
              "device.")  # fmt: skip
@click.option("--junit", default="**/junit*.xml", show_default=True, metavar="GLOB",
              help="The JUnit files of a run's artifacts ($DEVICEQ_ARTIFACTS_DIR) read for "
              "results.")  # fmt: skip
@click.option("--dry-run", is_flag=True, help="Print the plan (shards, ETA); submit nothing.")
@click.option("--json", "as_json", is_flag=True,
              help="Print {id, shards: [{task_id, tests}], eta_s}.")  # fmt: skip
@pass_ctx
def suite_submit(ctx: Ctx, name: str, tests_file: str, goal: str | None, command: str | None,
                 driver_type: str | None, tags: tuple[str, ...], priority: int,
                 tenant: str | None, timeout: str | None, max_attempts: int | None,
                 shards: int | None, deadline: str | None, max_devices: int | None,
                 each_device: bool, include_joining: str | None, retry_failed: int, junit: str,
                 dry_run: bool, as_json: bool) -> None:  # fmt: skip
    """Submit the tests of FILE as suite NAME: shards (ordinary tasks) over the matching
    devices; prints the suite's id, and on stderr its shards and ETA.

    Example:

    \b
      deviceq suite submit smoke --tests tests.txt --driver-type android \\
          --command './run-instrumentation.sh {tests}' --shards 3 --retry-failed 1
      deviceq suite submit smoke --tests tests.txt --command './run.sh {tests}' \\
          --deadline 15m --max-devices 10
      deviceq suite submit flash --tests checks.txt --command './check.sh {tests}' \\
          --driver-type board --each-device --include-joining 10m
      deviceq suite submit smoke --tests tests.txt --driver-type android --shards 3 \\
          --command './run-instrumentation.sh --tests-file "$DEVICEQ_TESTS_FILE"'
    """
    from ..core.input_files import read_input
    from ..suites.model import MAX_TESTS_FILE, parse_tests
    from ..suites.submission import submit

    try:
        tests = parse_tests(read_input(tests_file, MAX_TESTS_FILE), tests_file)
        timeout_s = None if timeout is None else parse_duration_ms(timeout, "--timeout") / 1000
        deadline_s = None if deadline is None else parse_duration_ms(deadline, "--deadline") / 1000
        joining_s = None
        if include_joining is not None:
            joining_s = parse_duration_ms(include_joining, "--include-joining") / 1000
        p = ctx.client.plan_suite(
            name, tests, goal=goal, command=command, driver_type=driver_type, tags=list(tags),
            shards=shards, max_devices=max_devices, deadline=deadline_s,
            each_device=each_device, include_joining=joining_s, retry_failed=retry_failed,
            priority=priority,
            tenant=tenant, timeout=timeout_s, max_attempts=max_attempts, junit=junit,
        )  # fmt: skip
    except InvalidInput as exc:
        raise _usage(exc) from None
    ids: list[str] = []
    if not dry_run:
        try:
            ids = submit(ctx.client, ctx.client, p)
        except InvalidInput as exc:
            raise _usage(exc) from None
    if as_json:
        echo_json({
            "id": None if dry_run else p.suite_id,
            "name": name,
            "tests": len(p.tests),
            "matching_devices": p.matching,
            "shards": [
                {"task_id": ids[i] if ids else None, "tests": s, "pin": p.pins[i],
                 "estimate_s": round(p.estimates[i], 1)}
                for i, s in enumerate(p.shards)
            ],
            "eta_s": None if p.eta_s is None else round(p.eta_s, 1),
            "include_joining_s": joining_s,
        })  # fmt: skip
        return
    what = "would be" if dry_run else "submitted as"
    click.echo(
        f"suite {name}: {len(p.tests)} tests {what} {len(p.shards)} shard(s), "
        f"{p.matching} matching device(s) now, ETA {fmt_eta(p.eta_s)}",
        err=True,
    )
    if joining_s is not None:
        click.echo(f"devices that register within {fmt_eta(joining_s)} get their shard too",
                   err=True)  # fmt: skip
    if not dry_run:
        click.echo(p.suite_id)


@suite.command("list")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of suites.")
@pass_ctx
def suite_list(ctx: Ctx, limit: int, as_json: bool) -> None:
    """The newest suites: id, name, status, tests passed/failed, shards, submitted.

    Example:
      deviceq suite list --limit 5 --json
    """
    rows = ctx.client.suites(limit)
    if as_json:
        echo_json(rows)
        return
    if not rows:
        click.echo("no suites", err=True)
        return
    for r in rows:
        c = r["counts"]
        click.echo(
            f"{r['id']}  {r['name']:<16} {r['status']:<9} {r['tests']:>5} tests  "
            f"passed {c['passed'] + c['flaky']}  failed {c['failed']}  "
            f"{r['shards']} shards  {fmt_ms(r['submitted_at'])}"
        )


def suite_lines(s: Suite) -> list[str]:
    """What ``suite show`` prints: status and ETA, counts, failed tests first (with their
    devices), flaky ones, then every shard."""
    c = s.counts
    out = [f"suite {s.id} ({s.name}): {s.status}"]
    if s.status == "running":
        out.append(f"ETA {fmt_eta(s.eta_s)}")
    if s.join_until is not None:
        joined = sum(sh.joined for sh in s.shards)
        state = "closed" if s.join_closed or s.terminal else "open"
        out.append(f"joining window {state} until {fmt_ms(s.join_until)}: {joined} device(s) "
                   "joined")  # fmt: skip
    out.append(
        f"tests {s.tests}: passed {c['passed']}, flaky {c['flaky']}, failed {c['failed']}, "
        f"skipped {c['skipped']}, pending {c['pending']}"
    )
    for word, rows in (("FAILED", s.failed), ("FLAKY ", s.flaky)):
        for r in rows[:SHOWN]:
            tries = ", ".join(f"{st} on {dev or '?'}" for st, dev, _ in r.tries)
            passed = any(st == "passed" for st, _, _ in r.tries)
            note = " (passed on another device)" if passed and word == "FAILED" else ""
            out.append(f"{word} {r.test}: {tries}{note}")
        if len(rows) > SHOWN:
            out.append(f"... {len(rows) - SHOWN} more {word.strip().lower()} (--json lists all)")
    for sh in s.shards:
        counts = " ".join(f"{k} {v}" for k, v in sorted(sh.counts.items()))
        retry = f" retry {sh.round}" if sh.round else ""
        pin = ""
        if sh.pin:
            pin = " (pinned" if sh.device_id == sh.pin else f" (pinned to {sh.pin}"
            pin += ", joined)" if sh.joined else ")"
        n = len(sh.tests)
        out.append(
            f"shard {sh.index}{retry}: task {sh.task_id} {sh.status or '?'} on "
            f"{sh.device_id or '-'}{pin}, {n} test{'s' if n != 1 else ''}"
            + (f" ({counts})" if counts else "")
        )
    return out


@suite.command("show")
@click.argument("suite_id")
@click.option("--json", "as_json", is_flag=True,
              help="Print {id, status, shards, counts, failed, flaky, eta_s...}.")  # fmt: skip
@pass_ctx
def suite_show(ctx: Ctx, suite_id: str, as_json: bool) -> None:
    """A suite: status, ETA while it runs, its joining window (--include-joining), counts,
    failed tests (with the devices they failed on) first, flaky ones, and every shard's task
    and device (a suite on every device: each device's outcome, joined ones marked).

    Example:
      deviceq suite show 3f9a1c2b7d4e6a80 --json
    """
    try:
        s = ctx.client.suite(suite_id)
    except InvalidInput as exc:
        raise _usage(exc) from None
    if as_json:
        echo_json(s.to_dict())
        return
    click.echo("\n".join(suite_lines(s)))


@suite.command("wait")
@click.argument("suite_id")
@click.option("--timeout", metavar="DURATION", help="Give up after DURATION (exit 124).")
@pass_ctx
def suite_wait(ctx: Ctx, suite_id: str, timeout: str | None) -> None:
    """Wait until the suite ends: exit 0 when done, 1 when failed or cancelled, 124 on
    --timeout.

    Example:
      deviceq suite wait 3f9a1c2b7d4e6a80 --timeout 30m && echo passed
    """
    try:
        limit = None if timeout is None else parse_duration_ms(timeout, "--timeout") / 1000
        ctx.client.suite(suite_id)
    except InvalidInput as exc:
        raise _usage(exc) from None
    start = time.monotonic()
    try:
        s = ctx.client.wait_suite(suite_id, limit)
    except TimeoutError:
        click.echo(f"suite {suite_id}: still running after {time.monotonic() - start:.0f}s",
                   err=True)  # fmt: skip
        sys.exit(124)
    click.echo(f"suite {s.id}: {s.status}")
    sys.exit(0 if s.status == "done" else 1)


@suite.command("cancel")
@click.argument("suite_id")
@pass_ctx
def suite_cancel(ctx: Ctx, suite_id: str) -> None:
    """Cancel a suite and every shard's task (again: the ones still running).

    Example:
      deviceq suite cancel 3f9a1c2b7d4e6a80
    """
    from .context import actor

    try:
        answers = ctx.client.cancel_suite(suite_id, by=actor())
    except InvalidInput as exc:
        raise _usage(exc) from None
    for task_id, answer in answers.items():
        click.echo(f"{task_id}\t{answer}")


@suite.command("artifacts")
@click.argument("suite_id")
@click.option("--download", "into", required=True, metavar="DIR",
              help="Download every shard's last attempt's files into DIR/SHARD-TASK and "
              "write DIR/junit.xml, the suite's results merged.")  # fmt: skip
@click.option("--artifact-store", metavar="URL",
              help="The store (default: the pool's artifact_store).")  # fmt: skip
@pass_ctx
def suite_artifacts(ctx: Ctx, suite_id: str, into: str, artifact_store: str | None) -> None:
    """Download a suite's artifacts and its merged junit.xml.

    Example:
      deviceq suite artifacts 3f9a1c2b7d4e6a80 --download results/
    """
    from ..artifacts.records import download, recorded, store_for
    from ..core.errors import NotFound
    from ..suites.report import merged_junit

    try:
        s = ctx.client.suite(suite_id)
    except InvalidInput as exc:
        raise _usage(exc) from None
    root = Path(into)
    root.mkdir(parents=True, exist_ok=True)
    failed: list[str] = []
    for sh in s.shards:
        try:
            rec = recorded(ctx.client, sh.task_id)
        except NotFound:
            continue
        store = store_for(ctx.client, artifact_store, attempt=(sh.task_id, rec.attempt))
        got = download(store, ctx.pool, sh.task_id, rec, root / f"{sh.index}-{sh.task_id}")
        failed += [f"shard {sh.index}: {line}" for line in got.failed]
        click.echo(f"shard {sh.index}: {len(got.paths)} file(s) into {sh.index}-{sh.task_id}/")
    results = ctx.client.redis.hgetall(ctx.client.keys.suite_results(suite_id))
    (root / "junit.xml").write_bytes(merged_junit(s, {str(k): str(v) for k, v in results.items()}))
    click.echo(f"merged results: {root / 'junit.xml'}")
    for line in failed:
        click.echo(f"error: {line}", err=True)
    if failed:
        sys.exit(1)
