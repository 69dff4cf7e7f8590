"""Suites: the leading scheduler records each ended shard's per-test results.

Every second, for each running suite (``suites:running``), the shards whose task ended are
read: the JUnit files its last attempt recorded in the artifact store (matching the suite's
``junit`` glob; each bounded in size, hostile XML refused) give each of the shard's tests a
try (passed, failed, error, skipped; ``missing`` for a test no file reports on). A shard's
failed tests, while the suite has ``retry_failed`` rounds left, become a new shard submitted
first (its idempotency key is the shard's, so a watcher killed before recording submits the
same task again, not a second one), preferring another device. Then suite_shard.lua records
it all at once, fenced by the leader's epoch, once per shard; the last shard ends the suite.
A watcher SIGKILLed at any point leaves the shard open: the next leader records it.

A shard's artifacts are uploaded after its report: the watcher waits for its attempt's record
to name its files (or an upload error), at most `UPLOAD_GRACE_MS` after the task ended.

A suite on every device with a joining window (``--include-joining``): while it is open, each
time the pool's devices change (``devgen``) the watcher reads the devices (their driver type,
tags and registration time) and gives each matching device registered within the window that
has no shard yet its pinned shard: the task is submitted first with an idempotency key of the
suite and the device (`deviceq.suites.submission.joined_key`), then suite_join.lua records it
once per device, fenced. A watcher SIGKILLed between the two leaves the device without its
shard recorded: the next leader submits again (the same task) and records it. Once the window
has passed (after a last look at the devices), suite_join.lua closes it; the suite ends when
its last shard is recorded, not before the window has closed."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..artifacts.records import store_for
from ..core.errors import DeviceqError, Fenced
from ..core.models import TaskSpec, satisfies
from ..producer.client import Client
from ..suites import junit, store
from ..suites.model import MAX_SHARDS, Shard
from ..suites.submission import joined_shard, task_spec
from .leader_loop import LeaderLoop

_LOG = logging.getLogger("deviceq.suites")

TICK = 1.0
UPLOAD_GRACE_MS = 30_000
"""How long after a shard's task ended its results wait for its artifacts to be recorded."""
SUITES_PER_TICK = 200
"""Running suites looked at per tick at most (the rest at the next ones)."""
JOINS_PER_TICK = 50
"""Devices joining one suite given their shard per tick at most (the rest at the next ones)."""
TERMINAL = frozenset({"done", "failed", "cancelled"})
PIN_SUPPORTED = "pin" in TaskSpec.model_fields


