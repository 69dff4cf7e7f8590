"""The dashboard's device page (``/devices/ID``): what ``deviceq device show`` tells about one
device — its host, state and why, the task holding it, its reservation ("booking"), its
health check and quarantine reason — with its recent attempts (``device:ID:history``, each
linked to its task) and its change log (``device:ID:log``: quarantine, health and booking
changes), each the last 20 the pool keeps, newest first."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ..core.attributes import shown
from ..core.errors import InvalidInput, NotFound
from ..core.fleet import effective_state, operator_attributes
from ..core.models import Host
from ..core.validation import validate_id
from ..ops import status as st
from ..ops.admin import PoolAdmin
from ..producer.client import Client
from .site import Site


def _task_id(value: object) -> str | None:
    """A task id read back from a history entry, or None when it is not a valid id (an id
    becomes part of a key only once validated)."""
    try:
        return validate_id(value, "task id") if isinstance(value, str) else None
    except InvalidInput:
        return None


def device_view(admin: PoolAdmin, device_id: str) -> dict[str, Any]:
    """One device with its host, effective state, reservation, recent attempts (with each
    task's goal and, for a part of a multi-device task, the task it belongs to) and its
    change log. NotFound for an unknown device."""
    d = admin.device(device_id)
    host: Host | None
    try:
        host = admin.host(d.host_id)
    except NotFound:
        host = None
    resv = admin.reservation(device_id)
    state = effective_state(d, host)
    recent, log = admin.device_past(device_id)
    ids = [t for t in (_task_id(e.get("task")) for e in recent) if t]
    if d.reserved_by and _task_id(d.reserved_by):
        ids.append(d.reserved_by)
    client = Client(admin.redis, admin.pool)
    tasks = {t.id: t for t in client.get_many(list(dict.fromkeys(ids)))} if ids else {}
    attempts = [
        {**e, "task": _task_id(e.get("task")), "t": tasks.get(_task_id(e.get("task")) or "")}
        for e in recent
    ]
    changes = [
        {"event": e.get("event"), "at": e.get("at"),
         "rest": {k: v for k, v in e.items() if k not in ("event", "at") and v not in ("", None)}}
        for e in log
    ]  # fmt: skip
    values, times = admin.attributes([device_id], with_times=True)[device_id]
    by_op = operator_attributes(admin, device_id) if values else set()
    return {
        "d": d,
        "attributes": [
            (k, shown(v), times.get(k), "operator" if k in by_op else "host")
            for k, v in values.items()
        ],  # fmt: skip
        "host": host,
        "state": state,
        "why": st.device_reason(d, state, resv),
        "resv": resv,
        "current": tasks.get(d.reserved_by or ""),
        "attempts": attempts,
        "changes": changes,
        "now": admin.server_time_ms(),
    }


async def device_page(dash: Site, request: Request) -> Response:
    """``GET /devices/ID``: the device page (no query parameters)."""
    if request.query_params:
        raise InvalidInput("the device page takes no query parameters")
    device_id = validate_id(request.path_params["device_id"], "device id")
    view = await dash.call(device_view, dash.admin, device_id)
    return dash.render(request, "device.html", view=view, dv=view["d"])
