"""Gates: named rules that hold devices out of new work while their attributes say so
(``deviceq gate add low-battery --when 'battery<20' --until 'battery>=80'``).

A gate holds a device (device field ``gated`` = its name, ``gated_reason`` = the device's
values of the ``--when`` attributes, e.g. ``battery 15``) when every ``--when`` clause holds
(and its driver type is the gate's, when the gate names one); it lets the device go when every
``--until`` clause holds, or, without ``--until``, as soon as ``--when`` no longer holds. A
held device takes no new work (blocker ``gated``: `deviceq.core.eligibility`); the task it
runs finishes; it is never quarantined or counted as failing for it. Gates are checked, in
name order, whenever a device's attributes change (``device_attrs.lua``) and over every
device when a gate is added or removed (``gate_eval.lua``, in bounded batches), in Lua
(``lua/lib/gates.lua``) on the clauses' compiled form (`deviceq.core.where`)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .errors import InvalidInput
from .validation import validate_id
from .where import Clause, compile_all, parse_all

MAX_GATES = 16
"""Gates a pool may have (each is checked on every attribute change)."""
MAX_COOLDOWN = 86_400
"""A cooldown gate holds a device at most this many seconds after a run (gate_set.lua)."""


@dataclass(frozen=True)
class Gate:
    """A gate as stored in the ``gates`` hash (JSON)."""

    name: str
    when: tuple[Clause, ...]
    until: tuple[Clause, ...] = ()
    driver_type: str = ""
    created_at: int | None = None
    cooldown: int = 0  # seconds a device is held after each run on it (0: not a cooldown gate)

    def stored(self) -> str:
        """The JSON the ``gates`` hash holds: the clauses as written and compiled."""
        return json.dumps(
            {
                "name": self.name,
                "when": [str(c) for c in self.when],
                "until": [str(c) for c in self.until],
                "driver_type": self.driver_type,
                "when_c": compile_all(self.when),
                "until_c": compile_all(self.until),
                "cooldown": self.cooldown,
            },
            separators=(",", ":"),
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "when": [str(c) for c in self.when],
            "until": [str(c) for c in self.until],
            "driver_type": self.driver_type or None,
            "created_at": self.created_at,
            "cooldown": self.cooldown or None,
        }

    @classmethod
    def from_stored(cls, text: str) -> Gate | None:
        """A stored gate (None when it is not one)."""
        try:
            v = json.loads(text)
            return cls(
                # (Lua's cjson writes an empty list as {}: a cooldown gate's when)
                v["name"], parse_all(list(v["when"] or ())), parse_all(list(v.get("until") or ())),
                v.get("driver_type") or "", v.get("created_at"), int(v.get("cooldown") or 0),
            )  # fmt: skip
        except (ValueError, KeyError, TypeError, InvalidInput):
            return None


def make_gate(
    name: str,
    when: Iterable[str],
    until: Iterable[str] = (),
    driver_type: str | None = None,
    cooldown: int | None = None,
) -> Gate:
    """A gate from its command-line parts, checked (InvalidInput, one line)."""
    validate_id(name, "gate name")
    clauses, after = parse_all(list(when)), parse_all(list(until))
    if cooldown is not None:
        if isinstance(cooldown, bool) or not isinstance(cooldown, int):
            raise InvalidInput("--cooldown is a whole number of seconds")
        if not 1 <= cooldown <= MAX_COOLDOWN:
            raise InvalidInput(f"--cooldown is 1 to {MAX_COOLDOWN} seconds, got {cooldown}")
        if after:
            raise InvalidInput("a cooldown gate has no --until (it lets go when its time is up)")
    elif not clauses:
        raise InvalidInput("a gate needs at least one --when expression (or --cooldown S)")
    return Gate(name, clauses, after,
                validate_id(driver_type, "driver type") if driver_type else "",
                cooldown=cooldown or 0)  # fmt: skip


def cooling_reason(gated_reason: str | None, cool_until: int | None, now_ms: int) -> str | None:
    """A cooldown gate's reason with the time left now (``cooling 42 s``); others as stored."""
    if cool_until is None or not (gated_reason or "").startswith("cooling "):
        return gated_reason
    return f"cooling {max(0, -(-(cool_until - now_ms) // 1000))} s"
