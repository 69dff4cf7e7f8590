"""The producer client: submit, inspect, cancel and wait for tasks; store workflows (a
submission is checked and encoded by `submission`, a filter is run by `task_filter`)."""

from __future__ import annotations

import builtins
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from functools import partial
from typing import Any

import redis
from pydantic import ValidationError

from ..core import tracing
from ..core.bounds import SUBMIT_CALL_US, SUBMIT_MOST_TASKS
from ..core.connection import warn_if_ignored
from ..core.durability import mode_of, run_durably
from ..core.errors import InvalidInput, NotConfirmed, NotFound, QueueFull
from ..core.events import Event, last_event_id, read_events
from ..core.fleet import read_parts
from ..core.models import Role, ScheduledTask, TaskSpec, WorkflowDefinition
from ..core.priority_classes import resolve_classes
from ..core.task_record import read_task, with_goal
from ..core.validation import actor_args, check_text, validate_id
from ..core.vocabulary import TaskStatus
from .interface import Producer, task_specs
from .submission import (
    check_int,
    chunk_end,
    declared_cost_us,
    first_error,
    items_args,
    not_before_of,
    spec_from,
    submit_pacer,
    task_items,
)
from .suite_client import SuiteMethods
from .task_filter import FIND_MAX_SCAN, FindResult, TaskFilter, find_tasks

__all__ = ["SUBMIT_CHUNK", "Client", "api_url_of"]

SUBMIT_CHUNK = SUBMIT_MOST_TASKS  # tasks per submit.lua call at most (125; fewer by their cost)


def api_url_of(redis_or_url: redis.Redis | str | None) -> str | None:
    """The HTTP API URL a `Client` is made for: ``redis_or_url`` when it is ``http(s)://``,
    else env ``DEVICEQ_API_URL`` when no Redis is named at all; None for Redis."""
    if isinstance(redis_or_url, str):
        return redis_or_url if redis_or_url.lower().startswith(("http://", "https://")) else None
    return os.environ.get("DEVICEQ_API_URL") or None if redis_or_url is None else None


