"""Per-test results from the JUnit XML files a run wrote: each file bounded in size, parsed by
defusedxml (no DTD, no entity, no external reference: a hostile file is refused, never
expanded) and read by junitparser; test cases matched to the shard's test ids."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..core.errors import InvalidInput

MAX_JUNIT_BYTES = 16 * 1024 * 1024
"""Bytes of one JUnit file at most (a bigger one is not read: its tests count as missing)."""
MAX_JUNIT_FILES = 50
"""JUnit files read per run at most."""
MAX_MESSAGE = 500
"""Characters of a failure's message kept."""
DEFAULT_GLOB = "**/junit*.xml"


@dataclass(frozen=True)
class CaseResult:
    """One test case of a JUnit file: ``status`` passed, failed, error or skipped."""

    test: str
    status: str
    duration_s: float | None
    message: str = ""


def matches(name: str, pattern: str) -> bool:
    """Does an artifact's name match ``pattern`` (``**/`` also matches no folder at all)?"""
    if fnmatch.fnmatchcase(name, pattern):
        return True
    return pattern.startswith("**/") and fnmatch.fnmatchcase(name, pattern[3:])


def parse(data: bytes, source: str = "junit file") -> list[CaseResult]:
    """The test cases of one JUnit XML document (``<testsuites>`` or one ``<testsuite>``).
    InvalidInput for a file over `MAX_JUNIT_BYTES`, malformed XML, or a DTD/entity (refused,
    never expanded)."""
    import defusedxml.ElementTree as safe_et
    from defusedxml.common import DefusedXmlException
    from junitparser import Error, Failure, JUnitXml, Skipped, TestSuite

    if len(data) > MAX_JUNIT_BYTES:
        raise InvalidInput(f"{source}: {len(data)} bytes, more than {MAX_JUNIT_BYTES}")
    try:
        root = safe_et.fromstring(data, forbid_dtd=True, forbid_entities=True,
                                  forbid_external=True)  # fmt: skip
    except DefusedXmlException as exc:
        raise InvalidInput(f"{source}: refused ({type(exc).__name__}: no DTD or entity)") from None
    except safe_et.ParseError as exc:
        raise InvalidInput(f"{source}: not XML ({exc})") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise InvalidInput(f"{source}: not JUnit XML (root <{root.tag}>)")
    doc = JUnitXml.fromroot(root)  # type: ignore[arg-type]
    suites: Iterable[TestSuite] = [doc] if isinstance(doc, TestSuite) else list(doc)
    out: list[CaseResult] = []
    for suite in suites:
        for case in suite:
            name = str(case.name or "")
            if not name:
                continue
            cls = str(case.classname or "")
            test = f"{cls}#{name}" if cls else name
            status, message = "passed", ""
            for r in case.result:
                if isinstance(r, Error):
                    status, message = "error", str(r.message or "")
                elif isinstance(r, Failure) and status != "error":
                    status, message = "failed", str(r.message or "")
                elif isinstance(r, Skipped) and status == "passed":
                    status = "skipped"
            try:
                dur = float(case.time) if case.time is not None else None
            except (TypeError, ValueError):
                dur = None
            if dur is not None and not 0 <= dur < 1e7:
                dur = None
            out.append(CaseResult(test, status, dur, message[:MAX_MESSAGE]))
    return out


def forms(test: str) -> tuple[str, ...]:
    """The names a JUnit case ``CLASS#NAME`` may be listed by: ``CLASS#NAME``, ``CLASS.NAME``,
    ``CLASS::NAME``, ``NAME``."""
    if "#" not in test:
        return (test,)
    cls, name = test.split("#", 1)
    return (test, f"{cls}.{name}", f"{cls}::{name}", name)


def match(tests: Sequence[str], cases: Iterable[CaseResult]) -> dict[str, CaseResult]:
    """The shard's ``tests`` that a case reports on (by any of its `forms`); a test reported
    twice keeps the worst result (error over failed over passed over skipped)."""
    wanted = set(tests)
    rank = {"error": 3, "failed": 2, "passed": 1, "skipped": 0}
    out: dict[str, CaseResult] = {}
    for case in cases:
        for f in forms(case.test):
            if f in wanted:
                old = out.get(f)
                if old is None or rank[case.status] > rank[old.status]:
                    out[f] = CaseResult(f, case.status, case.duration_s, case.message)
                break
    return out
