"""The host protocol over HTTP (session, heartbeat, claim, renew, report, control messages):
each call carries the host's own token (``Authorization: Bearer``) and acts as that host and
no other (the Lua scripts check the token's digest).

Every route is ``/hosts/{host_id}/...`` and builds a `deviceq.host.redis_link.HostClient` for the
host of its path, with the token of the request and its daemon session (header
``X-Deviceq-Session``, once ``POST /hosts/{host_id}/session`` started one). A call that runs a
script is authenticated by the script; one that does not (a long poll on the host's wake or
control list, a read) authenticates the token in Python first (and the session, where the
scripts would check it), so a host can only ever read or wait on what is its own. Answers are
JSON; errors are the API's one error shape (`deviceq.api.errors`): 401 ``AUTH`` for a wrong
token or another host's id, 409 ``SUPERSEDED`` for a fenced session, 503 ``UNAVAILABLE``
while Redis is unreachable (retry)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import redis
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ..core.errors import (
    DeviceqError,
    InvalidInput,
    NotConfirmed,
    NotFound,
)
from ..core.models import ScheduledTask
from ..core.redirects import UNAVAILABLE
from ..core.validation import validate_id
from ..host.heartbeat_sync import GONE, Reply, Row
from ..host.link import DeviceReport, Report
from ..host.log_stream import LogChunk
from ..host.progress import ProgressUpdate, checked_update
from ..host.redis_link import CTL_DRAIN, HostClient
from .context import ApiContext
from .errors import error, from_exception
from .host_call import (
    CTL_MAX,
    LOG,
    MAX_ITEMS,
    SESSION_MODES,
    Call,
    Handler,
    _bearer,
    _bool,
    _int,
    _items,
    _json_body,
    _objects,
    _session,
    _str,
)


# -- session --------------------------------------------------------------------------------
def get_session(call: Call) -> dict[str, Any]:
    """The host's daemon session as stored: ``{"session", "session_owner",
    "last_heartbeat"}`` (a starting daemon reads it to tell whether the previous one is
    gone). Token checked; no session needed."""
    call.authenticate(session=False)
    return dict(call.client().host_record())


def start_session(call: Call) -> dict[str, Any]:
    """Start a daemon session: body ``{"session", "mode": "start"|"dead"|"takeover",
    "owner", "expected"}`` (see lua/session.lua); answers ``{"epoch", "replaced",
    "handed_back"}``. 409 SESSION_ACTIVE while another daemon's session is live."""
    mode = _str(call.body, "mode", "start")
    if mode not in SESSION_MODES:
        raise InvalidInput(f"mode must be one of {', '.join(SESSION_MODES)}")
    info = call.client().start_session(
        _str(call.body, "session"),
        mode,
        _str(call.body, "owner", ""),
        _str(call.body, "expected", ""),
    )
    return {"epoch": info.epoch, "replaced": info.replaced, "handed_back": info.handed_back}


def end_session(call: Call) -> dict[str, Any]:
    """End the session of the ``X-Deviceq-Session`` header if it is still current (a clean
    daemon exit): ``{"ended": bool}``."""
    return {"ended": call.client().end_session()}


# -- protocol -------------------------------------------------------------------------------
def _device(d: dict[str, Any]) -> DeviceReport:
    tags = d.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise InvalidInput("a device's tags must be a list of strings")
    return DeviceReport(
        _str(d, "device_id"),
        _str(d, "driver_type"),
        tuple(tags),
        _str(d, "state", "idle"),  # type: ignore[arg-type]  # (checked by DeviceReport.args)
        _str(d, "reason", ""),
    )


def _row(d: dict[str, Any]) -> Row:
    if d.get("state") == GONE:
        return (validate_id(_str(d, "device_id"), "device id"), "", "", GONE, "")
    did, driver, tags, state, reason = _device(d).args()
    if d.get("attrs") is not None:  # (heartbeat.lua checks it)
        return (did, driver, tags, state, reason, _str(d, "attrs"))
    return (did, driver, tags, state, reason)


