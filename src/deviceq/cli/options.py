"""Options shared by commands: their parsers (durations, times, ids, ``--role``), and the task
filters of the bulk commands (``task list|cancel|retry|wait``) with the selection they make."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import astuple, dataclass, fields
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import click

from ..core.errors import InvalidInput
from .context import Ctx
from .errors import fail
from .files import F
from .lazy import TASK_STATUSES, LazyChoice
from .render import fmt_ms

if TYPE_CHECKING:
    from ..producer.task_filter import TaskFilter


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


def parse_duration_ms(text: str, option: str) -> int:
    """A duration option's text as ms (`deviceq.core.validation.parse_duration_s`, the one
    syntax); InvalidInput naming the option."""
    from ..core.validation import parse_duration_s

    try:
        return round(parse_duration_s(text) * 1000)
    except InvalidInput as exc:
        raise InvalidInput(f"{option}: {exc}") from None


def parse_since_ms(text: str, now_ms: int) -> int:
    """``--since``: a duration ago (``1h``) or an ISO 8601 time (UTC unless it names a zone)."""
    if text.strip()[:1].isdigit() and "-" not in text and ":" not in text:  # (not a time)
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
    from ..core.validation import validate_id

    for name, value in ids.items():
        if value is not None:
            usage_checked(functools.partial(validate_id, value, name.removesuffix("_id") + " id"))


@dataclass(frozen=True)
class TaskFilterArgs:
    """The values of the task filter options (`filter_options`), as given: none given is
    no filter."""

    statuses: tuple[str, ...] = ()
    driver_type: str | None = None
    tags: tuple[str, ...] = ()
    host_id: str | None = None
    tenant: str | None = None
    older_than: str | None = None

    def given(self) -> bool:
        """Whether any filter option was given."""
        return any(astuple(self))


FILTER_PARAMS = tuple(f.name for f in fields(TaskFilterArgs))
"""The parameters of the filter options, as click passes them."""

_FILTER_OPTIONS = (
    click.option(
        "--status",
        "statuses",
        multiple=True,
        type=LazyChoice(TASK_STATUSES),
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
)


def filter_options(f: F) -> F:
    """The task filters of ``task list|cancel|retry|wait``: the command gets them as one
    ``filters`` parameter, a `TaskFilterArgs` (a decorator above this one, ``via_api``'s,
    still sees each option as its own parameter)."""

    @functools.wraps(f)
    def packed(*args: object, **params: object) -> object:
        values = {name: params.pop(name) for name in FILTER_PARAMS}
        return f(*args, filters=TaskFilterArgs(**values), **params)  # type: ignore[arg-type]

    for opt in reversed(_FILTER_OPTIONS):
        packed = opt(packed)
    return packed  # type: ignore[return-value]


def build_filter(
    ctx: Ctx,
    filters: TaskFilterArgs,
    *,
    allowed: tuple[str, ...] | None = None,
    verb: str = "",
    since: str | None = None,
    device_id: str | None = None,
) -> TaskFilter:
    """The `TaskFilter` of the filter options (checked: clear errors, before any change).
    ``allowed``: the statuses the operation applies to (the default selection; asking for
    another is an error)."""
    from ..core.validation import validate_id
    from ..core.vocabulary import TaskStatus
    from ..producer.task_filter import TaskFilter

    statuses, driver_type, tags, host_id, tenant, older_than = astuple(filters)
    chosen = tuple(TaskStatus(s) for s in dict.fromkeys(statuses))
    if allowed is not None:
        may = tuple(TaskStatus(s) for s in allowed)
        bad = [s.value for s in chosen if s not in may]
        if bad:
            raise InvalidInput(
                f"--status {bad[0]}: only {', '.join(s.value for s in may)} tasks can be {verb}"
            )
        chosen = chosen or may
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
    filters: TaskFilterArgs,
    *,
    allowed: tuple[str, ...],
    done: str,
    verb: str,
    yes: bool,
    limit: int,
) -> tuple[list[str], TaskFilter | None]:
    """What a bulk command (``task cancel|retry|wait``) acts on: the ids given (checked, one
    error line before any warning), or the tasks its filter options select among the
    ``allowed`` statuses, counted and confirmed (`select_tasks`). Returns the ids and the
    filter (None when ids were given)."""
    from ..core.validation import validate_id

    for tid in task_ids:
        validate_id(tid, "task id")
    ctx.warn_if_unknown_pool()
    flt = None
    if filters.given():
        flt = build_filter(ctx, filters, allowed=allowed, verb=done)
    return select_tasks(ctx, task_ids, flt, verb=verb, yes=yes, limit=limit), flt


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
