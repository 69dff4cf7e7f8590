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


@dataclass(frozen=True)
class Gate:
    """A gate as stored in the ``gates`` hash (JSON)."""

    name: str
    when: tuple[Clause, ...]
    until: tuple[Clause, ...] = ()
    driver_type: str = ""
    created_at: int | None = None

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
        }

    @classmethod
    def from_stored(cls, text: str) -> Gate | None:
        """A stored gate (None when it is not one)."""
        try:
            v = json.loads(text)
            return cls(
                v["name"], parse_all(v["when"]), parse_all(v.get("until") or ()),
                v.get("driver_type") or "", v.get("created_at"),
            )  # fmt: skip
        except (ValueError, KeyError, TypeError, InvalidInput):
            return None


def make_gate(
    name: str, when: Iterable[str], until: Iterable[str] = (), driver_type: str | None = None
) -> Gate:
    """A gate from its command-line parts, checked (InvalidInput, one line)."""
    validate_id(name, "gate name")
    clauses = parse_all(list(when))
    if not clauses:
        raise InvalidInput("a gate needs at least one --when expression")
    return Gate(name, clauses, parse_all(list(until)),
                validate_id(driver_type, "driver type") if driver_type else "")  # fmt: skip
