"""Bulk cancel and retry from the dashboard's task list, like ``deviceq task cancel|retry``
with ids or a filter: the tasks checked in the list, or the tasks the list's filter selects
(at most ``limit``, through `Client.find`), are counted and shown on a confirmation page
(``POST /bulk/confirm``); only its "confirm" (``POST /bulk/apply``) acts, on exactly the ids
it showed, through `Client.cancel_many` and `Client.retry` (the same transitions as the
command line). Both need the operator's session and its CSRF token; the list's filters come
back after the action."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from urllib.parse import parse_qsl

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ..core.errors import InvalidInput
from ..core.models import ScheduledTask
from ..core.validation import validate_id
from ..core.vocabulary import LEASED_STATUSES, TaskStatus
from ..producer.client import Client
from ..producer.task_filter import TaskFilter as FindFilter
from .site import Site
from .task_list import TaskFilter, carried_query

log = logging.getLogger("deviceq.dashboard")

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
"""The most tasks one bulk action takes (the confirmation page carries their ids)."""
MAX_FIND_SCAN = 20_000
"""Index entries a filter examines at most for one confirmation page."""
SHOWN = 50
"""Tasks listed by id on the confirmation page (all of them are counted)."""
REASON = "cancelled from the dashboard (bulk)"
ALLOWED: dict[str, tuple[TaskStatus, ...]] = {
    "cancel": (TaskStatus.queued, *(TaskStatus(s) for s in LEASED_STATUSES)),
    "retry": (TaskStatus.failed, TaskStatus.cancelled),
}
"""The statuses each operation applies to (as ``task cancel`` and ``task retry``)."""
DONE = {"cancel": "cancelled", "retry": "retried"}


@dataclass(frozen=True)
class GoalFilter(FindFilter):
    """`deviceq.producer.task_filter.TaskFilter` with the list's "goal contains" text as well."""

    text: str | None = None

    def matches(self, t: ScheduledTask) -> bool:
        if not super().matches(t):
            return False
        return not self.text or self.text.casefold() in (t.goal or t.workflow or "").casefold()


def find_filter(flt: TaskFilter, op: str) -> GoalFilter:
    """The `Client.find` filter of the list's filter for ``op``: its status (which must be
    one ``op`` applies to) or every such status."""
    allowed = ALLOWED[op]
    if flt.status is not None and flt.status not in allowed:
        raise InvalidInput(
            f"status {flt.status.value}: only {', '.join(s.value for s in allowed)} tasks can "
            f"be {DONE[op]}"
        )
    return GoalFilter(
        statuses=(flt.status,) if flt.status else allowed,
        driver_type=flt.driver_type,
        tags=frozenset([flt.tag]) if flt.tag else frozenset(),
        host_id=flt.host,
        tenant=flt.tenant,
        text=flt.text,
    )


def _limit(raw: str) -> int:
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise InvalidInput(f"limit must be a number from 1 to {MAX_LIMIT}")
    return int(raw)


def _ids(form: FormData) -> list[str]:
    ids = [validate_id(str(v), "task id") for v in form.getlist("ids")]
    if len(ids) > MAX_LIMIT:
        raise InvalidInput(f"at most {MAX_LIMIT} tasks at once")
    return list(dict.fromkeys(ids))


@dataclass
class Selection:
    """What a bulk action would act on: ``tasks`` (their ids go to the confirmation form),
    the selected ones it leaves out (not in a status ``op`` applies to), whether ``limit``
    cut the selection and whether the filter's scan stopped at its bound."""

    op: str
    scope: str
    tasks: list[ScheduledTask]
    skipped: list[ScheduledTask]
    limit: int
    hit_limit: bool
    truncated: bool


def select(client: Client, op: str, scope: str, ids: list[str], list_q: str,
           limit: int) -> Selection:  # fmt: skip
    """The tasks of a bulk action: the checked ``ids`` (scope ``selected``), or those the
    list query ``list_q`` selects (scope ``filter``), at most ``limit``."""
    if scope == "selected":
        if not ids:
            raise InvalidInput("no task is checked: check some, or act on the filter")
        found = client.get_many(ids)
        ok = [t for t in found if t.status in ALLOWED[op]]
        return Selection(op, scope, ok[:limit], [t for t in found if t not in ok],
                         limit, len(ok) > limit, False)  # fmt: skip
    q = {k: v for k, v in parse_qsl(list_q) if k != "after"}
    res = client.find(find_filter(TaskFilter.parse(q), op), limit=limit, max_scan=MAX_FIND_SCAN)
    return Selection(op, scope, res.tasks, [], limit, len(res.tasks) >= limit, res.truncated)


def _op_scope(raw: str) -> tuple[str, str]:
    op, _, scope = raw.partition("-")
    if op not in ALLOWED or scope not in ("selected", "filter"):
        raise InvalidInput("unknown bulk action")
    return op, scope


async def confirm(dash: Site, request: Request) -> Response:
    """``POST /bulk/confirm``: the confirmation page of a bulk action (nothing changed)."""
    await dash.operator(request)
    form = await request.form()
    op, scope = _op_scope(str(form.get("action") or ""))
    list_q = carried_query(str(form.get("list") or ""))
    sel = await dash.call(select, dash.client, op, scope, _ids(form), list_q,
                          _limit(str(form.get("limit") or DEFAULT_LIMIT)))  # fmt: skip
    return dash.render(request, "bulk_confirm.html", sel=sel, shown=sel.tasks[:SHOWN],
                       list_q=list_q, list_q_items=parse_qsl(list_q), verb=op,
                       done=DONE[op])  # fmt: skip


def apply_op(client: Client, op: str, ids: list[str], by: str = "") -> str:
    """Cancel or retry exactly ``ids`` (``by``: the user who asked, in the events); returns
    the summary shown to the operator. Every id is checked before the first one is acted on."""
    if op == "cancel":
        answers = client.cancel_many(ids, f"{REASON} by {by}" if by else REASON, by)
        n = Counter("already" if a.startswith("already") else a for a in answers.values())
        return (
            f"{len(answers)} task(s): {n['cancelled']} cancelled, {n['requested']} cancel "
            f"requested (running: their hosts stop them), {n['already']} already finished"
        )
    olds = {t.id: t for t in client.get_many(ids)}
    for tid in ids:  # all checked before the first is submitted
        if tid not in olds or olds[tid].status not in ALLOWED["retry"]:
            what = olds[tid].status.value if tid in olds else "gone"
            raise InvalidInput(f"task {tid} is {what}: only failed or cancelled tasks can be "
                               "retried (nothing was retried)")  # fmt: skip
    new = [client.retry(tid, by=by) for tid in ids]
    return f"{len(new)} task(s) retried as new tasks: " + " ".join(new[:20]) + (
        " ..." if len(new) > 20 else "")  # fmt: skip


async def apply(dash: Site, request: Request) -> Response:
    """``POST /bulk/apply``: act on the ids the confirmation page showed, then back to the
    list with its filters."""
    session = await dash.operator(request)
    form = await request.form()
    op = str(form.get("op") or "")
    if op not in ALLOWED:
        raise InvalidInput("unknown bulk action")
    ids = _ids(form)
    list_q = carried_query(str(form.get("list") or ""))
    summary = (
        await dash.call(apply_op, dash.client, op, ids, session.user) if ids else "nothing to do"
    )
    log.info("dashboard bulk %s of %d task(s) by %s: %s", op, len(ids), session.user, summary)
    session.flash.append(f"Bulk {op}: {summary}")
    return RedirectResponse("/tasks" + (f"?{list_q}" if list_q else ""), status_code=303)
