"""deviceq's vocabulary, defined once: task statuses and their groups, failure kinds (which a
host may report, which count against a device, which a retry policy may name), the outcomes a
report ends a lease with, a device's blockers in precedence order, and the codes and reasons
of the scripts' per-item replies.

The values are stored in Redis and shown to users: they never change. The Lua scripts get the
sets they use from here: `lua_include` generates the text of each ``gen/NAME`` include
(``--- @include "gen/statuses"``), which ``deviceq.core.scripts`` sends with the scripts that
name it, like a ``lua/lib`` file. `deviceq.core.replies` parses the per-item replies (``ok:LEASE``,
``err:REASON``, ``err:REASON@ROLE``, ...) into typed results."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from .bounds import lua_include as bounds_include
from .limits import REASONS as LIMIT_REASONS
from .limits import lua_include as limits_include
from .script_args import SCHEMAS
from .script_args import lua_include as args_include


class TaskStatus(StrEnum):
    """A task's status (field ``status`` of ``task:ID``, the index ``status:STATUS``)."""

    queued = "queued"
    assigned = "assigned"
    dispatched = "dispatched"
    done = "done"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def terminal(self) -> bool:
        """Finished: ``done``, ``failed`` or ``cancelled`` (kept for ``retention``)."""
        return self.value in TERMINAL_STATUSES

    @property
    def leased(self) -> bool:
        """Holding a lease on a device: ``assigned`` (not yet claimed) or ``dispatched``."""
        return self.value in LEASED_STATUSES


STATUSES: tuple[str, ...] = tuple(s.value for s in TaskStatus)
"""Every task status, in lifecycle order (the order ``status`` and the dashboard show)."""
LEASED_STATUSES: tuple[str, ...] = (TaskStatus.assigned.value, TaskStatus.dispatched.value)
"""The statuses of a task holding a lease (and its device): "active" in `verify`."""
TERMINAL_STATUSES: tuple[str, ...] = tuple(
    s.value for s in (TaskStatus.done, TaskStatus.failed, TaskStatus.cancelled)
)
"""The statuses of a finished task (``TERMINAL`` in the scripts)."""


class FailureKind(StrEnum):
    """Why an attempt failed (field ``failure_kind``)."""

    lease_expired = "lease_expired"
    runner_failed = "runner_failed"
    runner_error = "runner_error"
    cancelled = "cancelled"
    timeout = "timeout"
    rejected = "rejected"
    unschedulable = "unschedulable"
    infrastructure = "infrastructure"

    @property
    def server_only(self) -> bool:
        """Set by the scripts only (a host may not report it)."""
        return self.value in SERVER_ONLY_KINDS

    @property
    def host_reported(self) -> bool:
        """A host may report it with outcome ``failed`` (``HOST_KINDS`` in report.lua)."""
        return self.value in HOST_FAILURE_KINDS

    @property
    def device_fault(self) -> bool:
        """Counts against the device toward ``quarantine_after``: the runner crashed, timed out
        or marked the failure as the device's. A task's own failure never does, nor does a
        timeout of a task with a ``timeout`` of its own (report.lua decides)."""
        return self.value in DEVICE_FAULT_KINDS


F = FailureKind
SERVER_ONLY_KINDS: tuple[str, ...] = (F.lease_expired.value, F.unschedulable.value)
"""The failure kinds only the scripts set: a lease expired, a queue timeout passed."""
HOST_FAILURE_KINDS: tuple[str, ...] = tuple(
    k.value for k in (F.runner_failed, F.runner_error, F.timeout, F.rejected, F.infrastructure)
)
"""The failure kinds a host may report with outcome ``failed`` (``cancelled`` comes only with
outcome ``cancelled``)."""
DEVICE_FAULT_KINDS: tuple[str, ...] = tuple(
    k.value for k in (F.infrastructure, F.runner_error, F.timeout)
)
"""The failure kinds that count against the device toward ``quarantine_after``."""
RETRY_KINDS: tuple[str, ...] = tuple(
    k.value for k in (F.infrastructure, F.runner_error, F.timeout, F.runner_failed, F.lease_expired)
)
"""The failure kinds a retry policy may name (``retry_on``): the host-reported ones a retry
can help with, and ``lease_expired`` (the host went silent)."""

del F