def heartbeat(call: Call) -> dict[str, Any]:
    """One heartbeat call (``lua/heartbeat.lua``): body ``{"mode": "delta"|"full"|"commit",
    "ver", "arg", "total", "devices": [{"device_id", "driver_type", "tags": [...],
    "state": "idle"|"busy"|"offline", "reason", "attrs"}]}`` (``attrs``, optional: the
    attributes' change, `deviceq.host.heartbeat_sync.attrs_text`; a delta's device the host
    no longer has:
    ``{"device_id", "state": "gone"}``); answers ``{"status": "ok"|"full"|"part"|"more",
    "devices", "idle", "draining", "stopping", "quarantined": [...]}``. A body without
    ``mode`` is a full snapshot (``devices`` only), sent to Redis in chunks."""
    if "mode" not in call.body:
        devices = [_device(d) for d in _objects(call.body, "devices")]
        reply = Reply("ok", call.client().heartbeat(devices, full=True))
    else:
        rows = [_row(d) for d in _objects(call.body, "devices")]
        reply = call.client().heartbeat_call(
            _str(call.body, "mode"),
            _str(call.body, "ver"),
            _str(call.body, "arg", ""),
            _int(call.body, "total", 0, 0, 1_000_000),
            rows,
        )
    hb = reply.heartbeat
    return {"status": reply.status, "devices": hb.devices, "idle": hb.idle,
            "draining": hb.draining, "stopping": hb.stopping,
            "quarantined": sorted(hb.quarantined)}  # fmt: skip


def _assignments(client: HostClient, max_count: int) -> list[dict[str, Any]]:
    return [a.model_dump(mode="json") for a in client.claim(max_count)]


def claim(call: Call) -> dict[str, Any]:
    """Claim up to ``max`` assignments from the host's inbox (body ``{"max": 1, "wait": 0}``):
    with ``wait`` seconds and an empty inbox, a long poll (bounded by the service's max wait)
    on the host's wake list, then a second claim. Answers ``{"assignments": [{"task": {...},
    "lease_id", "attempt", "device_id", "host_id", "lease_expires_at", "lease_ms"}]}``."""
    max_count = _int(call.body, "max", 1, 1, MAX_ITEMS)
    wait = call.block_seconds("wait")
    client = call.client()
    got = _assignments(client, max_count)
    if not got and wait > 0:
        call.blpop(call.ctx.keys.host_wake(call.host_id), wait)
        got = _assignments(client, max_count)
    return {"assignments": got}


def wait_for_work(call: Call) -> dict[str, Any]:
    """Long poll on the host's wake list until an assignment may be waiting (body
    ``{"timeout": SECONDS}``, bounded by the service's max wait): ``{"woken": bool}``. Token
    and session checked first."""
    seconds = call.block_seconds("timeout")
    call.authenticate(session=True)
    return {"woken": call.blpop(call.ctx.keys.host_wake(call.host_id), seconds) is not None}


def nudge(call: Call) -> dict[str, Any]:
    """Wake the host's own blocked inbox wait (its daemon is stopping): ``{"ok": true}``.
    Token checked."""
    call.authenticate(session=False)
    key = call.ctx.keys.host_wake(call.host_id)
    pipe = call.ctx.redis.pipeline(transaction=True)
    pipe.lpush(key, "stop")
    pipe.ltrim(key, 0, 0)  # (a wake list holds one hint, as the scripts keep it)
    pipe.execute()
    return {"ok": True}


def control(call: Call) -> dict[str, Any]:
    """Long poll on the host's control list (body ``{"timeout": SECONDS, "max": 16}``): the
    first message waited for, then the rest drained at once (LPOP with a count: a flood
    costs one answer), at most ``max`` of them answered, oldest pending last as stored.
    Answers ``{"messages": [...]}`` (empty after the timeout).
    Messages are hints (cancel, quarantine, superseded, removed, token rotated): act on what
    the next renew or heartbeat answers. Token and session checked first."""
    seconds = call.block_seconds("timeout")
    most = _int(call.body, "max", CTL_MAX, 1, CTL_MAX)
    call.authenticate(session=True)
    key = call.ctx.keys.host_ctl(call.host_id)
    first = call.blpop(key, seconds)
    if first is None:
        return {"messages": []}
    # the whole list goes with this wake-up (a flood costs one answer), at most `most` shown
    rest = call.ctx.redis.lpop(key, CTL_DRAIN)
    return {"messages": [first, *(str(m) for m in (rest or [])[: most - 1])]}


