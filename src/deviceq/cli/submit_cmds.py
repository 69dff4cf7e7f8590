"""``deviceq submit``: one task from the command line (or a file of them, `task_files`), with a
warning when no registered device could run it."""

from __future__ import annotations

import time
from typing import Any

import click
import redis

from .app import main
from .context import Ctx, pass_ctx
from .errors import fail
from .lazy import DurationRange
from .options import parse_role_options, parse_time_s
from .render import echo_json, task_json
from .via_api import submit_via_api, via_api


@main.command()
@via_api(submit_via_api)
@click.argument("goal", required=False)
@click.option("--workflow", "workflow_name", help="Run this stored workflow instead of a goal.")
@click.option("--driver-type", help="Only devices of this driver type may run it.")
@click.option(
    "--tag",
    "tags",
    multiple=True,
    help="Required device capability (repeatable; a comma list also works: --tag wifi,camera).",
)
@click.option(
    "--priority",
    type=click.IntRange(0, 9),
    default=0,
    show_default=True,
    help="Higher runs first under the priority_match strategy.",
)
@click.option("--max-attempts", type=click.IntRange(1, 1000), help="Attempts before failing.")
@click.option("--idempotency-key", help="A retried submit with the same key returns the same id.")
@click.option(
    "--queue-timeout",
    type=DurationRange(min=0, min_open=True),
    help="Fail as unschedulable after waiting this many seconds queued.",
)
@click.option(
    "--timeout",
    type=DurationRange("deviceq.core.bounds:MAX_TASK_TIMEOUT", min=0.001),
    metavar="SECONDS",
    help="Longest a run may take (up to 7 days): its host stops it then and the task fails "
    "with `timeout` (not counted against the device). The host's --task-timeout, when "
    "smaller, wins.",
)
@click.option(
    "--reject-unmatched",
    is_flag=True,
    default=None,
    help="Refuse it now if no registered device could ever run it.",
)
@click.option(
    "--tenant",
    help="Who the task is for: fair_share gives tenants devices by their weights "
    "(deviceq tenant set), and a tenant's cap on devices held applies.",
)
@click.option(
    "--class",
    "priority_class",
    metavar="NAME",
    help="Its priority class (deviceq priority-class add): the task gets the class's priority "
    "and, as the class says, may preempt running tasks of a lower priority or be preempted.",
)
@click.option(
    "--retry-on",
    metavar="KINDS",
    help="Failure kinds after which it is retried while attempts are left (comma list of "
    "infrastructure, runner_error, timeout, runner_failed, lease_expired; or none). "
    "Default: the pool's retry_on.",
)
@click.option(
    "--retry-backoff",
    metavar="SPEC",
    help="Delay before a retry: none, fixed:SECONDS or exponential:BASE:MAX (doubling, "
    "jittered). Default: the pool's retry_backoff.",
)
@click.option(
    "--role",
    "roles",
    multiple=True,
    metavar="NAME=DRIVER[:TAG,TAG][ where EXPR]",
    help="A multi-device task: one device per role, all placed at once (repeatable, up to "
    "8; the first role is the leader, whose runner runs the goal once every role's device "
    "is claimed). Replaces --driver-type and --tag. A role's device may have to satisfy "
    "--where expressions of its own: 'phone=android:sim where sdk>=33 where has(gps)'.",
)
@click.option(
    "--where",
    "where",
    multiple=True,
    metavar="EXPR",
    help="Only on a device whose attributes satisfy EXPR (repeatable, and-ed): KEY OP VALUE "
    "with OP = != < <= > >= (versions compare as versions: 'release>=14.1'), 'KEY in (A, B)', "
    "'has(KEY)'; e.g. --where 'sdk>=33' --where 'battery>=50'. See device list --attr.",
)
@click.option(
    "--not-before",
    metavar="TIME",
    help="Queued, but not assigned before TIME: an ISO 8601 time (UTC unless it names a "
    "zone, e.g. 2026-12-02T02:00:00Z), at most a year ahead.",
)
@click.option(
    "--delay",
    type=DurationRange(min=0, max=365 * 86400),
    help="Queued, but not assigned for DURATION (90s, 10m, 2h, 1d, 1h30m; a bare number is "
    "seconds), counted by the Redis server's clock from the submission.",
)
@click.option(
    "--file",
    "tasks_file",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Bulk: submit every task of a JSONL file (one TaskSpec object a line). Every line "
    "is checked first; then the tasks go in atomic chunks (all of a chunk's tasks submitted or "
    "none), each one script call of at most 125 tasks and 2.5 ms of Redis time by the "
    "tasks' declared cost (fewer for long goals or lists of tests); a refused chunk stops it: "
    "the ids submitted before it are printed, then the error.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the task as JSON.")
