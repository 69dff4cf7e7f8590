"""What a suite is: its bounds, the checks of its input (suite names, test ids, the tests
file), and the records read back (`Suite`, `Shard`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.bounds import MAX_TEST_ID_BYTES, MAX_TESTS_LIST_BYTES
from ..core.errors import InvalidInput
from ..core.validation import validate_id
from ..core.vocabulary import SUITE_TRY_STATUSES

MAX_TESTS = 10_000
"""Tests in one suite at most."""
MAX_TEST_ID = MAX_TEST_ID_BYTES
"""Bytes of one test id at most."""
MAX_SHARD_LIST = MAX_TESTS_LIST_BYTES
"""Bytes of one shard's list of tests (its ids, one a line: ``$DEVICEQ_TESTS_FILE``) at most."""
MAX_SUITE_LISTS = 64 * 1024 * 1024
"""Bytes of all of a suite's shard lists together at most (stored once per shard task)."""
MAX_SHARDS = 200
"""Shards of one suite at most (`--shards`, `--max-devices`, the devices of `--each-device`)."""
MAX_RETRY_FAILED = 5
"""Rounds of `--retry-failed` at most."""
MAX_TESTS_FILE = 4 * 1024 * 1024
"""Bytes of a tests file at most."""
SUITES_KEPT = 1000
"""Suites a pool keeps: past it, submitting drops the oldest finished one."""
DEFAULT_TEST_S = 30.0
"""The estimate of a test when its suite has no history at all."""

STATUSES = ("running", "done", "failed", "cancelled")
"""A suite's status: ``done`` once every test passed (flaky ones marked) or was skipped,
``failed`` once a test failed on every try, ``cancelled`` by `suite cancel`."""
TEST_STATUSES = ("passed", "flaky", "failed", "skipped", "pending")
"""A test's final status in a suite's results (``pending``: no shard reported it yet)."""
TRY_STATUSES = SUITE_TRY_STATUSES
"""What one try of a test can be (`deviceq.core.vocabulary.SUITE_TRY_STATUSES`)."""


def check_test_id(value: str, where: str = "") -> str:
    """A test id: 1-300 bytes of text without control characters or surrounding blanks."""
    shown = value if len(value) <= 60 else value[:57] + "..."
    at = f" ({where})" if where else ""
    if not value or len(value.encode()) > MAX_TEST_ID:
        raise InvalidInput(f"test id {shown!r}{at}: must be 1-{MAX_TEST_ID} bytes")
    if value != value.strip() or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidInput(f"test id {shown!r}{at}: no control characters or surrounding blanks")
    return value


def parse_tests(text: str, source: str = "tests file") -> list[str]:
    """The test ids of a tests file: one a line; blank lines and ``#`` comments skipped. A
    repeated id, a bad one, no test or more than `MAX_TESTS` is InvalidInput naming the line."""
    out: list[str] = []
    seen: set[str] = set()
    for n, line in enumerate(text.splitlines(), start=1):
        test = line.strip()
        if not test or test.startswith("#"):
            continue
        check_test_id(test, f"{source} line {n}")
        if test in seen:
            raise InvalidInput(f"{source} line {n}: test {test!r} is listed twice")
        seen.add(test)
        out.append(test)
        if len(out) > MAX_TESTS:
            raise InvalidInput(f"{source}: more than {MAX_TESTS} tests")
    if not out:
        raise InvalidInput(f"{source}: no test listed (one test id a line)")
    return out


def check_name(name: str) -> str:
    return validate_id(name, "suite name")


@dataclass(frozen=True)
class Shard:
    """One shard: a deviceq task running some of a suite's tests (``round`` 0, or a retry of
    failed tests: 1, 2...)."""

    index: int
    task_id: str
    tests: list[str]
    round: int = 0
    pin: str | None = None  # the device it was pinned to (each-device, a retry elsewhere)
    done: bool = False  # its results are recorded
    device_id: str | None = None  # where it ran
    status: str | None = None  # its task's status (as recorded, or read now)
    counts: dict[str, int] = field(default_factory=dict)
    estimate_s: float = 0.0
    joined: bool = False  # its device registered within the suite's joining window

    @classmethod
    def from_json(cls, index: int, raw: str) -> Shard:
        d = json.loads(raw)
        return cls(
            index=index,
            task_id=str(d["task"]),
            tests=[str(t) for t in d.get("tests") or []],
            round=int(d.get("round") or 0),
            pin=d.get("pin") or None,
            done=bool(d.get("done")),
            device_id=d.get("device") or None,
            status=d.get("status") or None,
            counts={str(k): int(v) for k, v in (d.get("counts") or {}).items()},
            estimate_s=float(d.get("est") or 0.0),
            joined=bool(d.get("joined")),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "task_id": self.task_id,
            "device_id": self.device_id,
            "status": self.status,
            "round": self.round,
            "pin": self.pin,
            "tests": self.tests,
            "counts": self.counts,
            "estimate_s": round(self.estimate_s, 3),
            "joined": self.joined,
        }


@dataclass(frozen=True)
class TestResult:
    """A test's outcome in a suite: its final status and every try (status, device, shard)."""

    test: str
    status: str
    duration_s: float | None
    device_id: str | None
    tries: list[tuple[str, str, int]]

    @classmethod
    def from_json(cls, test: str, raw: str) -> TestResult:
        d = json.loads(raw)
        tries = [(str(t[0]), str(t[1]), int(t[2])) for t in d.get("tries") or []]
        dur = d.get("d")
        return cls(test, str(d.get("s") or "pending"), None if dur is None else float(dur),
                   d.get("dev") or None, tries)  # fmt: skip

    @property
    def devices(self) -> list[str]:
        return list(dict.fromkeys(dev for _, dev, _ in self.tries if dev))

    def to_dict(self) -> dict[str, Any]:
        return {
            "test": self.test,
            "status": self.status,
            "duration_s": self.duration_s,
            "device_id": self.device_id,
            "tries": [{"status": s, "device_id": d or None, "shard": i} for s, d, i in self.tries],
        }


@dataclass(frozen=True)
class Suite:
    """A suite as recorded: its shards, the counts of its tests by final status, its failed
    and flaky tests, and its ETA (seconds from now; None once it ended)."""

    id: str
    name: str
    status: str
    submitted_at: int
    finished_at: int | None
    spec: dict[str, Any]
    tests: int
    shards: list[Shard]
    counts: dict[str, int]
    failed: list[TestResult]
    flaky: list[TestResult]
    eta_s: float | None
    eta_at_submit_s: float | None
    # a suite on every device with a joining window: its end (ms), and whether it has closed
    join_until: int | None = None
    join_closed: bool = False

    @property
    def terminal(self) -> bool:
        return self.status != "running"

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "status": self.status,
            "submitted_at": self.submitted_at,
            "finished_at": self.finished_at,
            "tests": self.tests,
            "each_device": bool(self.spec.get("each_device")),
            "shards": [s.to_dict() for s in self.shards],
            "counts": self.counts,
            "failed": [r.to_dict() for r in self.failed],
            "flaky": [r.to_dict() for r in self.flaky],
            "eta_s": None if self.eta_s is None else round(self.eta_s, 1),
            "eta_at_submit_s": self.eta_at_submit_s,
            "include_joining_until": self.join_until,
        }


def counts_of(h: Mapping[str, str]) -> dict[str, int]:
    """A suite hash's counts of tests by final status."""
    return {s: int(h.get(f"n_{s}") or 0) for s in TEST_STATUSES}