def renew(call: Call) -> dict[str, Any]:
    """Extend leases: body ``{"leases": [{"task_id", "lease_id"}]}``; answers ``{"renewals":
    [{"task_id", "status": "ok"|"cancel"|"lost", "expires_at", "reason", "lease_ms"}]}``."""
    leases = [(_str(x, "task_id"), _str(x, "lease_id")) for x in _objects(call.body, "leases")]
    out = call.client().renew(leases)
    return {"renewals": [{"task_id": r.task_id, "status": r.status, "expires_at": r.expires_at,
                          "reason": r.reason, "lease_ms": r.lease_ms} for r in out]}  # fmt: skip


def _report(x: dict[str, Any]) -> Report:
    kind = x.get("failure_kind")
    if kind is not None and not isinstance(kind, str):
        raise InvalidInput("failure_kind must be a string or null")
    return Report(
        _str(x, "task_id"),
        _str(x, "lease_id"),
        _str(x, "outcome"),
        kind or None,
        _str(x, "payload", ""),
    )


def _not_confirmed(exc: NotConfirmed) -> JSONResponse:
    """409 NOT_CONFIRMED with the answers of the applied write in ``error.result``."""
    return JSONResponse(
        {"error": {"code": exc.code, "message": str(exc).splitlines()[0],
                   "result": [str(a) for a in exc.result or []]}},
        status_code=409,
    )  # fmt: skip


def report(call: Call) -> dict[str, Any]:
    """End attempts: body ``{"reports": [{"task_id", "lease_id", "outcome":
    "done"|"failed"|"cancelled"|"released", "failure_kind", "payload"}]}``; answers
    ``{"answers": ["ok:STATUS"|"dup:STATUS"|"rejected:REASON", ...]}``. With the pool's
    durability set and the write not confirmed: 409 NOT_CONFIRMED with the answers in
    ``error.result`` (send the reports again: an applied one answers ``dup:``)."""
    reports = [_report(x) for x in _objects(call.body, "reports")]
    return {"answers": call.client().report_many(reports)}


def logs(call: Call) -> dict[str, Any]:
    """Append to the live logs of the host's running attempts: body ``{"chunks": [{"task_id",
    "lease_id", "stream": "stdout"|"stderr"|"log", "text", "final"}]}``; answers
    ``{"answers": ["ok"|"rejected:REASON", ...]}`` (``lua/log_append.lua``)."""
    chunks = [
        LogChunk(_str(x, "task_id"), _str(x, "lease_id"), _str(x, "stream"), _str(x, "text", ""),
                 _bool(x, "final", False))
        for x in _objects(call.body, "chunks")
    ]  # fmt: skip
    return {"answers": call.client().log_append(chunks)}


def _update(x: dict[str, Any]) -> ProgressUpdate:
    fraction = x.get("fraction")
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise InvalidInput("fraction must be a number from 0 to 1")
    try:
        return checked_update(
            ProgressUpdate(_str(x, "task_id"), _str(x, "lease_id"), fraction, _str(x, "text", ""))
        )
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def progress(call: Call) -> dict[str, Any]:
    """Record how far the host's running attempts are: body ``{"updates": [{"task_id",
    "lease_id", "fraction": 0..1, "text"}]}``; answers ``{"answers": ["ok"|"rejected:REASON",
    ...]}`` (``lua/progress.lua``). A fraction out of range or not a number: 400, nothing
    written."""
    updates = [_update(x) for x in _objects(call.body, "updates")]
    return {"answers": call.client().progress(updates)}


def _artifact(x: dict[str, Any]) -> tuple[str, int, str]:
    return _str(x, "name"), _int(x, "size", 0, 0, 1 << 62), _str(x, "sha256")


