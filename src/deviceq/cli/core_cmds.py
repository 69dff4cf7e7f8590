"""Commands of the core: submit, task show/list/cancel/wait, host add, config get/set."""

from __future__ import annotations

import json
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial

import click
import redis
from rich.table import Table

from ..core.errors import InvalidInput
from ..core.models import MAX_TASK_TIMEOUT, ScheduledTask, TaskStatus, validate_id
from ..producer import TaskFilter
from . import api_cmds
from .app import (
    Ctx,
    F,
    check_output_path,
    config,
    console_for_tables,
    echo_json,
    fail,
    host,
    main,
    output_option,
    pass_ctx,
    task,
    write_output_file,
)
from .logs_cmds import last_lines


def task_json(t: ScheduledTask) -> dict[str, object]:
    return t.model_dump(mode="json")


def fmt_ms(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


@main.command()
@api_cmds.via_api(api_cmds.submit_via_api)
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
    type=click.FloatRange(min=0, min_open=True),
    help="Fail as unschedulable after waiting this many seconds queued.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.001, max=MAX_TASK_TIMEOUT),
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
    metavar="NAME=DRIVER[:TAG,TAG]",
    help="A multi-device task: one device per role, all placed at once (repeatable, up to "
    "8; the first role is the leader, whose runner runs the goal once every role's device "
    "is claimed). Replaces --driver-type and --tag.",
)
@click.option(
    "--not-before",
    metavar="TIME",
    help="Queued, but not assigned before TIME: an ISO 8601 time (UTC unless it names a "
    "zone, e.g. 2026-12-02T02:00:00Z), at most a year ahead.",
)
@click.option(
    "--delay",
    metavar="DURATION",
    help="Queued, but not assigned for DURATION (90s, 10m, 2h, 1d; a bare number is seconds).",
)
@click.option(
    "--file",
    "tasks_file",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Bulk: submit every task of a JSONL file (one TaskSpec object a line).",
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
    retry_on: str | None,
    retry_backoff: str | None,
    roles: tuple[str, ...],
    not_before: str | None,
    delay: str | None,
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
    """
    if not_before is not None and delay is not None:
        fail("give --not-before or --delay, not both", 2)
    after: float | None = None
    if not_before is not None:
        after = parse_time_s(not_before, "--not-before")
    if delay is not None:
        after = time.time() + parse_duration_ms(delay, "--delay") / 1000
    if tasks_file is not None:
        if after is not None:
            fail("--not-before and --delay are not for --file (give not_before per line)", 2)
        from .ops_cmds import submit_file

        submit_file(ctx, tasks_file, as_json, reject_unmatched)
        return
    tag_list = [t for value in tags for t in value.split(",")]
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
        not_before=after,
    )
    for line in unknown_constraints(ctx, driver_type, sorted(set(tag_list))):
        click.echo(f"warning: {line}", err=True)  # stderr: stdout stays the id (or --json)
    if as_json:
        echo_json(task_json(ctx.client.get(task_id)))
    else:
        click.echo(task_id)


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


def parse_role_options(values: tuple[str, ...]) -> dict[str, str]:
    """``--role NAME=DRIVER[:TAG,TAG]`` options -> role name -> ``DRIVER[:TAGS]`` (in order;
    `deviceq.core.models.check_roles` validates each)."""
    out: dict[str, str] = {}
    for v in values:
        name, eq, spec = v.partition("=")
        if not eq or not name or not spec or spec.startswith(":"):
            raise click.BadParameter(
                f"{v!r}: expected NAME=DRIVER or NAME=DRIVER:TAG,TAG", param_hint="'--role'"
            )
        if name in out:
            raise click.BadParameter(f"role {name!r} given twice", param_hint="'--role'")
        out[name] = spec
    return out


@task.command("show")
@api_cmds.via_api(api_cmds.show_via_api)
@click.argument("task_id")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_ctx
def task_show(ctx: Ctx, task_id: str, as_json: bool) -> None:
    """Show every field of a task and its attempt history.

    \b
    Example:
      deviceq task show 3f2a9c0d1e2b4a5f --json
    """
    validate_id(task_id, "task id")  # bad input: one error line, before any warning
    ctx.warn_if_unknown_pool()
    t = ctx.client.get(task_id)
    if as_json:
        echo_json(task_json(t))
        return
    console = console_for_tables()
    grid = Table.grid(padding=(0, 2))
    hide = {"attempts", "roles"} | (set() if t.gang else {"gang", "role", "leader"})
    for name, value in t.model_dump(mode="json", exclude=hide).items():
        if name.endswith("_at") or name in ("lease_expires_at", "queue_deadline"):
            value = fmt_ms(value)
        if name in ("result", "error") and value:
            value, before = last_lines(str(value))
            if before:
                value = f"({before} earlier lines not shown)\n{value}"
        grid.add_row(f"[bold]{name}[/]", "-" if value in (None, "", []) else str(value))
    console.print(grid)
    if t.attempt:
        console.print(f"the whole output: deviceq task logs {t.id}", markup=False)
    if t.roles:
        roles = Table(title="roles")
        for col in ("role", "driver_type", "tags", "device", "host", "status"):
            roles.add_column(col)
        for name, r in t.roles.items():
            roles.add_row(
                name + (" (leader)" if name == next(iter(t.roles)) else ""),
                r.driver_type or "any",
                ",".join(r.tags) or "-",
                r.device_id or "-",
                r.host_id or "-",
                r.status or "-",
            )
        console.print(roles)
    if t.attempts:
        table = Table(title="attempts")
        for col in ("#", "lease", "host", "device", "assigned", "ended", "outcome", "kind"):
            table.add_column(col, no_wrap=col == "lease")
        for a in t.attempts:
            table.add_row(
                str(a.attempt),
                a.lease_id,
                a.host_id,
                a.device_id,
                fmt_ms(a.assigned_at),
                fmt_ms(a.ended_at),
                a.outcome,
                a.failure_kind or "-",
            )
        console.print(table)


# -- filters and bulk operations (issue 15) -----------------------------------------------------
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def parse_duration_ms(text: str, option: str) -> int:
    """``90``, ``90s``, ``10m``, ``2h``, ``1d``, ``1w`` (or ``500ms``) as ms; InvalidInput."""
    m = _DURATION.match(text)
    if not m:
        raise InvalidInput(
            f"{option}: {text!r} is not a duration (e.g. 90s, 10m, 2h, 1d; a bare number is "
            "seconds)"
        )
    return int(float(m.group(1)) * _UNIT_MS[m.group(2) or "s"])


def parse_since_ms(text: str, now_ms: int) -> int:
    """``--since``: a duration ago (``1h``) or an ISO 8601 time (UTC unless it names a zone)."""
    if _DURATION.match(text):
        return now_ms - parse_duration_ms(text, "--since")
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(
            f"--since: {text!r} is neither a duration (10m, 2h, 1d) nor an ISO time "
            "(2026-12-01T08:00:00Z)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


def parse_time_s(text: str, option: str) -> float:
    """An ISO 8601 time (UTC unless it names a zone) as a Unix time; a usage error (exit 2)
    otherwise."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        fail(f"{option}: {text!r} is not an ISO 8601 time (e.g. 2026-12-02T02:00:00Z)", 2)
        raise  # (fail exits)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def usage_checked(check: Callable[[], object]) -> None:
    """Run ``check`` (a validation raising InvalidInput) before a command reads or changes
    anything: a bad value is a usage error, one line on stderr and exit 2."""
    try:
        check()
    except InvalidInput as exc:
        fail(str(exc), 2)


def usage_ids(**ids: str | None) -> None:
    """Check ids given as options (``device_id="d1", host_id=None``; the name says what the
    id is) with `usage_checked`: a malformed one ends the command with exit 2."""
    for name, value in ids.items():
        if value is not None:
            usage_checked(partial(validate_id, value, name.removesuffix("_id") + " id"))


def filter_options(f: F) -> F:
    """The task filters of ``task list|cancel|retry|wait``."""
    for opt in reversed(
        [
            click.option(
                "--status",
                "statuses",
                multiple=True,
                type=click.Choice([s.value for s in TaskStatus]),
                help="Only tasks in this status (repeatable).",
            ),
            click.option("--driver-type", help="Only tasks that require this driver type."),
            click.option(
                "--tag",
                "tags",
                multiple=True,
                help="Only tasks that require this tag (repeatable, all must match; a comma "
                "list also works).",
            ),
            click.option(
                "--host",
                "host_id",
                help="Only tasks assigned to (or last run on) this host.",
            ),
            click.option("--tenant", help="Only tasks of this tenant."),
            click.option(
                "--older-than",
                metavar="DURATION",
                help="Only tasks submitted more than DURATION ago (90s, 10m, 2h, 1d).",
            ),
        ]
    ):
        f = opt(f)
    return f


def build_filter(
    ctx: Ctx,
    statuses: tuple[str, ...],
    driver_type: str | None,
    tags: tuple[str, ...],
    host_id: str | None,
    tenant: str | None,
    older_than: str | None,
    *,
    allowed: tuple[TaskStatus, ...] | None = None,
    verb: str = "",
    since: str | None = None,
    device_id: str | None = None,
) -> TaskFilter:
    """The `TaskFilter` of the filter options (checked: clear errors, before any change).
    ``allowed``: the statuses the operation applies to (the default selection; asking for
    another is an error)."""
    chosen = tuple(TaskStatus(s) for s in dict.fromkeys(statuses))
    if allowed is not None:
        bad = [s.value for s in chosen if s not in allowed]
        if bad:
            raise InvalidInput(
                f"--status {bad[0]}: only {', '.join(s.value for s in allowed)} tasks can be {verb}"
            )
        chosen = chosen or allowed
    if host_id is not None:
        validate_id(host_id, "host id")
    if tenant is not None:
        validate_id(tenant, "tenant")
    if device_id is not None:
        validate_id(device_id, "device id")
    now = ctx.client.server_time_ms() if (older_than or since) else 0
    return TaskFilter(
        statuses=chosen,
        driver_type=driver_type or None,
        tags=frozenset(t for v in tags for t in v.split(",") if t),
        host_id=host_id,
        tenant=tenant,
        device_id=device_id,
        submitted_before=now - parse_duration_ms(older_than, "--older-than")
        if older_than
        else None,
        submitted_after=parse_since_ms(since, now) if since else None,
    )


def describe_filter(flt: TaskFilter) -> str:
    parts = ["status=" + ",".join(s.value for s in flt.statuses)] if flt.statuses else []
    if flt.driver_type:
        parts.append(f"driver_type={flt.driver_type}")
    parts += [f"tag={t}" for t in sorted(flt.tags)]
    if flt.host_id:
        parts.append(f"host={flt.host_id}")
    if flt.device_id:
        parts.append(f"device={flt.device_id}")
    if flt.tenant:
        parts.append(f"tenant={flt.tenant}")
    if flt.submitted_before is not None:
        parts.append(f"submitted before {fmt_ms(flt.submitted_before)}")
    return " ".join(parts)


def select_tasks(
    ctx: Ctx,
    task_ids: tuple[str, ...],
    flt: TaskFilter | None,
    *,
    verb: str,
    yes: bool,
    limit: int,
) -> list[str]:
    """The ids a bulk command acts on: the ids given, or the tasks a filter selects, after
    showing their count and asking (``--yes`` skips the question; without a terminal on
    stdin and without --yes: an error, nothing done)."""
    if task_ids:
        if flt is not None:
            raise click.UsageError("give task ids or filters (--status, --tag...), not both")
        return list(dict.fromkeys(task_ids))
    if flt is None:
        raise click.UsageError(
            "give one or more task ids, or a filter (--status, --driver-type, --tag, --host, "
            "--older-than)"
        )
    res = ctx.client.find(flt, limit=limit)
    if res.truncated:
        click.echo(
            f"warning: stopped after examining {res.examined} index entries; more tasks may "
            "match (narrow the filter, or run again)",
            err=True,
        )
    ids = [t.id for t in res.tasks]
    what = describe_filter(flt)
    if not ids:
        click.echo(f"no task matches ({what})", err=True)
        return []
    more = f" (the first {limit}: --limit)" if len(ids) >= limit else ""
    click.echo(f"{len(ids)} task(s) match ({what}){more}", err=True)
    if yes:
        return ids
    if not sys.stdin.isatty():
        fail(
            f"refusing to {verb} {len(ids)} task(s) without confirmation: stdin is not a "
            "terminal; add --yes to confirm",
            2,
        )
    if not click.confirm(f"{verb} {len(ids)} task(s)?", default=False, err=True):
        fail("aborted: nothing done", 1)
    return ids


def targets(
    ctx: Ctx,
    task_ids: tuple[str, ...],
    statuses: tuple[str, ...],
    driver_type: str | None,
    tags: tuple[str, ...],
    host_id: str | None,
    tenant: str | None,
    older_than: str | None,
    *,
    allowed: tuple[TaskStatus, ...],
    done: str,
    verb: str,
    yes: bool,
    limit: int,
) -> tuple[list[str], TaskFilter | None]:
    """What a bulk command (``task cancel|retry|wait``) acts on: the ids given (checked, one
    error line before any warning), or the tasks its filter options select among the
    ``allowed`` statuses, counted and confirmed (`select_tasks`). Returns the ids and the
    filter (None when ids were given)."""
    for tid in task_ids:
        validate_id(tid, "task id")
    ctx.warn_if_unknown_pool()
    flt = None
    if _filter_given(statuses, driver_type, tags, host_id, tenant, older_than):
        flt = build_filter(ctx, statuses, driver_type, tags, host_id, tenant, older_than,
                           allowed=allowed, verb=done)  # fmt: skip
    return select_tasks(ctx, task_ids, flt, verb=verb, yes=yes, limit=limit), flt


def _filter_given(
    statuses: tuple[str, ...],
    driver_type: str | None,
    tags: tuple[str, ...],
    host_id: str | None,
    tenant: str | None,
    older_than: str | None,
) -> bool:
    return bool(statuses or driver_type or tags or host_id or tenant or older_than)


YES_OPTION = click.option(
    "--yes", "-y", is_flag=True, help="With a filter: act without asking for confirmation."
)
LIMIT_OPTION = click.option(
    "--limit",
    type=click.IntRange(1, 100_000),
    default=1000,
    show_default=True,
    help="With a filter: act on at most this many matching tasks.",
)


@task.command("list")
@api_cmds.via_api(api_cmds.list_via_api)
@filter_options
@click.option(
    "--since",
    metavar="WHEN",
    help="Only tasks submitted since WHEN: a duration ago (10m, 2h, 1d) or an ISO time "
    "(2026-12-01T08:00:00Z).",
)
@click.option(
    "--device",
    "device_id",
    help="Only tasks assigned to (or last run on) this device (combines with the other "
    "filters; see also device show's recent attempts).",
)
@click.option("--limit", type=click.IntRange(1, 10000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_ctx
def task_list(
    ctx: Ctx,
    statuses: tuple[str, ...],
    driver_type: str | None,
    tags: tuple[str, ...],
    host_id: str | None,
    tenant: str | None,
    older_than: str | None,
    since: str | None,
    device_id: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List tasks: queued/active oldest first, finished newest first. Filters read the
    status indexes page by page (bounded), never the whole keyspace.

    \b
    Example:
      deviceq task list --status queued --limit 20
      deviceq task list --host lab-1 --since 1h
      deviceq task list --device pixel-7 --status failed
      deviceq task list --status failed --driver-type android --older-than 1d --json
    """
    usage_ids(device_id=device_id, host_id=host_id)
    ctx.warn_if_unknown_pool()
    if (
        since is None
        and device_id is None
        and not _filter_given(statuses, driver_type, tags, host_id, tenant, older_than)
    ):
        tasks = ctx.client.list(None, limit=limit)
    elif (
        since is None
        and device_id is None
        and len(statuses) == 1
        and not (driver_type or tags or host_id or tenant or older_than)
    ):
        tasks = ctx.client.list(statuses[0], limit=limit)
    else:
        flt = build_filter(
            ctx, statuses, driver_type, tags, host_id, tenant, older_than, since=since,
            device_id=device_id,
        )  # fmt: skip
        res = ctx.client.find(flt, limit=limit)
        if res.truncated:
            click.echo(
                f"warning: stopped after examining {res.examined} index entries; more tasks "
                "may match",
                err=True,
            )
        tasks = res.tasks
    if as_json:
        echo_json([task_json(t) for t in tasks])
        return
    con = console_for_tables()
    cut = 40 if con.is_terminal else None  # piped: whole goals
    table = Table()
    table.add_column("id", no_wrap=True, min_width=16)  # ids stay whole: they get copied
    for col in ("status", "goal/workflow", "constraints", "attempt", "device", "failure"):
        goal = col == "goal/workflow"
        table.add_column(col, overflow="ellipsis", no_wrap=not goal, min_width=12 if goal else None)
    for t in tasks:
        what = t.goal if t.kind == "goal" else f"workflow:{t.workflow}"
        cons = " ".join(filter(None, [t.driver_type or "", *t.tags])) or "-"
        table.add_row(
            t.id,
            t.status.value,
            (what or "")[:cut],
            cons,
            f"{t.attempt}/{t.max_attempts}",
            t.device_id or "-",
            t.failure_kind.value if t.failure_kind else "-",
        )
    con.print(table)


CANCELLABLE = (TaskStatus.queued, TaskStatus.assigned, TaskStatus.dispatched)


@task.command("cancel")
@api_cmds.via_api(api_cmds.cancel_via_api)
@click.argument("task_ids", nargs=-1, metavar="[TASK_ID]...")
@click.option("--reason", default="cancelled by user", show_default=True)
@filter_options
@YES_OPTION
@LIMIT_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print {task_id: answer} as JSON.")
@pass_ctx
def task_cancel(
    ctx: Ctx,
    task_ids: tuple[str, ...],
    reason: str,
    statuses: tuple[str, ...],
    driver_type: str | None,
    tags: tuple[str, ...],
    host_id: str | None,
    tenant: str | None,
    older_than: str | None,
    yes: bool,
    limit: int,
    as_json: bool,
) -> None:
    """Cancel tasks: queued/assigned ones at once, running ones via their host. Give ids, or
    a filter (queued, assigned and dispatched tasks; --status narrows it): the matching
    count is shown and confirmed first (--yes skips the question; required when stdin is
    not a terminal).

    \b
    Example:
      deviceq task cancel 3f2a9c0d1e2b4a5f 9b1c2d3e4f5a6b7c
      deviceq task cancel --status queued --driver-type android --older-than 2h --yes
    """
    ids, flt = targets(ctx, task_ids, statuses, driver_type, tags, host_id, tenant, older_than,
                       allowed=CANCELLABLE, done="cancelled", verb="cancel",
                       yes=yes, limit=limit)  # fmt: skip
    if not ids:
        if as_json:
            echo_json({})
        return
    answers = ctx.client.cancel_many(ids, reason)
    if as_json:
        echo_json(answers)
        return
    messages = {
        "cancelled": "{} cancelled",
        "requested": "{} is running: cancel requested, its host will stop it",
    }
    for task_id, res in answers.items():
        default = f"{{}} already {res.split(':', 1)[-1]}: nothing to do"
        click.echo(messages.get(res, default).format(task_id))
    if len(answers) > 1:
        n = Counter("already" if a.startswith("already") else a for a in answers.values())
        click.echo(
            f"{n['cancelled']} cancelled, {n['requested']} cancel requested, "
            f"{n['already']} already finished",
            err=True,
        )


WAITABLE = (TaskStatus.queued, TaskStatus.assigned, TaskStatus.dispatched)


@task.command("wait")
@api_cmds.via_api(api_cmds.wait_via_api)
@click.argument("task_ids", nargs=-1, metavar="[TASK_ID]...")
@click.option("--timeout", type=float, default=None, help="Give up after SECONDS (exit 124).")
@filter_options
@YES_OPTION
@LIMIT_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the finished task(s) as JSON.")
@pass_ctx
def task_wait(
    ctx: Ctx,
    task_ids: tuple[str, ...],
    timeout: float | None,
    statuses: tuple[str, ...],
    driver_type: str | None,
    tags: tuple[str, ...],
    host_id: str | None,
    tenant: str | None,
    older_than: str | None,
    yes: bool,
    limit: int,
    as_json: bool,
) -> None:
    """Block until tasks finish: one, several ids, or the unfinished tasks a filter selects
    (confirmed like `task cancel`). Exit 0 when all are done, 1 when one failed or was
    cancelled, 124 on timeout. Prints a line per task (a JSON object for one id, a list
    otherwise, with --json).

    \b
    Example:
      deviceq task wait 3f2a9c0d1e2b4a5f --timeout 300 && echo passed
      deviceq task wait 3f2a9c0d1e2b4a5f 9b1c2d3e4f5a6b7c --timeout 600
      deviceq task wait --tag nightly --yes
    """
    ids, flt = targets(ctx, task_ids, statuses, driver_type, tags, host_id, tenant, older_than,
                       allowed=WAITABLE, done="waited for", verb="wait for",
                       yes=yes, limit=limit)  # fmt: skip
    if not ids:
        if as_json:
            echo_json([])
        return
    try:
        if len(ids) == 1 and flt is None:
            done = [ctx.client.wait(ids[0], timeout=timeout)]
        else:
            done = ctx.client.wait_many(ids, timeout=timeout)
    except TimeoutError as exc:
        click.echo(f"error: timed out: {exc}", err=True)
        sys.exit(124)
    if as_json:
        echo_json(task_json(done[0]) if len(ids) == 1 and flt is None else
                  [task_json(t) for t in done])  # fmt: skip
    else:
        for t in done:
            detail = f" ({t.failure_kind.value}: {t.error})" if t.failure_kind else ""
            click.echo(f"{t.id} {t.status.value}{detail}")
    sys.exit(0 if all(t.status == TaskStatus.done for t in done) else 1)


def print_token(host_id: str, token: str, as_json: bool, output: str | None) -> None:
    """A new token on stdout, or into ``output`` (written only now, after success)."""
    if as_json:
        text = json.dumps({"host_id": host_id, "token": token}, indent=2, sort_keys=True)
    else:
        text = token
    if output is None:
        click.echo(text)
        return
    write_output_file(output, text + "\n")
    click.echo(f"token of host {host_id} written to {output}", err=True)


@host.command("add")
@click.argument("host_id")
@click.option("--json", "as_json", is_flag=True, help="Print {host_id, token} as JSON.")
@output_option("the token")
@pass_ctx
def host_add(ctx: Ctx, host_id: str, as_json: bool, output: str | None) -> None:
    """Create a host and print its secret token once (only a digest is stored).

    \b
    Example:
      deviceq host add lab-1 -o lab-1.token     # no file at all if it fails
      deviceq host add lab-1 --pool lab --redis-url redis://redis.lab:6379/0
    """
    if output is not None:
        check_output_path(output)
    print_token(host_id, ctx.admin.add_host(host_id), as_json, output)


@config.command("get")
@click.argument("key", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
@pass_ctx
def config_get(ctx: Ctx, key: str | None, as_json: bool) -> None:
    """Print one setting, or every setting with its value, marking those at their default.

    \b
    Example:
      deviceq config get lease_ttl
      deviceq config get            # every setting; "(default)" where the pool set none
    """
    values = ctx.admin.get_config(key)
    if as_json:
        echo_json(values)
    elif key:
        click.echo(values[key])
    else:
        stored = ctx.admin.stored_settings()
        width = max(map(len, values))
        for k, v in values.items():
            click.echo(f"{k:<{width}}  {v}" + ("" if k in stored else "  (default)"))


@config.command("set", context_settings={"ignore_unknown_options": True})  # VALUE may be -1
@click.argument("key")
@click.argument("value")
@pass_ctx
def config_set(ctx: Ctx, key: str, value: str) -> None:
    """Change a setting (validated; durations in seconds).

    \b
    Example:
      deviceq config set max_queue_depth 50000
    """
    stored = ctx.admin.set_config(key, value)
    click.echo(f"{key} {stored}")
