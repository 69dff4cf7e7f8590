"""The per-item fields of the Lua transitions, declared once.

A script that takes items (submit's tasks, heartbeat's devices, assign's pairs, ...) gets them
as ONE argument: a MessagePack array (``cmsgpack``, built into Redis' Lua) holding the items one
after the other, each item's fields in the order its `Items` declares them, so ``n`` items are
``n * width`` values. Lua reads a field by its name: the generated include ``gen/args/NAME``
(`lua_include`) defines each field's position as a constant (``TASK_GOAL = 3``) and the width
(``TASK_N``); item ``i`` (from 0) has field ``F`` at ``A[i * TASK_N + TASK_F]``.

Why this shape: one string argument (Redis makes one Lua string instead of one per field), one
flat table (no table per item, no hash part: the cost per call stays that of the positional
arguments it replaces), and fields that arrive typed (a whole number is a Lua number, no text
parsed back). A field is text (`str`) or a whole number (`int`); an optional field not given
is sent as ``false`` (a script tests ``if A[b + TASK_X] then``). The values are checked by the
script as before (`deviceq.core.validation` on the Python side).

Adding a field to a script's items is one line here (an optional field: old callers need no
change, every caller packs through `Items.pack`), then the script reads ``A[b + PREFIX_NAME]``
and its header names the field (``tests/lua/test_script_args.py`` holds every script's header
to its schema)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import msgpack  # (no type hints shipped; MessagePack's reference implementation, C-accelerated)

FieldKind = type[str] | type[int]


@dataclass(frozen=True)
class Field:
    """One field of an item: its name (a Lua constant ``PREFIX_NAME`` gives its position),
    its kind (`str` or `int`) and whether it may be left out (sent as ``false``)."""

    name: str
    kind: FieldKind = str
    optional: bool = False


def text(name: str, optional: bool = False) -> Field:
    """A text field."""
    return Field(name, str, optional)


def whole(name: str, optional: bool = False) -> Field:
    """A whole-number field (a Lua number in the script)."""
    return Field(name, int, optional)


@dataclass(frozen=True)
class Items:
    """The items one script takes: ``prefix`` names its Lua constants (``TASK`` ->
    ``TASK_ID``, ``TASK_N``), ``fields`` their order."""

    script: str
    prefix: str
    fields: tuple[Field, ...]

    def __post_init__(self) -> None:
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.script}: a field is declared twice")
        for n in (self.prefix, *names):
            if not n.replace("_", "").isalnum() or not n.isascii() or n[0].isdigit():
                raise ValueError(f"{self.script}: {n!r} is no plain name")

    @property
    def width(self) -> int:
        """The values one item takes."""
        return len(self.fields)

    @cached_property
    def names(self) -> tuple[str, ...]:
        """The fields' names, in order."""
        return tuple(f.name for f in self.fields)

    @cached_property
    def _declared(self) -> frozenset[str]:
        return frozenset(self.names)

    def flat(self, items: Iterable[Mapping[str, Any]]) -> list[Any]:
        """The items' values, item after item, each in field order (``false`` for an optional
        field given as None or not at all). A missing required field, a value of the wrong
        kind or a field not declared is a programming error (ValueError/TypeError)."""
        out: list[Any] = []
        declared = self._declared
        for item in items:
            extra = item.keys() - declared
            if extra:
                raise ValueError(f"{self.script}: no field {sorted(extra)[0]!r}")
            for f in self.fields:
                v = item.get(f.name)
                if v is None:
                    if not f.optional:
                        raise ValueError(f"{self.script}: field {f.name!r} is required")
                    out.append(False)
                elif f.kind is int:
                    if isinstance(v, bool) or not isinstance(v, int):
                        raise TypeError(f"{self.script}: field {f.name!r} takes an int")
                    out.append(v)
                else:
                    if not isinstance(v, str):
                        raise TypeError(f"{self.script}: field {f.name!r} takes a str")
                    out.append(v)
        return out

    def pack(self, items: Iterable[Mapping[str, Any]]) -> bytes:
        """The script's argument for ``items``: one MessagePack array (`flat`)."""
        return packb(self.flat(items))

    def lua_include(self) -> str:
        """The text of ``gen/args/SCRIPT``: each field's position and the width."""
        lines = [f"-- gen/args/{self.script} (deviceq.core.script_args): {self.prefix} fields\n"]
        lines.append(f"local {self.prefix}_N = {self.width}\n")
        for i, f in enumerate(self.fields, 1):
            lines.append(f"local {self.prefix}_{f.name.upper()} = {i}\n")
        return "".join(lines)