@pass_ctx
def submit(
    ctx: Ctx,
    goal: str | None,
    workflow_name: str | None,
    driver_type: str | None,
    tags: tuple[str, ...],
    priority: int,
    max_attempts: int | None,
    idempotency_key: str | None,
    queue_timeout: float | None,
    timeout: float | None,
    reject_unmatched: bool | None,
    tenant: str | None,
    priority_class: str | None,
    retry_on: str | None,
    retry_backoff: str | None,
    roles: tuple[str, ...],
    not_before: str | None,
    delay: float | None,
    where: tuple[str, ...],
    tasks_file: str | None,
    as_json: bool,
) -> None:
    """Submit a task (a GOAL or --workflow NAME) and print its id; or, with --file, every task
    of a JSONL file (all lines validated first) and print their ids.

    \b
    Example:
      deviceq submit "open the camera" --driver-type android --tag camera --tag wifi
      deviceq submit --workflow smoke-suite --max-attempts 5 --json
      deviceq submit "run the benchmark" --timeout 600   # fails `timeout` after 10 minutes
      deviceq submit "flash the board" --retry-on infrastructure,timeout --retry-backoff fixed:30
      deviceq submit --file tasks.jsonl   # {"goal": "open settings", "tags": ["wifi"]} a line
      deviceq submit "log in on both" --role phone=android:sim --role web=browser
      deviceq submit "nightly soak" --delay 10m      # or --not-before 2026-12-02T02:00:00Z
      deviceq submit "release smoke test" --class release-blocker
      deviceq submit "camera test" --where 'sdk>=33' --where 'model in (Pixel 7, Pixel 8)'
    """
    from .context import said_on_stderr
    from .task_files import submit_file

    if not_before is not None and delay is not None:
        fail("give --not-before or --delay, not both", 2)
    clauses = _where_checked(where)
    from ..core.models import spec_where_texts

    role_where = spec_where_texts({"roles": parse_role_options(roles)}) if roles else []
    _where_checked(tuple(role_where))
    after: float | None = None
    delay_s: float | None = None
    if not_before is not None:
        after = parse_time_s(not_before, "--not-before")
    if delay is not None:
        delay_s = float(delay)
        if ctx.client.__class__.__name__ == "ApiClient":  # (the API takes a time)
            after, delay_s = time.time() + delay_s, None
    if tasks_file is not None:
        if after is not None or delay_s is not None:
            fail("--not-before and --delay are not for --file (give not_before per line)", 2)
        with said_on_stderr():
            submit_file(ctx, tasks_file, as_json, reject_unmatched)
        return
    tag_list = [t for value in tags for t in value.split(",")]
    extra: dict[str, Any] = {"delay": delay_s} if delay_s is not None else {}  # (Redis time)
    if where:
        extra["where"] = list(where)
    with said_on_stderr():  # (a priority the strategy in force ignores: one line)
        task_id = ctx.client.submit(
            goal,
            workflow=workflow_name,
            driver_type=driver_type,
            # the command line is where a comma list is split (the Python API refuses a bare str)
            tags=tag_list,
            priority=priority,
            max_attempts=max_attempts,
            idempotency_key=idempotency_key,
            queue_timeout=queue_timeout,
            timeout=timeout,
            reject_unmatched=reject_unmatched,
            retry_on=retry_on,
            retry_backoff=retry_backoff,
            tenant=tenant,
            roles=parse_role_options(roles) if roles else None,
            priority_class=priority_class,
            not_before=after,
            **extra,
        )
    warn_unknown_constraints(ctx, driver_type, tag_list)
    from ..core.fleet import where_keys

    warn_unknown_attributes(ctx, {c.key for c in clauses} | where_keys(role_where))
    if as_json:
        echo_json(task_json(ctx.client.get(task_id)))
    else:
        click.echo(task_id)


def _where_checked(where: tuple[str, ...]) -> tuple[Any, ...]:
    """The --where expressions parsed; a malformed one ends the command (one line, exit 2)."""
    from ..core.errors import InvalidInput
    from ..core.where import parse_all

    try:
        return parse_all(list(where))
    except InvalidInput as exc:
        fail(str(exc), 2)
        raise  # (fail exits)


def warn_unknown_attributes(ctx: Ctx, names: set[str]) -> None:
    """One ``warning:`` line (stderr) per attribute name no registered device has (likely a
    typo), read from the ``attr_names`` hash (one HKEYS); none when it cannot be read."""
    from ..core.fleet import unknown_attributes

    for line in unknown_attributes(ctx.admin.redis, ctx.admin.keys, names):
        click.echo(f"warning: {line}", err=True)


def warn_unknown_constraints(ctx: Ctx, driver_type: str | None, tags: list[str]) -> None:
    """Say on stderr (stdout keeps the id or the JSON), one ``warning:`` line each, the driver
    type and tags no registered device has (`unknown_constraints`): what ``submit`` and
    ``schedule add`` both say."""
    for line in unknown_constraints(ctx, driver_type, sorted(set(tags))):
        click.echo(f"warning: {line}", err=True)


def unknown_constraints(ctx: Ctx, driver_type: str | None, tags: list[str]) -> list[str]:
    """Why no registered device could run a task of ``driver_type`` and ``tags`` (most
    likely a typo), one line per driver type or tag that no device has, naming the ones that
    exist; read from the ``caps`` hash of device profiles (one HGETALL), nothing is scanned.
    Empty when some device has them, or when the caller may not read ``caps``."""
    from ..ops.status import device_profiles

    try:
        profiles = device_profiles(ctx.admin)
    except redis.ResponseError:  # an ACL user without HGETALL on caps: no warning
        return []
    drivers = sorted({d for d, _, _ in profiles})
    out: list[str] = []
    if driver_type and driver_type not in drivers:
        out.append(
            f"no device has driver type {driver_type!r} (known: {', '.join(drivers) or 'none'})"
        )
        driver_type = None  # its tags are checked against every device
    of = [t for d, t, _ in profiles if not driver_type or d == driver_type]
    known = sorted({t for ts in of for t in ts})
    where = f"known tags of {driver_type} devices" if driver_type else "known tags"
    for tag in tags:
        if tag not in known:
            out.append(f"no device has tag {tag!r} ({where}: {', '.join(known) or 'none'})")
    return out
