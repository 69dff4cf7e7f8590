"""Submitting a suite: its tests split into balanced shards (or one shard per matching device),
each shard an ordinary deviceq task submitted through the producer, then the suite recorded
with its ETA; and the retry shard of a shard's failed tests."""

from __future__ import annotations

import hashlib
import secrets
import shlex
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..core.bounds import MAX_GOAL_BYTES
from ..core.connection import PoolConnection
from ..core.errors import InvalidInput, NotConfirmed, QueueFull
from ..core.validation import validate_id, validate_tags
from . import eta as eta_mod
from . import sharding, store
from .junit import DEFAULT_GLOB
from .model import MAX_RETRY_FAILED, MAX_SHARD_LIST, MAX_SHARDS, MAX_SUITE_LISTS, check_name

TESTS_MARK = "{tests}"
"""Where a goal or command template takes its shard's tests."""
MAX_JOINING_S = 7 * 86400
"""The longest joining window (``--include-joining``; suite_submit.lua holds the same)."""
SHARD_OVERHEAD_S = 1.0
"""What a shard costs beyond its tests' durations (assignment, claim, start, upload), in the
deadline's arithmetic and the ETA."""


class Submitter(Protocol):
    """What a suite is submitted through: a producer over Redis (`deviceq.Client`)."""

    def submit_many(self, specs: Any, chunk: int = ...) -> list[str]: ...

    def cancel_many(self, task_ids: Any, reason: str = ..., by: str = ...) -> dict[str, str]: ...


@dataclass(frozen=True)
class Plan:
    """A suite as it will be submitted: its shards (test lists), each shard's estimate and
    pinned device, the ETA (seconds from now) and the devices matching now."""

    suite_id: str
    name: str
    tests: list[str]
    shards: list[list[str]]
    estimates: list[float]
    pins: list[str | None]
    eta_s: float | None
    matching: int
    spec: dict[str, Any] = field(default_factory=dict)


def new_suite_id() -> str:
    return secrets.token_hex(8)


def shard_goal(spec: Mapping[str, Any], tests: Sequence[str]) -> str:
    """A shard's goal: the suite's template with ``{tests}`` replaced by its tests (space
    separated; each shell-quoted in a ``--command`` template)."""
    if spec.get("command"):
        return str(spec["command"]).replace(TESTS_MARK, " ".join(shlex.quote(t) for t in tests))
    return str(spec["goal"]).replace(TESTS_MARK, " ".join(tests))


def check_template(goal: str | None, command: str | None) -> None:
    """One template, ``--goal`` or ``--command``; ``{tests}`` in it is optional (a shard's
    tests are in ``$DEVICEQ_TESTS_FILE`` whatever the template)."""
    if (goal is None) == (command is None):
        raise InvalidInput("give exactly one of --goal or --command (a template, with {tests} "
                           "where a shard's tests go)")  # fmt: skip
    text = goal if goal is not None else command
    if not (text or "").strip():
        raise InvalidInput("the template must not be blank")


def check_goals(spec: Mapping[str, Any], shards: Sequence[Sequence[str]]) -> None:
    """Each shard's goal (the template with its tests in place of ``{tests}``) at most
    `MAX_GOAL_BYTES`: InvalidInput saying how to fit otherwise."""
    for i, tests in enumerate(shards):
        size = len(shard_goal(spec, tests).encode())
        if size > MAX_GOAL_BYTES:
            raise InvalidInput(
                f"shard {i}'s goal with its tests in place of {TESTS_MARK} is {size} bytes, more "
                f"than {MAX_GOAL_BYTES}: give more --shards, or leave {TESTS_MARK} out of the "
                "template and read the tests from $DEVICEQ_TESTS_FILE"
            )