def packb(values: list[Any]) -> bytes:
    """``values`` as one MessagePack array (text as str, never bin: a Lua string either way)."""
    out: bytes = msgpack.packb(values, use_bin_type=False)
    return out


SUBMIT = Items(
    "submit",
    "TASK",
    (
        text("id"),
        text("kind"),
        text("goal"),
        text("workflow"),
        text("driver_type"),
        text("tags"),
        whole("priority"),
        whole("max_attempts", optional=True),
        text("idempotency_key", optional=True),
        text("queue_timeout", optional=True),
        whole("reject_unmatched", optional=True),
        text("retry_on", optional=True),
        text("retry_backoff", optional=True),
        text("tenant", optional=True),
        text("roles", optional=True),
        text("timeout", optional=True),
        whole("not_before", optional=True),
        text("retry_of", optional=True),
        text("by", optional=True),
        text("traceparent", optional=True),
        text("pin", optional=True),
        text("class", optional=True),
        text("where", optional=True),
        text("tests", optional=True),
        text("role_where", optional=True),
    ),
)
"""submit.lua's tasks."""

HEARTBEAT = Items(
    "heartbeat",
    "DEV",
    (
        text("device_id"),
        text("driver_type"),
        text("tags"),
        text("state"),
        text("reason"),
        text("attrs", optional=True),
    ),
)
"""heartbeat.lua's devices (``attrs``: `deviceq.core.attributes.delta_text`)."""

ASSIGN = Items("assign", "PAIR", (text("task_id"), text("device_id")))
"""assign.lua's (task, device) pairs."""

PLAN_AHEAD = Items("plan_ahead", "HINT", (text("task_id"), text("device_id")))
"""plan_ahead.lua's hints: the task each busy device runs next."""

RENEW = Items("renew", "LEASE", (text("task_id"), text("lease_id")))
"""renew.lua's leases."""

REPORT = Items(
    "report",
    "REPORT",
    (text("task_id"), text("lease_id"), text("outcome"), text("failure_kind"), text("payload")),
)
"""report.lua's reports."""

LOG_APPEND = Items(
    "log_append",
    "CHUNK",
    (text("task_id"), text("lease_id"), text("stream"), text("text"), whole("final")),
)
"""log_append.lua's chunks of output."""

PROGRESS = Items(
    "progress", "UPDATE", (text("task_id"), text("lease_id"), text("fraction"), text("text"))
)
"""progress.lua's updates."""

ATTEMPT_ARTIFACTS = Items(
    "attempt_artifacts", "FILE", (text("name"), whole("size"), text("sha256"))
)
"""attempt_artifacts.lua's files."""

GANG_ASSIGN = Items("gang_assign", "ROLE", (text("device_id"),))
"""gang_assign.lua's devices, one per role of the task, in its role order."""

TASK_PRIORITY = Items("task_priority", "PRIO", (text("task_id"),))
"""task_priority.lua's tasks."""

HEADS = Items("heads", "BUCKET", (text("sig"), whole("start"), whole("stop")))
"""heads.lua's bucket ranges."""

SCHEMAS: dict[str, Items] = {
    s.script: s
    for s in (
        SUBMIT,
        HEARTBEAT,
        ASSIGN,
        PLAN_AHEAD,
        RENEW,
        REPORT,
        LOG_APPEND,
        PROGRESS,
        ATTEMPT_ARTIFACTS,
        GANG_ASSIGN,
        TASK_PRIORITY,
        HEADS,
    )
}
"""Every script's items, by script name."""


def lua_include(name: str) -> str | None:
    """The text of generated include ``gen/args/SCRIPT``, or None when there is none."""
    schema = SCHEMAS.get(name.removeprefix("gen/args/")) if name.startswith("gen/args/") else None
    return schema.lua_include() if schema else None