REPORT_OUTCOMES: tuple[str, ...] = (*TERMINAL_STATUSES, "released", "preempted")
"""What a host's report ends its lease with: a terminal status, ``released`` (a hand-back:
the task is queued again) or ``preempted`` (stopped for an urgent task: queued again, the
attempt not used up)."""

DEVICE_BLOCKERS: tuple[str, ...] = (
    "quarantined", "reserved", "booked", "suspect", "held", "checking", "unhealthy", "gated",
    "busy", "offline",
)  # fmt: skip
"""A device's own reasons not to take work, in precedence order (``device_blocker`` in
lua/lib/eligibility.lua; ``busy``/``offline``: its reported state)."""
HOST_BLOCKERS: tuple[str, ...] = ("host_dead", "host_draining", "host_suspect")
"""Its host's reasons (``host_placeable`` in lua/lib/liveness.lua)."""
BLOCKERS: tuple[str, ...] = (
    "quarantined", "host_dead", "reserved", "booked", "suspect", "held", "checking",
    "unhealthy", "gated", "busy", "offline", "host_draining", "host_suspect",
)  # fmt: skip
"""Every reason a device cannot take work, in precedence order: the device's own with its
host's interleaved (a dead host outranks all but a quarantine; a drain or a host's lost lease
only shows on a device that would otherwise be idle)."""
ASSIGN_REFUSAL_OF_BLOCKER: Mapping[str, str] = {
    "quarantined": "device_quarantined", "reserved": "device_reserved",
    "booked": "device_booked", "suspect": "device_held", "held": "device_held",
    "checking": "device_checking", "unhealthy": "device_unhealthy", "gated": "device_gated",
}  # fmt: skip
"""The ``err:REASON`` an assignment to a device gets for its blocker (``ASSIGN_ERR`` in the
scripts; any other blocker: ``device_not_idle``)."""


class ReplyCode(StrEnum):
    """The code of a script's per-item reply ``CODE`` or ``CODE:VALUE`` (`deviceq.core.replies`
    parses them)."""

    ok = "ok"
    """Applied: ``ok:LEASE_ID`` (assign), ``ok:ATTEMPT`` (gang_assign), ``ok:STATUS`` (report),
    ``ok`` (log_append, task_priority)."""
    dup = "dup"
    """``dup:STATUS``: the identical report was already applied (nothing changed)."""
    same = "same"
    """task_priority: the task had that priority already."""
    err = "err"
    """``err:REASON`` (assign, task_priority) or ``err:REASON@ROLE`` (gang_assign: a role's
    device is the reason)."""
    rejected = "rejected"
    """``rejected:REASON`` (report, log_append): the lease is not the caller's to end."""


ASSIGN_REFUSALS: tuple[str, ...] = (
    "invalid_id", "task_not_found", "task_not_queued", "task_multi_device", "task_pinned",
    "device_not_found",
    "device_reserved", "device_not_idle", "device_quarantined", "device_held", "device_booked",
    "device_checking", "device_unhealthy", "device_gated", "host_dead", "host_draining",
    "host_suspect", "driver_type_mismatch", "missing_tag", "where_mismatch", "device_preempted",
    "pool_paused", *LIMIT_REASONS,
)  # fmt: skip
"""The reasons of assign.lua's ``err:REASON`` (``missing_tag`` comes as ``missing_tag:TAG``)."""
GANG_REFUSALS: tuple[str, ...] = (
    "task_not_found", "not_multi_device", "task_not_queued", "invalid_id", "duplicate_device",
    "pool_paused", *(r for r in ASSIGN_REFUSALS if r.startswith(("device_", "host_"))),
    "driver_type_mismatch", "missing_tag",
)  # fmt: skip
"""The reasons of gang_assign.lua's ``err:REASON`` (a device's reason with ``@ROLE``;
``host_cap@ROLE``: the role's device's host would hold more than ``max_tasks_per_host``)."""
DEVICE_REFUSAL_PREFIXES: tuple[str, ...] = (
    "device_", "driver_type_mismatch", "missing_tag", "where_mismatch",
)  # fmt: skip
"""An assignment refused for these reasons says something about the device (its state, its
driver type or tags): a scheduler re-reads the device."""
PRIORITY_REFUSALS: tuple[str, ...] = (
    "invalid_id", "task_not_found", "task_part", "task_not_queued",
)  # fmt: skip
"""The reasons of task_priority.lua's ``err:REASON``."""
REPORT_REJECTIONS: tuple[str, ...] = (
    "not_found", "superseded", "not_owner", "expired", "already_terminal",
    "cancel_not_requested", "preempt_not_requested",
)  # fmt: skip
"""The reasons of report.lua's ``rejected:REASON``."""
LOG_REJECTIONS: tuple[str, ...] = ("not_found", "superseded", "not_owner", "ended")
"""The reasons of log_append.lua's ``rejected:REASON``."""