def plan(
    conn: PoolConnection,
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
    split: str = "balanced",
) -> Plan:
    """The suite's plan, nothing written. InvalidInput for bad input; `Unsatisfiable` when
    the deadline cannot be met (``needs N devices, M match``). ``split``: ``balanced`` (on
    the duration history, longest first) or ``round_robin`` (the tests dealt in turn, no
    history: what the makespan benchmark compares against). ``include_joining`` (seconds,
    with ``each_device``): devices matching that register within that long after the submit
    get their pinned shard too (the leading scheduler adds it: `deviceq.services.suite_watch`)."""
    check_name(name)
    check_template(goal, command)
    tag_list = list(validate_tags(list(tags)))
    if driver_type is not None:
        validate_id(driver_type, "driver type")
    if tenant is not None:
        validate_id(tenant, "tenant")
    if not 0 <= retry_failed <= MAX_RETRY_FAILED:
        raise InvalidInput(f"--retry-failed must be 0-{MAX_RETRY_FAILED}")
    chosen = sum(x is not None for x in (shards, deadline)) + bool(each_device)
    if chosen != 1:
        raise InvalidInput("give one of --shards N, --deadline D (with --max-devices N) or "
                           "--each-device")  # fmt: skip
    if max_devices is not None and deadline is None:
        raise InvalidInput("--max-devices goes with --deadline")
    if shards is not None and not 1 <= shards <= MAX_SHARDS:
        raise InvalidInput(f"--shards must be 1-{MAX_SHARDS}")
    if max_devices is not None and not 1 <= max_devices <= MAX_SHARDS:
        raise InvalidInput(f"--max-devices must be 1-{MAX_SHARDS}")
    if deadline is not None and not 0 < deadline <= 7 * 86400:
        raise InvalidInput("--deadline must be more than 0 and at most 7 days")
    if include_joining is not None:
        if not each_device:
            raise InvalidInput("--include-joining goes with --each-device")
        number = isinstance(include_joining, int | float) and not isinstance(include_joining, bool)
        if not number or not 0 < include_joining <= MAX_JOINING_S:
            raise InvalidInput("--include-joining must be more than 0 and at most 7 days")
    tests = list(tests)
    est = sharding.estimates(tests, store.read_history(conn, name, tests))
    devices = store.matching_devices(conn, driver_type, tag_list)
    pins: list[str | None]
    if each_device:
        if not devices:
            raise sharding.Unsatisfiable("unsatisfiable: no device matches now")
        if len(devices) > MAX_SHARDS:
            raise InvalidInput(f"{len(devices)} devices match: at most {MAX_SHARDS} a suite")
        split_tests = [tests for _ in devices]
        pins = [d.device_id for d in devices]
    else:
        if deadline is not None:
            n = sharding.shards_for_deadline(tests, est, deadline, max_devices or MAX_SHARDS,
                                             len(devices), SHARD_OVERHEAD_S)  # fmt: skip
        else:
            assert shards is not None
            n = shards
        if split == "round_robin":
            split_tests = sharding.round_robin(tests, n)
        elif split == "balanced":
            split_tests = sharding.balance(tests, est, n)
        else:
            raise InvalidInput(f"split must be balanced or round_robin, not {split!r}")
        pins = [None] * len(split_tests)
    check_lists(split_tests, each_device)
    check_goals({"goal": goal, "command": command}, split_tests)
    loads = [sharding.load(s, est) + SHARD_OVERHEAD_S for s in split_tests]
    spec = {
        "goal": goal,
        "command": command,
        "driver_type": driver_type,
        "tags": tag_list,
        "priority": priority,
        "tenant": tenant,
        "timeout": timeout,
        "max_attempts": max_attempts,
        "retry_failed": retry_failed,
        "junit": junit,
        "each_device": each_device,
        "deadline_s": deadline,
    }
    if include_joining is not None:
        spec["include_joining_s"] = float(include_joining)
    return Plan(new_suite_id(), name, tests, split_tests, loads, pins,
                submit_eta(loads, pins, devices), len(devices), spec)  # fmt: skip


def list_bytes(tests: Sequence[str]) -> int:
    """Bytes of a shard's list of tests as stored and written (one id a line)."""
    return sum(len(t.encode()) for t in tests) + max(0, len(tests) - 1)


