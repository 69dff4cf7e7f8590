"""The dashboard's task pages as an operator uses them: the list (``/tasks``) failures first
with each task's error, status tabs with counts, the filters kept in every link (status tabs,
pages, a task's page and back, after an action) and, for a logged-in operator, check boxes and
the bulk cancel/retry bar (`bulk`); a task's page (``/tasks/ID``) with every role of a
multi-device task, and a link back to the list it was opened from."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response

from ..core.models import ScheduledTask
from ..core.validation import validate_id
from . import data
from .bulk import DEFAULT_LIMIT, MAX_LIMIT
from .site import Site
from .task_list import (
    FAILURES_FIRST,
    MAX_SCAN,
    PAGE_SIZES,
    TaskFilter,
    list_query,
    list_tasks,
)

__all__ = ["task_page", "tasks_page"]


ERROR_CHARS = 160
"""Characters of a task's error shown in the list (the whole error is on its page)."""


def error_line(t: ScheduledTask) -> str:
    """The last non-blank line of a task's error (a traceback's last line says what
    happened), at most ``ERROR_CHARS`` characters; '' without an error."""
    lines = [x for x in (t.error or "").splitlines() if x.strip()]
    if not lines:
        return ""
    last = lines[-1].strip()
    return last if len(last) <= ERROR_CHARS else last[: ERROR_CHARS - 1] + "…"


def tabs(flt: TaskFilter, counts: dict[str, int]) -> list[dict[str, Any]]:
    """The status tabs: every status (failures first) with its count, each a link that keeps
    the other filters."""
    out = [{"label": "all", "status": None, "count": sum(counts.values()),
            "url": "/tasks?" + urlencode(flt.with_status(None).query()),
            "on": flt.status is None}]  # fmt: skip
    for s in FAILURES_FIRST:
        out.append({"label": s.value, "status": s.value, "count": counts.get(s.value, 0),
                    "url": "/tasks?" + urlencode(flt.with_status(s).query()),
                    "on": flt.status == s})  # fmt: skip
    return out


async def tasks_page(dash: Site, request: Request) -> Response:
    """``GET /tasks``: one page of the filtered list."""
    q = dict(request.query_params)
    flt = TaskFilter.parse(q)
    after = q.get("after") or None
    page = await dash.call(list_tasks, dash.client, flt, after)
    now = await dash.call(dash.admin.server_time_ms)
    next_url = "/tasks?" + urlencode(flt.query(page.next_cursor)) if page.next_cursor else None
    first_url = "/tasks?" + urlencode(flt.query()) if after else None
    here = urlencode(flt.query(after))
    return dash.render(
        request, "tasks.html", page=page, flt=flt, now=now, next_url=next_url,
        first_url=first_url, max_scan=MAX_SCAN, page_sizes=PAGE_SIZES,
        tabs=tabs(flt, page.counts), here=here, error_line=error_line,
        list_url="/tasks" + (f"?{here}" if here else ""), bulk_limit=DEFAULT_LIMIT,
        max_limit=MAX_LIMIT,
    )  # fmt: skip


async def task_page(dash: Site, request: Request) -> Response:
    """``GET /tasks/ID``; the query string is the list it was opened from (validated like
    the list's), for the link back and the actions' return."""
    here = urlencode(list_query(dict(request.query_params)))
    task_id = validate_id(request.path_params["task_id"], "task id")
    view = await dash.call(data.task_detail, dash.admin, task_id)
    t = view["t"]
    return dash.render(
        request, "task.html", view=view, t=t, here=here,
        list_url="/tasks" + (f"?{here}" if here else ""),
        back=f"/tasks/{t.id}" + (f"?{here}" if here else ""),
    )  # fmt: skip