# -- the Lua side ------------------------------------------------------------------------------

SUITE_TRY_STATUSES: tuple[str, ...] = ("passed", "failed", "error", "skipped", "missing")
"""What one try of a test in a suite can be (deviceq.suites): ``missing`` when the shard's run
reported nothing on it (it failed before it, wrote no JUnit file, or was cancelled)."""


def listed(words: tuple[str, ...], last: str = ", ") -> str:
    """``words`` as an error text lists them: ``a, b, c`` (``last=" or "``: ``a, b or c``)."""
    return last.join([", ".join(words[:-1]), words[-1]]) if len(words) > 1 else "".join(words)


LuaValue = tuple[str, ...] | Mapping[str, str] | str
LUA_INCLUDES: Mapping[str, Mapping[str, LuaValue]] = {
    "gen/statuses": {"TERMINAL": TERMINAL_STATUSES, "LEASED": LEASED_STATUSES},
    "gen/reports": {
        "OUTCOMES": REPORT_OUTCOMES,
        "HOST_KINDS": HOST_FAILURE_KINDS,
        "DEVICE_KINDS": DEVICE_FAULT_KINDS,
        "OUTCOMES_TEXT": listed(REPORT_OUTCOMES, " or "),
        "HOST_KINDS_TEXT": listed(HOST_FAILURE_KINDS, " or "),
    },
    "gen/retry_kinds": {"RETRY_KINDS": RETRY_KINDS, "RETRY_KINDS_TEXT": listed(RETRY_KINDS)},
    "gen/assign_refusals": {"ASSIGN_ERR": ASSIGN_REFUSAL_OF_BLOCKER},
    "gen/suite_tries": {"TRY_STATUSES": SUITE_TRY_STATUSES},
}
"""Each generated include: the Lua locals it defines, each with its value (a tuple: a set,
``{name = true, ...}``; a mapping: ``{name = 'text', ...}``; a str: that text, e.g. the
words an error text lists). Each script names the ones it
uses, so it carries only those."""
GENERATED_INCLUDES: tuple[str, ...] = (
    *LUA_INCLUDES,
    "gen/limits",
    "gen/bounds",
    *(f"gen/args/{name}" for name in SCHEMAS),
)
"""The name of every generated include (`lua_include` gives each one's text)."""


_LUA_KEYWORDS = frozenset((
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in",
    "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
))  # fmt: skip


def _lua_word(name: str) -> str:
    # a table key in the short form ``name =`` (and a value quoted as is): plain identifiers
    if not (name.isascii() and name.isidentifier()) or name in _LUA_KEYWORDS:
        raise ValueError(f"{name!r} is no plain Lua name")
    return name


def lua_table(name: str, value: LuaValue) -> str:
    """The Lua line defining local ``name`` as ``value``: a set (``{a = true, ...}``) for a
    tuple, a string map (``{a = 'x', ...}``) for a mapping."""
    if isinstance(value, str):
        if not all(c.isalnum() or c in " ,_:." for c in value):
            raise ValueError(f"{value!r} is no plain Lua text")
        return f"local {name} = '{value}'\n"
    if isinstance(value, tuple):
        items = [f"{_lua_word(v)} = true" for v in value]
    else:
        items = [f"{_lua_word(k)} = '{_lua_word(v)}'" for k, v in value.items()]
    return f"local {name} = {{{', '.join(items)}}}\n"


def lua_include(name: str) -> str | None:
    """The text of generated include ``name`` (``gen/NAME``), or None when there is none
    (``gen/limits``: the declared limits, `deviceq.core.limits.lua_include`; ``gen/args/SCRIPT``:
    the positions of a script's item fields, `deviceq.core.script_args`)."""
    if name == "gen/limits":
        return limits_include()
    if name == "gen/bounds":
        return bounds_include()
    if name.startswith("gen/args/"):
        return args_include(name)
    tables = LUA_INCLUDES.get(name)
    if tables is None:
        return None
    return f"-- {name} (deviceq.core.vocabulary)\n" + "".join(
        lua_table(n, v) for n, v in tables.items()
    )