def check_lists(shards: Sequence[Sequence[str]], each_device: bool = False) -> None:
    """Each shard's list of tests (stored with its task, written to ``$DEVICEQ_TESTS_FILE``)
    at most `MAX_SHARD_LIST` bytes, all of them at most `MAX_SUITE_LISTS`: InvalidInput
    saying so otherwise (nothing submitted)."""
    sizes = [list_bytes(s) for s in shards]
    for i, size in enumerate(sizes):
        if size > MAX_SHARD_LIST:
            fix = ("with --each-device every device's task lists every test: give fewer tests"
                   if each_device else "give more --shards")  # fmt: skip
            raise InvalidInput(f"shard {i}'s list of tests is {size} bytes, more than "
                               f"{MAX_SHARD_LIST} (one shard's list at most): {fix}")  # fmt: skip
    if sum(sizes) > MAX_SUITE_LISTS:
        raise InvalidInput(f"the shards' lists of tests take {sum(sizes)} bytes together, more "
                           f"than {MAX_SUITE_LISTS} (a suite's at most): give fewer tests or "
                           "devices")  # fmt: skip


def submit_eta(loads: Sequence[float], pins: Sequence[str | None],
               devices: Sequence[store.MatchingDevice]) -> float | None:  # fmt: skip
    """The ETA at submit (seconds): the shards placed longest first on the matching devices,
    an idle one free now, a busy one once a typical shard of this suite would end (its own
    run is not ours to estimate); a pinned shard on its own device. None when nothing
    matches."""
    if not devices:
        return None
    busy_s = statistics.median(loads) if loads else 0.0
    ready = {d.device_id: 0.0 if d.state == "idle" else busy_s for d in devices}
    if any(p is not None for p in pins):
        return max(ready.get(p or "", busy_s) + load for p, load in zip(pins, loads, strict=True))
    return eta_mod.eta(loads, list(ready.values())[:MAX_SHARDS])


def task_spec(spec: Mapping[str, Any], tests: Sequence[str], key: str) -> dict[str, Any]:
    """A shard's task spec (``key``: its idempotency key, so a resubmission is one task); its
    ``tests`` reach the host, which writes them into ``$DEVICEQ_TESTS_FILE``."""
    return {
        "goal": shard_goal(spec, tests),
        "driver_type": spec.get("driver_type"),
        "tags": list(spec.get("tags") or []),
        "priority": int(spec.get("priority") or 0),
        "tenant": spec.get("tenant"),
        "timeout": spec.get("timeout"),
        "max_attempts": spec.get("max_attempts"),
        "idempotency_key": key,
        "tests": list(tests),
    }


def joined_key(suite_id: str, device_id: str) -> str:
    """The idempotency key of the shard of a device joining suite ``suite_id``: one task per
    (suite, device), however often a watcher killed half-way submits it."""
    digest = hashlib.sha256(device_id.encode()).hexdigest()[:24]
    return f"suite.{suite_id}.join.{digest}"


def joined_shard(spec: Mapping[str, Any], tests: Sequence[str], suite_id: str,
                 device_id: str) -> dict[str, Any]:  # fmt: skip
    """The task spec of the shard of a device joining a suite on every device: every test,
    pinned to the device."""
    return {**task_spec(spec, tests, joined_key(suite_id, device_id)), "pin": device_id}


def submit(producer: Submitter, conn: PoolConnection, p: Plan) -> list[str]:
    """Submit the plan's shards as tasks, then record the suite; returns the tasks' ids."""
    specs = [task_spec(p.spec, s, f"suite.{p.suite_id}.{i}") for i, s in enumerate(p.shards)]
    for sp, pin in zip(specs, p.pins, strict=True):
        if pin is not None:
            sp["pin"] = pin
    try:
        ids = producer.submit_many(specs)
    except (QueueFull, NotConfirmed) as exc:  # a part went in: cancelled, so nothing is left
        part = getattr(exc, "queued_ids", None) or getattr(exc, "result", None) or []
        if part:
            producer.cancel_many(part, "its suite could not be submitted whole")
        raise
    shards = [
        {"task": tid, "tests": tests, "round": 0, "pin": pin, "est": round(est, 3)}
        for tid, tests, pin, est in zip(ids, p.shards, p.pins, p.estimates, strict=True)
    ]
    store.record(conn, p.suite_id, p.name, p.spec["each_device"], p.spec, len(p.tests),
                 p.eta_s, shards)  # fmt: skip
    return ids