class Client(SuiteMethods, Producer):
    """Producer-side client of one pool.

    >>> client = Client("redis://localhost:6379/0", pool="default")
    >>> task_id = client.submit("open the settings app", driver_type="android", tags=["wifi"])
    >>> client.wait(task_id, timeout=60).status

    Given an ``http(s)://`` URL of a ``deviceq api`` service (or, with no URL, env
    ``DEVICEQ_API_URL``), ``Client(url, token=..., ca=...)`` is a
    `deviceq.producer.http_client.ApiClient` instead: the same producer methods over HTTP, no Redis
    credentials needed (``token`` defaults to env ``DEVICEQ_API_TOKEN``; ``pool`` is the
    service's)."""

    def __new__(
        cls,
        redis_or_url: redis.Redis | str | None = None,
        pool: str | None = None,
        *,
        token: str | None = None,
        ca: str | None = None,
        otel_endpoint: str | None = None,
    ) -> Client:
        tracing.setup(otel_endpoint, "deviceq-producer")  # (off without it and the env var)
        url = api_url_of(redis_or_url)
        if url is not None and cls is Client:
            from .http_client import ApiClient

            return ApiClient(url, token, ca)  # type: ignore[return-value]
        return super().__new__(cls)

    def __init__(
        self,
        redis_or_url: redis.Redis | str | None = None,
        pool: str | None = None,
        *,
        token: str | None = None,
        ca: str | None = None,
        otel_endpoint: str | None = None,  # (taken by __new__: deviceq.core.tracing)
    ) -> None:
        if token is not None or ca is not None:
            raise InvalidInput("token and ca are for the http(s):// URL of a deviceq api")
        super().__init__(redis_or_url, pool)

    # -- submission -------------------------------------------------------------------------
    def submit(
        self,
        goal: str | None = None,
        *,
        workflow: str | None = None,
        driver_type: str | None = None,
        tags: Iterable[str] = (),
        priority: int = 0,
        max_attempts: int | None = None,
        idempotency_key: str | None = None,
        queue_timeout: float | None = None,
        timeout: float | None = None,
        reject_unmatched: bool | None = None,
        retry_on: str | Iterable[str] | None = None,
        retry_backoff: str | None = None,
        tenant: str | None = None,
        roles: Mapping[str, Role | Mapping[str, Any] | str] | None = None,
        not_before: float | None = None,
        delay: float | None = None,
        priority_class: str | None = None,
        where: str | Iterable[str] = (),
    ) -> str:
        """Enqueue one task (a goal or a workflow name) and return its id at once.

        ``not_before`` (a Unix time, seconds) or ``delay`` (seconds from now): the task is
        queued but not assigned before then (at most a year ahead); its ``queue_timeout``
        counts from then.

        Raises InvalidInput for bad input, NotFound for an unknown workflow, QueueFull when the
        pool already holds ``max_queue_depth`` queued tasks. With ``idempotency_key``, a retried
        submission returns the first task's id instead of creating a copy. With
        ``reject_unmatched`` (default: the pool setting ``reject_unmatchable``) a task that no
        registered device could ever run raises Unmatchable; otherwise it waits queued
        (``queue_timeout`` seconds at most, when given).

        ``timeout`` (seconds, 0.001 to 7 days) is the longest a run of this task may take: its
        host stops it then and the task fails with ``timeout``. The host's ``--task-timeout``,
        when smaller, still wins. A timeout of a task with a timeout of its own never counts
        against the device (one of a task without, at the host's limit, does). Not for a task
        with ``roles``.

        ``retry_on`` (failure kinds, as a list or csv, or ``"none"``) and ``retry_backoff``
        (``none``, ``fixed:SECONDS`` or ``exponential:BASE:MAX``) override the pool's retry
        policy for this task: after a failure of a listed kind, with attempts left, the task
        is queued again once its backoff has passed, preferring another device and host.
        ``tenant`` names who the task is for: the pool's per-tenant weights and device caps
        (`PoolAdmin.set_tenant`) apply to it under the ``fair_share`` strategy.

        ``roles`` makes a multi-device task: role name -> constraints (a `Role`, a mapping
        with ``driver_type`` and ``tags``, or ``"DRIVER[:TAG,TAG]"``), at most 8, the first
        being the leader. The scheduler places every role at once on a device of its own (any
        host) or none; each role runs as part task ``ID.ROLE`` on its device's host; the
        leader's runner runs the goal once every part is claimed and gets the other roles'
        devices (``task.roles``); the others hold their device meanwhile. Losing any part
        ends the attempt for all. Such a task has no ``driver_type``, ``tags`` or ``tenant``
        of its own.

        ``priority_class`` names a priority class (`PoolAdmin.add_priority_class`): the task
        gets its priority and, as the class says, may preempt a running task of a lower
        priority or be preempted by a higher one. NotFound for an unknown class.
        ``where``: expressions over the device's attributes, all of which must hold
        (``["sdk>=33", "model in (Pixel 7, Pixel 8)", "has(gps)"]``; one str is one
        expression; the language: `deviceq.core.where`). Not for a task with ``roles``: a role
        carries its own (``{"phone": {"driver_type": "android", "where": ["sdk>=33"]}}``, or
        ``"android:sim where sdk>=33"``)."""
        spec = spec_from(
            {
                "goal": goal,
                "workflow": workflow,
                "driver_type": driver_type,
                "tags": tags,  # a bare str is refused, not split into characters
                "priority": priority,
                "max_attempts": max_attempts,
                "idempotency_key": idempotency_key,
                "queue_timeout": queue_timeout,
                "timeout": timeout,
                "reject_unmatched": reject_unmatched,
                "retry_on": retry_on,
                "retry_backoff": retry_backoff,
                "tenant": tenant,
                "priority_class": priority_class,
                "roles": dict(roles) if roles is not None else None,
                "not_before": not_before_of(not_before, delay, self._server_time_s),
                "where": where,
            }
        )
        return self.submit_many([spec])[0]

    def submit_many(
        self, specs: Iterable[TaskSpec | Mapping[str, Any]], chunk: int = SUBMIT_CHUNK
    ) -> list[str]:
        """Enqueue many tasks; returns their ids in order. Every spec is validated before
        anything is written. The tasks go in chunks, each one atomic ``submit.lua`` call (all
        of its tasks submitted, or none): at most ``chunk`` tasks (default and most useful:
        125) and at most 2.5 ms of Redis time a call by each task's declared cost
        (`deviceq.core.bounds`: 20 µs a task, 30 ns a byte of its text, 75 ns a byte of its
        list of tests), so no call holds Redis for long whatever the batch: 125 tasks a
        call at most (~120 short tasks), 4 with 16 KiB goals, a task with a list of tests
        over ~16 KB alone. The first call carries half that; each call's measured time sizes
        the next (`submit_pacer`): on a machine slower than the declared costs assume, the
        calls carry fewer tasks. So a QueueFull error leaves earlier chunks submitted and the
        failing chunk unwritten; it carries the ids queued before it in ``queued_ids``. With the
        pool's ``durability`` set, each chunk is confirmed durable; if it cannot be, the call raises
        NotConfirmed whose ``result`` holds the ids submitted so far (resubmit with the same
        idempotency keys to be safe)."""
        specs = task_specs(specs)
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise InvalidInput(f"chunk must be a positive int, got {chunk!r}")
        validated = resolve_classes(self.redis, self.keys, [spec_from(s) for s in specs])
        items = task_items(validated)
        ids: list[str] = []
        pacer = submit_pacer(self)
        start = 0
        while start < len(items):
            budget = pacer.next_size(SUBMIT_CALL_US, SUBMIT_CALL_US)
            end = chunk_end(items, start, chunk, budget)
            # (full: the next task did not fit the budget; the caller's chunk cap proves less)
            full = end < len(items) and end - start < chunk
            part, start = items[start:end], end
            spans = tracing.current().submits(len(part), self.pool)  # (no-op unless traced)
            for item, tp in zip(part, spans.traceparents or (), strict=False):
                item["traceparent"] = tp or None
            args = items_args(part)
            sent = time.perf_counter()
            try:
                flat = spans.run(partial(run_durably, self, "submit", args))
            except NotConfirmed as exc:
                flat = exc.result or []
                ids += [flat[i] for i in range(0, len(flat), 2)]
                exc.result = ids
                raise
            except QueueFull as exc:
                exc.queued_ids = list(ids)
                raise
            if mode_of(self)[0] == "none":  # (a durable call's time is mostly the replica's)
                pacer.record(declared_cost_us(part), time.perf_counter() - sent, full)
            ids += [flat[i] for i in range(0, len(flat), 2)]
        if self.priority_warnings and any(
            s.priority and not s.retry_of and not s.priority_class for s in validated
        ):
            warn_if_ignored(self.redis, self.keys)  # (PriorityIgnored)
        return ids

    # -- inspection ---------------------------------------------------------------------------
    def get(self, task_id: str, *, attempts: bool = True) -> ScheduledTask:
        """The task with its attempt history. Raises NotFound."""
        validate_id(task_id, "task id")
        found = read_task(self.redis, self.keys, task_id, attempts=attempts)
        if found is None:
            raise NotFound(f"no task {task_id} in pool {self.pool}")
        task = ScheduledTask.from_hash(*found)
        if found[0].get("roles"):  # a multi-device task: how each part is doing
            read_parts(self, task)
        return task

    def get_many(self, task_ids: Iterable[str]) -> list[ScheduledTask]:
        """Tasks by id, in order, skipping ids that no longer exist (one round trip)."""
        if isinstance(task_ids, str | bytes):
            raise InvalidInput("get_many takes a list of task ids, not one id")
        ids = [validate_id(t, "task id") for t in task_ids]
        pipe = self.redis.pipeline(transaction=False)
        for t in ids:
            pipe.hgetall(self.keys.task(t))
            pipe.get(self.keys.goal(t))
        res = pipe.execute()
        return [
            ScheduledTask.from_hash(with_goal(h, goal))
            for h, goal in zip(res[::2], res[1::2], strict=True)
            if h
        ]

    def list(
        self, status: TaskStatus | str | None = None, *, limit: int = 100, offset: int = 0
    ) -> list[ScheduledTask]:
        """Tasks of one status (all statuses when None): queued and active ones oldest first,
        terminal ones newest first. ``limit`` >= 1 and ``offset`` >= 0 (else InvalidInput)."""
        check_int("limit", limit, 1)
        check_int("offset", offset, 0)
        if status is None:
            statuses = list(TaskStatus)
        else:
            try:
                statuses = [TaskStatus(status)]
            except ValueError:
                raise InvalidInput(
                    f"unknown status {status!r}; one of: " + ", ".join(TaskStatus)
                ) from None
        ids: list[str] = []
        for st in statuses:
            key = self.keys.status(st.value)
            if st.terminal:
                ids += [str(x) for x in self.redis.zrevrange(key, offset, offset + limit - 1)]
            else:
                ids += [str(x) for x in self.redis.zrange(key, offset, offset + limit - 1)]
            if len(ids) >= limit:
                break
        return self.get_many(ids[:limit])

    def find(
        self,
        flt: TaskFilter,
        *,
        limit: int = 1000,
        max_scan: int = FIND_MAX_SCAN,
    ) -> FindResult:
        """Tasks matching ``flt`` (at most ``limit``), read from the status indexes in pages of
        ``FIND_PAGE`` ids (never a SCAN of the keyspace), examining at most ``max_scan`` index
        entries in all: queued and active statuses oldest first, terminal ones newest first
        (like `list`). Where the index order allows it, a status is left early (an active
        task submitted after ``submitted_before``, a terminal one finished before
        ``submitted_after``: the rest cannot match)."""
        return find_tasks(self.redis, self.keys, self.get_many, flt, limit=limit, max_scan=max_scan)

    def counts(self) -> dict[str, int]:
        """Number of tasks per status (terminal ones within the retention window)."""
        pipe = self.redis.pipeline(transaction=False)
        for st in TaskStatus:
            pipe.zcard(self.keys.status(st.value))
        return {st.value: int(n) for st, n in zip(TaskStatus, pipe.execute(), strict=True)}

    # -- control ------------------------------------------------------------------------------
    def cancel(self, task_id: str, reason: str = "cancelled by user", by: str = "") -> str:
        """Cancel a task. Returns ``cancelled`` (ended now: it was queued or not yet claimed),
        ``requested`` (running: its host stops it and reports) or ``already:STATUS``. ``by``
        (an id, '' = not recorded): who cancels it, the ``by`` field of the event."""
        validate_id(task_id, "task id")
        check_text(reason, "reason")
        return str(self._run("cancel", [task_id, reason[:500], *actor_args(by)]))

    def cancel_many(
        self, task_ids: Iterable[str], reason: str = "cancelled by user", by: str = ""
    ) -> dict[str, str]:
        """Cancel several tasks (each through the same atomic cancel script as `cancel`).
        Every id is validated and must exist before any is cancelled (InvalidInput /
        NotFound, nothing changed). Returns ``{task_id: answer}`` in the given order, each
        answer as `cancel` returns it (``cancelled``, ``requested`` or ``already:STATUS``)."""
        ids = self._existing_ids(task_ids, "cancel_many")
        check_text(reason, "reason")
        actor_args(by)  # checked before the first is cancelled
        return {t: self.cancel(t, reason, by) for t in ids}

    def wait_many(
        self, task_ids: Iterable[str], timeout: float | None = None
    ) -> builtins.list[ScheduledTask]:
        """Block until every task is terminal; return them in the given order. Raises
        NotFound (before waiting) for an unknown id and TimeoutError after ``timeout``
        seconds when some are still unfinished (its message counts them). Blocks on the
        pool's event stream (XREAD BLOCK) and re-reads only the tasks still pending, in one
        round trip, when one of them has an event."""
        ids = self._existing_ids(task_ids, "wait_many")
        deadline = None if timeout is None else time.monotonic() + timeout
        cursor = last_event_id(self.redis, self.keys)
        finished: dict[str, ScheduledTask] = {}
        pending = builtins.list(dict.fromkeys(ids))
        while True:
            for t in self.get_many(pending):
                if t.status.terminal:
                    finished[t.id] = t
            pending = [t for t in pending if t not in finished]
            if not pending:
                return [finished[t] for t in ids]
            remaining = 5.0 if deadline is None else min(5.0, deadline - time.monotonic())
            if remaining <= 0:
                raise TimeoutError(
                    f"{len(pending)} of {len(set(ids))} task(s) still unfinished: "
                    + " ".join(pending[:10])
                    + (" ..." if len(pending) > 10 else "")
                )
            waiting = set(pending)
            cursor, events = read_events(
                self.redis, self.keys, cursor, block_ms=max(1, int(remaining * 1000))
            )
            while events and not any(e.task in waiting for e in events):
                cursor, events = read_events(self.redis, self.keys, cursor, block_ms=None)

    def retry(self, task_id: str, rerun: bool = False, by: str = "") -> str:
        """Submit a failed or cancelled task again as a new task (same goal or workflow,
        constraints or roles, priority, max_attempts, timeout, tenant and retry policy); returns the
        new id. ``rerun``: a done task too (run a passing test again, to check a flaky one).
        The new task's ``retry_of`` is the old one's id; the old task's ``rerun_by`` becomes
        the new one's (nothing else of it changes). ``by`` (an id, '' = not recorded): who
        retries it, the new task's ``submitted_by`` and its submitted event's ``by``. Raises
        NotFound, or InvalidInput if the task is not failed or cancelled (or done, with
        ``rerun``)."""
        old = self.get(task_id, attempts=False)
        if old.gang:
            raise InvalidInput(
                f"task {task_id} is a part of multi-device task {old.gang}: retry that"
            )
        allowed = (TaskStatus.failed, TaskStatus.cancelled) + ((TaskStatus.done,) if rerun else ())
        if old.status not in allowed:
            hint = " (a done task with --rerun)" if old.status == TaskStatus.done else ""
            raise InvalidInput(
                f"task {task_id} is {old.status.value}: only failed or cancelled tasks can be "
                f"retried{hint}"
            )
        spec = spec_from(
            {
                "goal": old.goal if old.kind == "goal" else None,
                "workflow": old.workflow if old.kind == "workflow" else None,
                "driver_type": old.driver_type,
                "tags": old.tags,
                "priority": old.priority,
                "max_attempts": old.max_attempts,
                "timeout": old.timeout,
                "tenant": old.tenant,
                "retry_on": old.retry_on,
                "retry_backoff": old.retry_backoff,
                "roles": {n: Role(driver_type=r.driver_type, tags=r.tags, where=r.where)
                          for n, r in old.roles.items()} if old.roles else None,
                "retry_of": task_id,
                "by": by or None,
            }
        )  # fmt: skip
        return self.submit_many([spec])[0]

    def _existing_ids(self, task_ids: Iterable[str], what: str) -> builtins.list[str]:
        if isinstance(task_ids, str | bytes):
            raise InvalidInput(f"{what} takes a list of task ids, not one id")
        ids = [validate_id(t, "task id") for t in task_ids]
        pipe = self.redis.pipeline(transaction=False)
        for t in ids:
            pipe.exists(self.keys.task(t))
        missing = [t for t, n in zip(ids, pipe.execute(), strict=True) if not n]
        if missing:
            raise NotFound(
                f"no task {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''} "
                f"in pool {self.pool}"
            )
        return ids

    def wait(self, task_id: str, timeout: float | None = None) -> ScheduledTask:
        """Block until the task is terminal and return it; raises TimeoutError after
        ``timeout`` seconds. Blocks on the pool's event stream (XREAD BLOCK), never polls."""
        deadline = None if timeout is None else time.monotonic() + timeout
        cursor = last_event_id(self.redis, self.keys)
        while True:
            task = self.get(task_id)
            if task.status.terminal:
                return task
            remaining = 5.0 if deadline is None else min(5.0, deadline - time.monotonic())
            if remaining <= 0:
                raise TimeoutError(f"task {task_id} is still {task.status.value}")
            cursor, events = read_events(
                self.redis, self.keys, cursor, block_ms=max(1, int(remaining * 1000))
            )
            while events and not any(e.task == task_id for e in events):
                cursor, events = read_events(self.redis, self.keys, cursor, block_ms=None)

    def events(
        self, since: str = "0-0", *, task: str | None = None, follow: bool = False
    ) -> Iterator[Event]:
        """Transitions from the pool's event stream, oldest first; ``follow`` keeps blocking
        for new ones."""
        cursor = since
        while True:
            cursor, batch = read_events(
                self.redis, self.keys, cursor, block_ms=5000 if follow else None
            )
            for e in batch:
                if task is None or e.task == task:
                    yield e
            if not batch and not follow:
                return

    # -- workflows ----------------------------------------------------------------------------
    def put_workflow(self, definition: WorkflowDefinition | Mapping[str, Any]) -> str:
        """Store (or replace) a WorkflowDefinition; returns its name."""
        try:
            wf = (
                definition
                if isinstance(definition, WorkflowDefinition)
                else WorkflowDefinition.model_validate(dict(definition))
            )
        except ValidationError as exc:
            raise InvalidInput(first_error(exc)) from None
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(self.keys.workflow(wf.name), wf.model_dump_json())
        pipe.sadd(self.keys.workflows, wf.name)
        pipe.execute()
        return wf.name

    def list_workflows(self) -> builtins.list[str]:
        return sorted(str(n) for n in self.redis.smembers(self.keys.workflows))