@dataclass
class SuiteWatcher(LeaderLoop):
    """Records the ended shards of running suites while ``epoch()`` says this process leads
    (None: it does not; the watcher then does nothing)."""

    client: Client
    epoch: Callable[[], int | None]
    every: float = TICK
    store_url: str | None = None
    stopping: threading.Event = field(default_factory=threading.Event)
    # the pool's devgen at this watcher's last look at the devices, per suite with an open
    # joining window (a look when it changes)
    seen_devgen: dict[str, str] = field(default_factory=dict)
    NAME: ClassVar[str] = "suites"
    LOG: ClassVar[logging.Logger] = _LOG

    def thread_name(self) -> str:
        return f"suites-{self.client.pool}"

    def tick(self) -> int:
        """One look at every running suite; returns how many shards it recorded."""
        epoch = self.epoch()
        if epoch is None:
            return 0
        r, k = self.client.redis, self.client.keys
        ids = sorted(str(x) for x in r.srandmember(k.suites_running, SUITES_PER_TICK) or [])
        done = 0
        try:
            for sid in ids:
                if self.stopping.is_set():
                    break
                done += self.look(sid, epoch)
                self.join(sid, epoch)
        except Fenced:
            _LOG.info("suites: another scheduler leads pool %s now", self.client.pool)
        return done

    def look(self, suite_id: str, epoch: int | None) -> int:
        """Record the ended shards of one suite; returns how many."""
        r, k = self.client.redis, self.client.keys
        h = r.hmget(k.suite(suite_id), "status", "spec")
        if h[0] != "running":
            return 0
        spec = json.loads(h[1] or "{}")
        open_shards = [s for s in store.shards_of(self.client, suite_id) if not s.done]
        pipe = r.pipeline(transaction=False)
        for s in open_shards:
            pipe.hmget(k.task(s.task_id), "status", "device_id", "finished_at", "attempt")
            pipe.lindex(k.attempts(s.task_id), -1)
        res = pipe.execute()
        now = self.client.server_time_ms()
        count = 0
        for i, s in enumerate(open_shards):
            status, device, finished, attempt = res[2 * i]
            last = json.loads(res[2 * i + 1]) if res[2 * i + 1] else {}
            if status is not None and status not in TERMINAL:
                continue
            uploading = status is not None and status != "cancelled" and not _uploaded(last)
            if uploading and now - int(finished or now) < UPLOAD_GRACE_MS:
                continue  # its files are being uploaded
            tries = self.tries(s, spec, status, device, int(attempt or 0), last)
            retry = self.retry_shard(suite_id, s, spec, tries, device)
            args: list[Any] = [
                "" if epoch is None else str(epoch), suite_id, s.index, status or "gone",
                device or "", json.dumps(retry) if retry else "", len(tries),
            ]  # fmt: skip
            for t in tries:
                args += t
            self.client._run("suite_shard", args)
            count += 1
        return count

    def join(self, suite_id: str, epoch: int | None) -> int:
        """A suite's joining window: give the devices registered within it their shard, and
        close it once it has passed; returns how many devices got their shard now."""
        r, k = self.client.redis, self.client.keys
        status, raw, until, closed, since = r.hmget(
            k.suite(suite_id), "status", "spec", "join_until", "join_closed", "submitted_at"
        )
        if status != "running" or not until or closed == "1":
            self.seen_devgen.pop(suite_id, None)
            return 0
        fence = "" if epoch is None else str(epoch)
        now = self.client.server_time_ms()
        gen = str(r.get(k.devgen) or "0")  # (read before the devices: a later change is seen)
        added = 0
        if self.seen_devgen.get(suite_id) != gen:
            spec = json.loads(raw or "{}")
            added, left = self.add_joined(suite_id, spec, int(since or 0), int(until), fence)
            if not left:
                self.seen_devgen[suite_id] = gen
        if now >= int(until) and suite_id in self.seen_devgen:
            self.client._run("suite_join", [fence, suite_id, "close"])
            self.seen_devgen.pop(suite_id, None)
        return added

    def add_joined(self, suite_id: str, spec: Mapping[str, Any], since: int, until: int,
                   fence: str) -> tuple[int, bool]:  # fmt: skip
        """Submit and record the shard of each matching device registered within
        [``since``, ``until``) that has none yet (at most `JOINS_PER_TICK`); returns how many
        were added and whether some are left for the next look."""
        r, k = self.client.redis, self.client.keys
        have = {str(d) for d in r.smembers(k.suite_devices(suite_id))}
        ids = sorted(str(d) for d in r.smembers(k.devices) if str(d) not in have)
        pipe = r.pipeline(transaction=False)
        for d in ids:
            pipe.hmget(k.device(d), "driver_type", "tags", "registered_at")
        driver, tags = spec.get("driver_type"), list(spec.get("tags") or [])
        joining = []
        for d, (dtype, dtags, reg) in zip(ids, pipe.execute(), strict=True):
            if reg is None or not since <= int(reg) < until:
                continue
            if satisfies(driver, tags, dtype or "", [t for t in (dtags or "").split(",") if t]):
                joining.append(d)
        room = max(0, MAX_SHARDS - len(have))
        now_joining = joining[: min(room, JOINS_PER_TICK)]
        if not now_joining:
            return 0, False
        first = min((s for s in store.shards_of(self.client, suite_id) if s.round == 0),
                    key=lambda s: s.index)  # fmt: skip
        added = 0
        for device in now_joining:
            (task_id,) = self.client.submit_many(
                [joined_shard(spec, first.tests, suite_id, device)]
            )
            shard = {"task": task_id, "tests": first.tests, "round": 0, "pin": device,
                     "est": round(first.estimate_s, 3), "joined": True}  # fmt: skip
            answer = self.client._run("suite_join", [fence, suite_id, "add", device,
                                                     json.dumps(shard)])  # fmt: skip
            if answer == "added":
                added += 1
                _LOG.info("suites: device %s joined suite %s (task %s)", device, suite_id,
                          task_id)  # fmt: skip
            elif answer == "closed":  # (the window closed meanwhile: the task is not the suite's)
                self.client._run("cancel", [task_id, "its suite's joining window had closed"])
        return added, len(joining) > len(now_joining) and room > len(now_joining)

    def tries(self, s: Shard, spec: Mapping[str, Any], status: str | None, device: str | None,
              attempt: int, last: Mapping[str, Any]) -> list[list[str]]:  # fmt: skip
        """Each of the shard's tests as suite_shard.lua takes it: test, try, ms, message."""
        found: dict[str, junit.CaseResult] = {}
        note = ""
        if status in ("done", "failed") and attempt:
            found, note = self.read_junit(s, spec, attempt, last)
        if not note and status != "done":
            note = f"the shard's task {s.task_id} is {status or 'gone'}"
        out = []
        for t in s.tests:
            c = found.get(t)
            if c is None:
                out.append([t, "missing", "", (note or "no JUnit result for it")[:500]])
            else:
                ms = "" if c.duration_s is None else str(int(c.duration_s * 1000))
                out.append([t, c.status, ms, c.message[:500]])
        return out

    def read_junit(
        self, s: Shard, spec: Mapping[str, Any], attempt: int, last: Mapping[str, Any]
    ) -> tuple[dict[str, junit.CaseResult], str]:
        """The shard's tests found in the JUnit files its attempt recorded, and a note when
        a file could not be read."""
        pattern = str(spec.get("junit") or junit.DEFAULT_GLOB)
        recorded = [f for f in last.get("artifacts") or [] if isinstance(f, dict)]
        files = [f for f in recorded if junit.matches(str(f.get("name", "")), pattern)]
        files = files[: junit.MAX_JUNIT_FILES]
        if not files:
            return {}, ""
        cases: list[junit.CaseResult] = []
        notes = []
        try:
            st = store_for(self.client, self.store_url, attempt=(s.task_id, attempt))
        except DeviceqError as exc:
            return {}, f"artifact store: {exc}"
        for f in files:
            name, size = str(f["name"]), int(f.get("size") or 0)
            if size > junit.MAX_JUNIT_BYTES:
                notes.append(f"{name}: {size} bytes, over {junit.MAX_JUNIT_BYTES}")
                continue
            try:
                with st.open_verified(self.client.pool, s.task_id, attempt, name, size,
                                      str(f.get("sha256") or "")) as fh:  # fmt: skip
                    cases += junit.parse(fh.read(), name)
            except (DeviceqError, OSError) as exc:
                notes.append(f"{name}: {exc}")
        return junit.match(s.tests, cases), "; ".join(notes)

    def retry_shard(
        self,
        suite_id: str,
        s: Shard,
        spec: Mapping[str, Any],
        tries: Sequence[Sequence[str]],
        device: str | None,
    ) -> dict[str, Any] | None:
        """The retry shard of ``s``'s failed tests, submitted (idempotently), or None."""
        failed = [t[0] for t in tries if t[1] in ("failed", "error", "missing")]
        if not failed or s.round >= int(spec.get("retry_failed") or 0):
            return None
        if self.client.redis.hget(self.client.keys.suite(suite_id), "status") != "running":
            return None
        ts = task_spec(spec, failed, f"suite.{suite_id}.{s.index}.r")
        pin = self.pin_for(spec, s, device) if PIN_SUPPORTED else None
        if pin:
            ts["pin"] = pin
        (task_id,) = self.client.submit_many([ts])
        est = s.estimate_s * len(failed) / max(1, len(s.tests))
        return {"task": task_id, "tests": failed, "round": s.round + 1, "pin": pin,
                "est": round(est, 3), "after": s.index}  # fmt: skip

    def pin_for(self, spec: Mapping[str, Any], s: Shard, device: str | None) -> str | None:
        """Where a retry runs: a suite on every device retries on the same device; any other
        on a matching device it did not fail on (an idle one first), else anywhere."""
        if spec.get("each_device"):
            return s.pin
        devices = store.matching_devices(self.client, spec.get("driver_type"),
                                         spec.get("tags") or [])  # fmt: skip
        others = [d for d in devices if d.device_id != device]
        others.sort(key=lambda d: (d.state != "idle", d.device_id))
        return others[0].device_id if others else None


def _uploaded(last: Mapping[str, Any]) -> bool:
    """Has the attempt's host recorded its artifacts (files or an upload error)?"""
    return bool(last.get("artifacts") or last.get("artifacts_error"))


def start_watcher(client: Client, epoch: Callable[[], int | None]) -> SuiteWatcher:
    """Record the suites of ``client``'s pool from this scheduler process while ``epoch()``
    is its leader epoch."""
    w = SuiteWatcher(client, epoch)
    w.start()
    return w
