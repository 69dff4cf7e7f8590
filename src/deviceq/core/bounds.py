"""The bounds a submission and a script's items keep, declared once: the Python checks
(`deviceq.core.validation`, the models) use them, and the Lua scripts get them as the
generated include ``gen/bounds`` (`lua_include`), so the two sides cannot disagree on a
number. Whole numbers in Lua are written as integers, durations in seconds."""

from __future__ import annotations

YEAR_S = 365 * 86400
"""A year in seconds: the longest queue timeout, and how far ahead a ``not_before`` may be."""

MAX_GOAL_BYTES = 16 * 1024
MAX_TAGS = 32
MAX_PRIORITY = 9
MAX_PAYLOAD_BYTES = 64 * 1024
"""A report's result or error, and one chunk of a live log, at most."""
MIN_TASK_TIMEOUT = 0.001
MAX_TASK_TIMEOUT = 7 * 86400.0
"""The longest per-task ``timeout`` (seconds) a submission may ask for."""
MAX_ATTEMPTS = 1000
"""A task's ``max_attempts`` at most."""
MIN_QUEUE_TIMEOUT = 0.001
MAX_QUEUE_TIMEOUT = float(YEAR_S)
MAX_NOT_BEFORE_AHEAD_S = YEAR_S
MAX_SUBMIT_TASKS = 10_000
"""Tasks in one ``submit.lua`` call at most (`Client.submit_many` sends fewer)."""
SUBMIT_CALL_US = 2500
"""The Redis time one ``submit.lua`` call is sized to at most, by the declared costs below
(`deviceq.producer.submission.submit_chunks`): well under the 5 ms no script call may hold
Redis for. A chunk is one call, all or nothing, so it cannot stop half-way as assign.lua and
claim.lua do on their time budgets: it is sized before it is sent."""
SUBMIT_TASK_US = 20
"""A task's declared cost in a ``submit.lua`` call, its text apart (measured: 12-14 µs a
short task at 100,000 queued, redis-server 7.0 on the development machine; the rest is
margin)."""
SUBMIT_TEXT_NS = 30
"""A task's declared cost per byte of its text (goal, workflow, tags, where, roles ...):
measured 12 ns for ASCII, 28 ns for non-ASCII UTF-8 (each sequence checked)."""
SUBMIT_TESTS_NS = 75
"""A task's declared cost per byte of its list of tests (measured 46-50 ns: every test id is
checked); a list of more than ~100 KB alone takes over 5 ms (not split: one task, one call)."""
SUBMIT_MOST_TASKS = SUBMIT_CALL_US // SUBMIT_TASK_US
"""Tasks in one ``submit_many`` call at most (125): plain tasks, at their declared cost."""
MAX_REASON_BYTES = 200
"""A device state's reason in a heartbeat, at most."""
MAX_TEST_ID_BYTES = 300
"""Bytes of one test id of a task's list of tests (a suite's shard) at most."""
MAX_TESTS_LIST_BYTES = 1024 * 1024
"""Bytes of a task's list of tests (its ids joined by newlines: a suite's shard, written by the
host into the file ``$DEVICEQ_TESTS_FILE``) at most."""

LUA_BOUNDS: dict[str, int | float] = {
    "MAX_GOAL_BYTES": MAX_GOAL_BYTES,
    "MAX_TAGS": MAX_TAGS,
    "MAX_PRIORITY": MAX_PRIORITY,
    "MAX_PAYLOAD_BYTES": MAX_PAYLOAD_BYTES,
    "MIN_TASK_TIMEOUT": MIN_TASK_TIMEOUT,
    "MAX_TASK_TIMEOUT": MAX_TASK_TIMEOUT,
    "MAX_ATTEMPTS": MAX_ATTEMPTS,
    "MIN_QUEUE_TIMEOUT": MIN_QUEUE_TIMEOUT,
    "MAX_QUEUE_TIMEOUT": MAX_QUEUE_TIMEOUT,
    "MAX_NOT_BEFORE_AHEAD_MS": MAX_NOT_BEFORE_AHEAD_S * 1000,
    "MAX_SUBMIT_TASKS": MAX_SUBMIT_TASKS,
    "MAX_REASON_BYTES": MAX_REASON_BYTES,
    "MAX_TEST_ID_BYTES": MAX_TEST_ID_BYTES,
    "MAX_TESTS_LIST_BYTES": MAX_TESTS_LIST_BYTES,
}
"""The Lua locals of ``gen/bounds``, each with its value."""


def lua_number(value: int | float) -> str:
    """``value`` as Lua source: an integer without a fraction, else its shortest repr."""
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def lua_include() -> str:
    """The text of ``gen/bounds``."""
    lines = "".join(f"local {name} = {lua_number(v)}\n" for name, v in LUA_BOUNDS.items())
    return "-- gen/bounds (deviceq.core.bounds)\n" + lines
