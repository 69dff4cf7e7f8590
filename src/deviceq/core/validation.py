"""The validation every id, tag, goal, task timeout and retry policy passes before it becomes
part of a Redis key or a script argument (pure functions; the typed models in `models` use
them)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .bounds import (
    MAX_GOAL_BYTES,
    MAX_TAGS,
    MAX_TASK_TIMEOUT,
    MAX_TEST_ID_BYTES,
    MAX_TESTS_LIST_BYTES,
    MIN_TASK_TIMEOUT,
)
from .errors import InvalidInput
from .vocabulary import RETRY_KINDS

ID_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
TAG_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._=/+-]{0,63}\Z")
"""Patterns of a whole id / tag. Anchored with ``\\A``/``\\Z`` and used with ``fullmatch``:
``$`` also matches before a trailing newline, so ``^...$`` with ``re.match`` accepted
``"android\\n"``."""


def _shown(value: object) -> str:
    """A short printable form of a bad value for an error message (one line, at most ~45
    characters: repr escapes newlines)."""
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(f"{value[:40]}...")
    text = repr(value)
    return text if len(text) <= 45 else f"{text[:40]}..."


def validate_id(value: object, what: str = "id") -> str:
    """Return ``value`` if it is a valid id (1-128 of ``A-Z a-z 0-9 . _ -``, not starting with
    punctuation); raise InvalidInput otherwise (also for ``bytes``: ids are text). Ids become
    parts of Redis keys."""
    if not isinstance(value, str) or not ID_RE.fullmatch(value):
        kind = "" if isinstance(value, str) else f" ({type(value).__name__}, not str)"
        raise InvalidInput(
            f"invalid {what} {_shown(value)}{kind}: use 1-128 characters from A-Z a-z 0-9 . _ - "
            "starting with a letter or digit"
        )
    return value


def actor_args(by: str) -> list[str]:
    """The optional trailing ``by`` argument (who acts) of the scripts that record it: ``[]``
    for '' (not recorded), else ``[by]``, validated as an id (InvalidInput otherwise)."""
    return [validate_id(by, "actor")] if by else []


def validate_tag(value: object) -> str:
    if not isinstance(value, str) or not TAG_RE.fullmatch(value):
        kind = "" if isinstance(value, str) else f" ({type(value).__name__}, not str)"
        raise InvalidInput(
            f"invalid tag {_shown(value)}{kind}: use 1-64 characters from "
            "A-Z a-z 0-9 . _ - = / + starting with a letter or digit"
        )
    return value


def validate_tags(values: Any) -> tuple[str, ...]:
    """Validate, deduplicate and sort a collection of tags. A ``str`` is read as a comma list
    (``"wifi,camera"``): for command-line and config-file values only; the Python API and
    ``TaskSpec`` use :func:`validate_tag_list`, which refuses a bare string."""
    if values is None:
        return ()
    if isinstance(values, str):
        values = [v for v in values.split(",") if v]
    elif isinstance(values, bytes | bytearray | memoryview):
        raise InvalidInput(f"tags must be text, not {type(values).__name__}")
    elif isinstance(values, Mapping):  # (iterating it would take its keys as the tags)
        raise InvalidInput(f"tags must be a list of strings, not {type(values).__name__}")
    try:
        items = list(values)
    except TypeError:
        what = type(values).__name__
        raise InvalidInput(f"tags must be a list of strings, not {what}") from None
    tags = sorted({validate_tag(v) for v in items})
    if len(tags) > MAX_TAGS:
        raise InvalidInput(f"at most {MAX_TAGS} tags, got {len(tags)}")
    return tuple(tags)


def validate_tag_list(values: Any) -> tuple[str, ...]:
    """:func:`validate_tags` for the Python API: a bare ``str`` is refused (``tags="wifi"``
    is almost always a mistake for ``tags=["wifi"]``; iterating it would give one tag per
    character). Give a list, tuple or set of tags (or None for no tags)."""
    if isinstance(values, str):
        raise InvalidInput(
            f"tags must be a list of strings, not the str {_shown(values)}: "
            f"write tags=[{values!r}] (or split a comma list yourself)"
        )
    return validate_tags(values)


def check_text(value: object, what: str) -> str:
    """``value`` as text Redis can store: a ``str`` that encodes to UTF-8 (a lone surrogate,
    what a command line's undecodable bytes become, does not): InvalidInput otherwise."""
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a str, not {type(value).__name__}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{what} must be valid UTF-8 text (a lone surrogate is not)") from None
    return value


def validate_goal(goal: object) -> str:
    if not isinstance(goal, str):
        raise InvalidInput(f"goal must be a str, not {type(goal).__name__}")
    if not goal.strip():
        raise InvalidInput("goal must be a non-empty string")
    if "\x00" in goal:
        raise InvalidInput("must not contain a NUL byte (\\x00): no runner could pass it")
    size = len(goal.encode())
    if size > MAX_GOAL_BYTES:
        raise InvalidInput(f"goal is {size} bytes; the limit is {MAX_GOAL_BYTES}")
    return goal


def check_test_id(value: object, where: str = "") -> str:
    """A test id: 1-`MAX_TEST_ID_BYTES` bytes of text without control characters or
    surrounding blanks (one line of a tests file)."""
    at = f" ({where})" if where else ""
    if not isinstance(value, str):
        raise InvalidInput(f"test id{at} must be a str, not {type(value).__name__}")
    shown = value if len(value) <= 60 else value[:57] + "..."
    check_text(value, f"test id {shown!r}{at}")
    if not value or len(value.encode()) > MAX_TEST_ID_BYTES:
        raise InvalidInput(f"test id {shown!r}{at}: must be 1-{MAX_TEST_ID_BYTES} bytes")
    if value != value.strip() or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidInput(f"test id {shown!r}{at}: no control characters or surrounding blanks")
    return value


def check_test_list(value: Any) -> tuple[str, ...] | None:
    """A task's list of tests (a suite's shard: the host writes it, one a line, into the file
    ``$DEVICEQ_TESTS_FILE``): None, or 1 or more `check_test_id` ids whose lines take at most
    `MAX_TESTS_LIST_BYTES` bytes."""
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise InvalidInput("tests must be a list of test ids")
    out = tuple(check_test_id(t) for t in value)
    if not out:
        raise InvalidInput("tests must list at least one test id (or be left out)")
    size = len(tests_text(out).encode())
    if size > MAX_TESTS_LIST_BYTES:
        raise InvalidInput(
            f"the list of tests is {size} bytes (one id a line); a task's list is at most "
            f"{MAX_TESTS_LIST_BYTES} bytes: split the tests over more shards"
        )
    return out


def tests_text(tests: Any) -> str:
    """A list of test ids as stored and written to ``$DEVICEQ_TESTS_FILE``: one a line (no
    newline after the last: submit.lua's form; the host adds it to the file)."""
    return "\n".join(tests)


def check_task_timeout(value: object) -> float | None:
    """A task's own ``timeout``: None, or a number of seconds, 0.001 <= s <= 7 days (a bool or
    a string is refused: ``timeout="30"`` is a mistake in the Python API)."""
    if value is None:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    seconds = float(value) if isinstance(value, int | float) else float("nan")
    if not number or not MIN_TASK_TIMEOUT <= seconds <= MAX_TASK_TIMEOUT:  # (NaN fails both)
        raise InvalidInput(
            f"must be a number of seconds from {MIN_TASK_TIMEOUT} to {MAX_TASK_TIMEOUT:.0f} "
            f"(7 days), got {_shown(value)}"
        )
    return seconds


_SECS = re.compile(r"(0|[1-9][0-9]{0,5})(\.[0-9]{1,3})?")


def check_retry_on(v: str) -> str:
    """``none`` or a csv of RETRY_KINDS (the same check as ``retry_kinds`` in lua/lib/retry.lua)."""
    kinds = v.split(",")
    if v != "none" and (not v or any(k not in RETRY_KINDS for k in kinds)):
        kinds_list = ", ".join(RETRY_KINDS)
        raise ValueError(f"must be none or a comma-separated list of {kinds_list}")
    return v


def check_retry_backoff(v: str) -> str:
    """``none``, ``fixed:SECONDS`` or ``exponential:BASE:MAX`` (seconds up to 999999.999, at
    most 3 decimals; the same check as ``parse_backoff`` in lua/lib/retry.lua)."""
    parts = v.split(":")
    ok = (parts == ["none"]) or (
        (parts[0], len(parts)) in (("fixed", 2), ("exponential", 3))
        and all(_SECS.fullmatch(p) for p in parts[1:])
    )
    if not ok:
        raise ValueError(
            "must be none, fixed:SECONDS or exponential:BASE:MAX (seconds, e.g. exponential:1:300)"
        )
    return v


# -- durations ---------------------------------------------------------------------------------
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}
DURATION_HELP = "seconds, or with units: 90s, 10m, 2h, 1d, 1h30m, 500ms"


def parse_duration_s(text: str) -> float:
    """THE duration syntax of every text input (command-line options): a plain number of
    seconds (``90``, ``1.5``) or numbers with units ``ms s m h d w``, alone or in a row
    (``90s``, ``10m``, ``2h``, ``1d``, ``1h30m``), case-insensitive, as seconds. InvalidInput
    (one line) for anything else, a negative number included."""
    raw = str(text).strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", raw):
        return float(raw)
    pos, total_ms = 0, 0.0
    for m in _DURATION_PART.finditer(raw):
        if m.start() != pos:
            break
        total_ms += float(m.group(1)) * _DURATION_MS[m.group(2)]
        pos = m.end()
    if not raw or pos != len(raw):
        raise InvalidInput(f"{_shown(text)} is not a duration ({DURATION_HELP})")
    return total_ms / 1000
