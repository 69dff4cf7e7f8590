"""The producer client over HTTP: `ApiClient` talks to a ``deviceq api`` service instead of
Redis, with the producer methods of `deviceq.producer.Client` that the HTTP protocol has
(``submit``, ``submit_many``, ``get``, ``list``, ``cancel``, ``retry``, ``wait``,
``events``), an attempt's live log (``logs``) and artifacts (``artifacts``,
``download_artifact``), returning the same model types and raising the same typed errors.

Standard library only (``urllib``, ``ssl``; requests go through `deviceq.core.http`, the
transport the host's link uses too): a producer needs neither Redis credentials nor the
server's web stack."""

from __future__ import annotations

import builtins
import hashlib
import http.client
import json
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ..core.errors import _BY_CODE, InvalidInput
from ..core.events import RENAMED, Event
from ..core.http import API_PREFIX, ApiError, HttpTransport
from ..core.live_logs import LogEntry
from ..core.models import ScheduledTask, TaskSpec
from ..core.validation import validate_id
from .interface import Producer, task_specs

WAIT_STEP = 30.0
"""Seconds one long poll of `ApiClient.wait` asks for (the server may cap it lower)."""
SLACK = 15.0
"""Seconds a request may take beyond the long poll it asks for."""


def _raise_for(status: int, payload: bytes) -> None:
    try:
        err = json.loads(payload)["error"]
        code, message = str(err["code"]), str(err["message"])
    except (ValueError, KeyError, TypeError):
        code, message = "UNAVAILABLE", f"HTTP {status} without a deviceq error body"
    cls = _BY_CODE.get(code)
    if cls is not None:
        raise cls(message)
    raise ApiError(code, message, status)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json", exclude_none=True)
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def _spec_json(spec: TaskSpec | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(spec, TaskSpec):
        return spec.model_dump(mode="json", exclude_defaults=True)
    if not isinstance(spec, Mapping):
        raise InvalidInput(
            f"a task spec must be a TaskSpec or a mapping (dict), not {type(spec).__name__}"
        )
    return {k: _jsonable(v) for k, v in spec.items() if v is not None}


def event_from_json(data: Mapping[str, Any]) -> Event:
    """An `Event` from its JSON form (`Event.as_dict`): the stream's own field names and
    string values again."""
    back = {v: k for k, v in RENAMED.items()}
    fields = {
        back.get(k, k): "" if v is None else str(v)
        for k, v in data.items()
        if k not in ("id", "type", "time_ms")
    }
    return Event(id=str(data["id"]), type=str(data["type"]), fields=fields)


class ApiClient(HttpTransport, Producer):
    """Producer-side client of the pool a ``deviceq api`` service serves.

    >>> client = ApiClient("https://deviceq.lab:8300", token="dqa_...", ca="ca.pem")
    >>> task_id = client.submit("open the settings app", driver_type="android")
    >>> client.wait(task_id, timeout=60).status

    ``url``: the service (``http(s)://HOST:PORT``, with or without ``/api/v1``); ``token``:
    an API token (``deviceq api token add``; default: env ``DEVICEQ_API_TOKEN``); ``ca``: a
    PEM CA bundle that verifies the service's certificate (default: the system's CAs).

    Requests reuse one connection per thread (HTTP keep-alive; not through a proxy of the
    environment's ``http(s)_proxy``, which gets a connection per request)."""

    keep_alive = True
    """Reuse one connection per thread instead of one per request (dropped after any error
    and when idle for `deviceq.core.http.IDLE_REUSE` seconds); the event stream always has
    its own. A reused connection the server closed meanwhile gets a GET once more; a POST
    is not sent again (it might have been served: it is UNAVAILABLE, as any outage)."""

    def __init__(self, url: str, token: str | None = None, ca: str | None = None) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise InvalidInput(f"not an http(s):// URL of a deviceq api service: {url[:80]!r}")
        token = token if token is not None else os.environ.get("DEVICEQ_API_TOKEN")
        if not token or any(c.isspace() for c in token):
            raise InvalidInput(
                "an API token is needed (token=..., --api-token-file or DEVICEQ_API_TOKEN)"
            )
        base = url.rstrip("/")
        self.url = base if base.endswith(API_PREFIX) else base + API_PREFIX
        self._token = token
        tls = ssl.create_default_context(cafile=ca) if parts.scheme == "https" else None
        super().__init__(parts.netloc, tls)
        self._path = urllib.parse.urlsplit(self.url).path
        proxies = urllib.request.getproxies()
        self._proxied = parts.scheme in proxies and not urllib.request.proxy_bypass(
            parts.hostname or ""
        )

    def __repr__(self) -> str:
        return f"ApiClient({self.url!r})"  # never the token

    # -- transport ------------------------------------------------------------------------
    def _request(
        self, path: str, query: Iterable[tuple[str, Any]], body: Any
    ) -> tuple[str, bytes | None, dict[str, str]]:
        """A request's path and query (under ``/api/v1``), body and headers."""
        qs = urllib.parse.urlencode([(k, v) for k, v in query if v is not None])
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        return path + (f"?{qs}" if qs else ""), data, headers

    def _open(
        self,
        method: str,
        path: str,
        query: Iterable[tuple[str, Any]] = (),
        body: Any = None,
        timeout: float = SLACK,
    ) -> Any:
        target, data, headers = self._request(path, query, body)
        req = urllib.request.Request(self.url + target, data=data, method=method, headers=headers)
        try:
            return urllib.request.urlopen(req, timeout=timeout, context=self._ssl)
        except urllib.error.HTTPError as exc:
            with exc:
                _raise_for(exc.code, exc.read())
            raise  # not reached: _raise_for always raises
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ApiError("UNAVAILABLE", f"cannot reach {self.url}: {reason}") from None

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        if self.keep_alive and not self._proxied:
            return self._kept_alive(method, path, **kwargs)
        with self._open(method, path, **kwargs) as resp:
            return json.loads(resp.read())

    def _kept_alive(
        self,
        method: str,
        path: str,
        query: Iterable[tuple[str, Any]] = (),
        body: Any = None,
        timeout: float = SLACK,
    ) -> Any:
        """`_call` on this thread's kept-alive connection (the same answers and errors)."""
        target, data, headers = self._request(path, query, body)
        try:
            status, payload = self.exchange(
                method, self._path + target, data, headers, timeout, resend_stale=method == "GET"
            )
        except (OSError, http.client.HTTPException) as exc:
            raise ApiError("UNAVAILABLE", f"cannot reach {self.url}: {exc}") from None
        if not 200 <= status < 300:
            _raise_for(status, payload)
        return json.loads(payload)

    def close(self) -> None:
        """Close this thread's kept-alive connection (a later call opens a new one)."""
        self.close_own()

    # -- producer methods -------------------------------------------------------------------
    def submit(self, goal: str | None = None, **fields: Any) -> str:
        """Enqueue one task and return its id (the keywords of `Client.submit`)."""
        spec = {"goal": goal, **fields}
        if "tags" in spec and not isinstance(spec["tags"], str):
            spec["tags"] = builtins.list(spec["tags"])
        if isinstance(spec.get("retry_on"), list | tuple | set | frozenset):
            spec["retry_on"] = builtins.list(spec["retry_on"])
        answer = self._call("POST", "/tasks", body=_spec_json(spec))
        _warn(answer)
        return str(answer["id"])

    def submit_many(self, specs: Iterable[TaskSpec | Mapping[str, Any]]) -> builtins.list[str]:
        """Enqueue many tasks in one request (all validated before any is written)."""
        body = {"tasks": [_spec_json(s) for s in task_specs(specs)]}
        answer = self._call("POST", "/tasks/batch", body=body)
        _warn(answer)
        return [str(i) for i in answer["ids"]]

    def get(self, task_id: str) -> ScheduledTask:
        """The task with its attempt history. Raises NotFound."""
        validate_id(task_id, "task id")
        return ScheduledTask.model_validate(self._call("GET", f"/tasks/{task_id}"))

    def list(
        self,
        status: str | None = None,
        *,
        limit: int = 100,
        driver_type: str | None = None,
        tags: Iterable[str] = (),
        host_id: str | None = None,
        device_id: str | None = None,
        tenant: str | None = None,
    ) -> builtins.list[ScheduledTask]:
        """Tasks (of one status, and matching the filters given), at most ``limit``."""
        if isinstance(tags, str):
            raise InvalidInput("tags must be a list of tags, not one str")
        query: builtins.list[tuple[str, Any]] = [
            ("status", None if status is None else str(status)),
            ("limit", limit),
            ("driver_type", driver_type),
            ("host", host_id),
            ("device", device_id),
            ("tenant", tenant),
            *(("tag", t) for t in tags),
        ]
        data = self._call("GET", "/tasks", query=query)
        return [ScheduledTask.model_validate(t) for t in data["tasks"]]

    def cancel(self, task_id: str, reason: str = "cancelled by user") -> str:
        """Cancel a task: ``cancelled``, ``requested`` or ``already:STATUS``."""
        validate_id(task_id, "task id")
        data = self._call("POST", f"/tasks/{task_id}/cancel", body={"reason": reason})
        return str(data["answer"])

    def retry(self, task_id: str) -> str:
        """Submit a failed or cancelled task again; returns the new id."""
        validate_id(task_id, "task id")
        return str(self._call("POST", f"/tasks/{task_id}/retry", body={})["id"])

    def wait(self, task_id: str, timeout: float | None = None) -> ScheduledTask:
        """Block until the task is terminal and return it (long polls of the service);
        raises TimeoutError after ``timeout`` seconds."""
        validate_id(task_id, "task id")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = WAIT_STEP if deadline is None else deadline - time.monotonic()
            step = max(0.001, min(WAIT_STEP, step))
            data = self._call("GET", f"/tasks/{task_id}/wait", query=[("timeout", f"{step:.3f}")],
                              timeout=step + SLACK)  # fmt: skip
            task = ScheduledTask.model_validate(data["task"])
            if data["terminal"]:
                return task
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"task {task_id} is still {task.status.value}")

    def events(
        self, since: str = "0-0", *, task: str | None = None, follow: bool = False
    ) -> Iterator[Event]:
        """Transitions from the pool's event stream (Server-Sent Events), oldest first;
        ``follow`` keeps reading new ones (reconnecting after each bounded stream)."""
        if task is not None:
            validate_id(task, "task id")
        cursor = since
        while True:
            query = [("since", cursor), ("task", task), ("follow", "1" if follow else "0"),
                     ("timeout", WAIT_STEP)]  # fmt: skip
            got = False
            for e in self._sse(query):
                cursor, got = e.id, True
                yield e
            if not follow and not got:
                return
            if not follow:
                continue  # the stream ended at its count limit: read on

    def _sse(self, query: builtins.list[tuple[str, Any]]) -> Iterator[Event]:
        for _kind, _id, data in self._stream("/events", query):
            yield event_from_json(data)

    def _stream(
        self, path: str, query: builtins.list[tuple[str, Any]]
    ) -> Iterator[tuple[str, str, Any]]:
        """The (event type, id, JSON data) of each Server-Sent Event of one stream."""
        with self._open("GET", path, query=query, timeout=WAIT_STEP + SLACK) as resp:
            kind, event_id, data = "message", "", []
            for raw in resp:
                line = raw.decode("utf-8").rstrip("\r\n")
                if line.startswith("data:"):
                    data.append(line[5:].lstrip())
                elif line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("id:"):
                    event_id = line[3:].strip()
                elif not line and data:
                    yield kind, event_id, json.loads("\n".join(data))
                    kind, event_id, data = "message", "", []

    def logs(
        self,
        task_id: str,
        attempt: int | None = None,
        follow: bool = False,
        *,
        timeout: float | None = None,
    ) -> Iterator[LogEntry]:
        """An attempt's live log (default: the task's latest attempt), oldest chunk first,
        as ``deviceq task logs`` reads it; ``follow`` keeps reading new chunks until the
        attempt has ended (reconnecting after each bounded stream), raising TimeoutError
        after ``timeout`` seconds."""
        validate_id(task_id, "task id")
        if attempt is None:
            attempt = max(1, self.get(task_id).attempt)  # pinned: a retry starts another
        elif isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 1:
            raise InvalidInput("attempt must be 1 or more")
        cursor = "0-0"
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = WAIT_STEP if deadline is None else deadline - time.monotonic()
            if step <= 0:
                raise TimeoutError(f"attempt {attempt} of task {task_id} is still running")
            query = [("attempt", attempt), ("since", cursor), ("follow", "1" if follow else "0"),
                     ("timeout", f"{max(0.001, min(WAIT_STEP, step)):.3f}")]  # fmt: skip
            got, began = False, time.monotonic()
            for kind, event_id, data in self._stream(f"/tasks/{task_id}/logs", query):
                if kind == "end":
                    return
                if kind == "log":
                    cursor, got = event_id, True
                    yield LogEntry(event_id, int(data["time_ms"]), str(data["stream"]),
                                   str(data["text"]))  # fmt: skip
            if not follow and not got:
                return
            if not got and time.monotonic() - began < 1.0:
                time.sleep(1.0)  # ended at once, with nothing (the service's Redis is down)

    def artifacts(self, task_id: str, attempt: int | None = None) -> dict[str, Any]:
        """The files an attempt kept (default: the latest attempt): ``{"task_id",
        "attempt", "artifacts": [{"name", "size", "sha256"}], "artifacts_error"}``.
        Raises NotFound without the task or the attempt."""
        validate_id(task_id, "task id")
        out: dict[str, Any] = self._call("GET", f"/tasks/{task_id}/artifacts",
                                         query=[("attempt", attempt)])  # fmt: skip
        return out

    def download_artifact(self, task_id: str, attempt: int, name: str, into: str | Path
                          ) -> Path:  # fmt: skip
        """Download one recorded file of an attempt to ``into/NAME`` (folders made; a name
        that would land outside ``into`` refused), checked against its recorded sha256
        (InvalidInput on a mismatch: nothing is left). Returns the file's path."""
        validate_id(task_id, "task id")
        root = Path(into).resolve()
        dest = (root / name).resolve()
        if root not in dest.parents:
            raise InvalidInput(f"artifact name {name[:80]!r} escapes {root}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".part")
        path = f"/tasks/{task_id}/artifacts/{int(attempt)}/{urllib.parse.quote(name, safe='/')}"
        h = hashlib.sha256()
        try:
            with self._open("GET", path, timeout=WAIT_STEP + SLACK) as resp, open(tmp, "wb") as f:
                want = resp.headers.get("x-deviceq-sha256", "")
                while chunk := resp.read(1 << 20):
                    h.update(chunk)
                    f.write(chunk)
        except (OSError, http.client.HTTPException) as exc:
            tmp.unlink(missing_ok=True)
            why = f"the download of {name} from {self.url} was cut: {exc}"
            raise ApiError("UNAVAILABLE", why) from None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        if h.hexdigest() != want:
            tmp.unlink(missing_ok=True)
            raise InvalidInput(f"{name}: sha256 {h.hexdigest()} does not match the record")
        os.replace(tmp, dest)
        return dest


def _warn(answer: Any) -> None:
    """The API's ``warnings`` of a submission, as `Client` gives them (`PriorityIgnored`)."""
    import warnings

    from ..core.connection import PriorityIgnored

    for line in answer.get("warnings") or () if isinstance(answer, dict) else ():
        warnings.warn(PriorityIgnored(str(line)), stacklevel=3)