def artifacts(call: Call) -> dict[str, Any]:
    """Record the artifacts of one attempt this host ran.

    The files it uploaded to the artifact store and why an upload failed: body
    ``{"task_id", "attempt", "files": [{"name", "size", "sha256"}], "error"}``; answers
    ``{"recorded": N}`` (``lua/attempt_artifacts.lua``: by token, 401 AUTH for an attempt
    that is not this host's)."""
    files = [_artifact(x) for x in _objects(call.body, "files")]
    n = call.client().record_artifacts(
        _str(call.body, "task_id"), _int(call.body, "attempt", 0, 1, 9999), files,
        _str(call.body, "error", ""),
    )  # fmt: skip
    return {"recorded": n}


def release(call: Call) -> dict[str, Any]:
    """Hand an attempt back (queued again at once, keeping its place): body ``{"task_id",
    "lease_id", "reason"}``; answers ``{"answer": "ok:queued"|...}``."""
    answer = call.client().release(
        _str(call.body, "task_id"), _str(call.body, "lease_id"),
        _str(call.body, "reason", "handed back"),
    )  # fmt: skip
    return {"answer": answer}


def draining(call: Call) -> dict[str, Any]:
    """Mark the host's daemon stopping (``{"draining": true}``: no new assignments) or
    running again; answers ``{"result"}``."""
    return {"result": call.client().set_draining(_bool(call.body, "draining", True))}


# -- health checks --------------------------------------------------------------------------
def device_health_action(call: Call) -> dict[str, Any]:
    """A device health check step (path ``action``): ``begin`` (take the device for a check)
    and ``next`` (check it after its task) answer ``{"taken": bool}``; ``end`` (body
    ``{"healthy": bool, "output", "reason"}``) and ``clear`` answer ``{"health"}``."""
    did = validate_id(call.params["device_id"], "device id")
    action = call.params["action"]
    client = call.client()
    if action == "begin":
        return {"taken": client.health_begin(did)}
    if action == "next":
        return {"taken": client.health_next(did)}
    if action == "end":
        healthy = _bool(call.body, "healthy")
        output, reason = _str(call.body, "output", ""), _str(call.body, "reason", "")
        return {"health": client.health_end(did, healthy, output, reason)}
    if action == "clear":
        return {"health": client.health_clear(did)}
    raise NotFound(f"no health action {action[:20]!r}: use begin, next, end or clear")


def device_attributes(call: Call) -> dict[str, Any]:
    """Attribute changes of this host's devices: body ``{"entries": [[ID, NSET, NUNSET, KEY,
    ENCODED..., KEY...], ...]}`` (at most 100 entries, as ``device_attrs.lua`` takes them:
    it checks every value); answers ``{"changed": N}`` (devices whose attributes changed)."""
    entries = _items(call.body, "entries")
    if len(entries) > 100 or not all(
        isinstance(e, list) and len(e) <= 70 and all(isinstance(x, str) for x in e) for e in entries
    ):
        raise InvalidInput("entries: at most 100 lists of at most 70 strings")
    return {"changed": call.client().attributes_call(entries)}


def device_health(call: Call) -> dict[str, Any]:
    """The stored health of this host's devices: body ``{"device_ids": [...]}``; answers
    ``{"health": {ID: "healthy"|"unhealthy"|""}}`` ('' when never checked, not registered or
    another host's). Token checked."""
    ids = [validate_id(d, "device id") for d in _items(call.body, "device_ids")]
    call.authenticate(session=False)
    pipe = call.ctx.redis.pipeline(transaction=False)
    for d in ids:
        pipe.hmget(call.ctx.keys.device(d), "host_id", "health")
    rows = pipe.execute()
    return {"health": {d: str(h or "") if owner == call.host_id else ""
                       for d, (owner, h) in zip(ids, rows, strict=True)}}  # fmt: skip


# -- reads ----------------------------------------------------------------------------------
def config(call: Call) -> dict[str, Any]:
    """The pool's settings (stored values over the defaults), as ``deviceq config`` shows
    them; a daemon follows ``lease_ttl`` and ``host_timeout``. Token checked."""
    call.authenticate(session=False)
    return call.client().config().model_dump(mode="json")


def workflow(call: Call) -> dict[str, Any]:
    """A stored workflow definition (``{"name", "description", "steps"}``) a workflow task
    of this host refers to; 404 NOT_FOUND when there is none. Token checked."""
    name = validate_id(call.params["name"], "workflow name")
    call.authenticate(session=False)
    return call.client().get_workflow(name).model_dump(mode="json")


