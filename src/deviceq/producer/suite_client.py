"""The producer's suite methods (`Client` has them): submit a suite of tests sharded over
the matching devices, read it, list, wait for and cancel suites."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ..core.connection import PoolConnection
from ..core.errors import InvalidInput
from ..core.events import last_event_id, read_events
from ..core.validation import validate_id
from ..suites import store
from ..suites.junit import DEFAULT_GLOB
from ..suites.model import Suite
from ..suites.submission import Plan, plan, submit


class SuiteMethods(PoolConnection):
    """Suites over Redis (mixed into `deviceq.Client`)."""

    def plan_suite(self, name: str, tests: Sequence[str], **options: Any) -> Plan:
        """What `submit_suite` would submit (its shards, ETA, the devices matching now),
        nothing written."""
        return plan(self, name, tests, **options)

    def submit_suite(
        self,
        name: str,
        tests: Sequence[str],
        *,
        goal: str | None = None,
        command: str | None = None,
        driver_type: str | None = None,
        tags: Sequence[str] = (),
        shards: int | None = None,
        max_devices: int | None = None,
        deadline: float | None = None,
        each_device: bool = False,
        include_joining: float | None = None,
        retry_failed: int = 0,
        priority: int = 0,
        tenant: str | None = None,
        timeout: float | None = None,
        max_attempts: int | None = None,
        junit: str = DEFAULT_GLOB,
    ) -> Suite:
        """Submit a suite: ``tests`` (test ids) split into shards, each an ordinary task whose
        goal is the ``goal`` or ``command`` template with ``{tests}`` replaced by the shard's
        tests. Give one of ``shards`` (that many, balanced on the suite name's duration
        history: longest first, unseen tests at the median), ``deadline`` (seconds: the fewest
        shards that finish in time on the devices matching now, at most ``max_devices``;
        `deviceq.suites.sharding.Unsatisfiable` otherwise, nothing submitted) or
        ``each_device`` (every test on every device matching now, one task pinned to each;
        with ``include_joining`` seconds, also on each matching device that registers within
        that long after the submit).
        ``retry_failed`` rounds re-run only a shard's failed tests as a new shard on another
        device. Results come from the JUnit files (``junit`` glob) each run keeps in its
        artifacts. Returns the suite as recorded (its ``eta_s``: the ETA at submit)."""
        p = plan(
            self,
            name,
            tests,
            goal=goal,
            command=command,
            driver_type=driver_type,
            tags=tags,
            shards=shards,
            max_devices=max_devices,
            deadline=deadline,
            each_device=each_device,
            include_joining=include_joining,
            retry_failed=retry_failed,
            priority=priority,
            tenant=tenant,
            timeout=timeout,
            max_attempts=max_attempts,
            junit=junit,
        )
        submit(self, self, p)  # type: ignore[arg-type]
        return self.suite(p.suite_id)

    def suite(self, suite_id: str) -> Suite:
        """A suite: status, shards and their tasks, counts, failed and flaky tests, ETA."""
        return store.get(self, suite_id)

    def suites(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest suites, as summaries."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise InvalidInput("limit must be a positive int")
        return store.list_suites(self, limit)

    def cancel_suite(self, suite_id: str, by: str = "") -> dict[str, str]:
        """Cancel a suite and every shard's task; returns each task's answer (as `cancel`).
        Safe to call again: a suite cancelled already has its remaining tasks cancelled."""
        validate_id(suite_id, "suite id")
        store.cancel(self, suite_id, by)
        out = {}
        for s in store.shards_of(self, suite_id):
            out[s.task_id] = str(self._run("cancel", [s.task_id, "suite cancelled"]))
        return out

    def wait_suite(self, suite_id: str, timeout: float | None = None) -> Suite:
        """Block until the suite has ended and return it; TimeoutError after ``timeout``.
        Blocks on the pool's event stream (its ``suite_done``), never polls."""
        validate_id(suite_id, "suite id")
        deadline = None if timeout is None else time.monotonic() + timeout
        cursor = last_event_id(self.redis, self.keys)
        while True:
            status = self.redis.hget(self.keys.suite(suite_id), "status")
            if status is None:
                store.get(self, suite_id, results=False)  # (NotFound, said as such)
            if status not in (None, "running"):
                return store.get(self, suite_id)
            left = 5.0 if deadline is None else min(5.0, deadline - time.monotonic())
            if left <= 0:
                raise TimeoutError(f"suite {suite_id} is still {status} after {timeout}s")
            cursor, events = read_events(self.redis, self.keys, cursor,
                                         block_ms=max(1, int(left * 1000)))  # fmt: skip
            while events and not any(e.type == "suite_done" for e in events):
                cursor, events = read_events(self.redis, self.keys, cursor, block_ms=None)