def task_parts(call: Call) -> dict[str, Any]:
    """The status of the other parts of a multi-device task whose part this host holds
    (its leader runs once they are all ``dispatched``): ``{"statuses": [...]}``; 404
    NOT_FOUND for a task this host does not hold. Token checked."""
    tid = validate_id(call.params["task_id"], "task id")
    call.authenticate(session=False)
    h: dict[str, str] = call.ctx.redis.hgetall(call.ctx.keys.task(tid))  # type: ignore[assignment]
    if not h or h.get("host_id") != call.host_id:
        raise NotFound(f"task {tid} is not held by host {call.host_id}")
    return {"statuses": call.client().part_statuses(ScheduledTask.from_hash(h))}


# -- routing --------------------------------------------------------------------------------
def _endpoint(ctx: ApiContext, handler: Handler) -> Callable[[Request], Any]:
    async def endpoint(request: Request) -> Response:
        try:
            host_id = validate_id(request.path_params["host_id"], "host id")
            token = _bearer(request)
            session = _session(request)
            params = {k: str(v) for k, v in request.path_params.items() if k != "host_id"}
            # the host's token first, whatever the call (a script checks it again): a wrong
            # token learns nothing from a body's validation or an empty batch
            gate = Call(ctx, host_id, token, session, {}, params)
            await run_in_threadpool(partial(gate.authenticate, session=False))
            body = await _json_body(request, ctx.max_body) if request.method != "GET" else {}
            call = Call(ctx, host_id, token, session, body, params)
            return JSONResponse(await run_in_threadpool(handler, call))
        except NotConfirmed as exc:
            return _not_confirmed(exc)
        except DeviceqError as exc:
            return from_exception(exc)
        except UNAVAILABLE as exc:
            LOG.warning("host call: Redis unreachable (%s)", type(exc).__name__)
            return error("UNAVAILABLE", "the pool's Redis is unreachable: try again")
        except redis.RedisError as exc:
            LOG.error("host call: Redis error (%s)", type(exc).__name__)
            return error("INTERNAL", "internal error", 500)

    endpoint.__name__ = handler.__name__
    endpoint.__qualname__ = handler.__name__
    endpoint.__doc__ = handler.__doc__
    return endpoint


ROUTES: list[tuple[str, str, Handler]] = [
    ("/hosts/{host_id}/session", "GET", get_session),
    ("/hosts/{host_id}/session", "POST", start_session),
    ("/hosts/{host_id}/session", "DELETE", end_session),
    ("/hosts/{host_id}/heartbeat", "POST", heartbeat),
    ("/hosts/{host_id}/claim", "POST", claim),
    ("/hosts/{host_id}/wait", "POST", wait_for_work),
    ("/hosts/{host_id}/nudge", "POST", nudge),
    ("/hosts/{host_id}/control", "POST", control),
    ("/hosts/{host_id}/renew", "POST", renew),
    ("/hosts/{host_id}/report", "POST", report),
    ("/hosts/{host_id}/release", "POST", release),
    ("/hosts/{host_id}/logs", "POST", logs),
    ("/hosts/{host_id}/progress", "POST", progress),
    ("/hosts/{host_id}/artifacts", "POST", artifacts),
    ("/hosts/{host_id}/draining", "POST", draining),
    ("/hosts/{host_id}/devices/health", "POST", device_health),
    ("/hosts/{host_id}/devices/attributes", "POST", device_attributes),
    ("/hosts/{host_id}/devices/{device_id}/health/{action}", "POST", device_health_action),
    ("/hosts/{host_id}/config", "GET", config),
    ("/hosts/{host_id}/workflows/{name}", "GET", workflow),
    ("/hosts/{host_id}/tasks/{task_id}/parts", "GET", task_parts),
]
"""Path, method and handler of every host route (relative to ``/api/v1``)."""


def host_routes(ctx: ApiContext) -> list[BaseRoute]:
    """The routes of the host protocol, relative to ``/api/v1``."""
    return [
        Route(path, _endpoint(ctx, handler), methods=[method], name=f"host_{handler.__name__}")
        for path, method, handler in ROUTES
    ]
