"""Script items packed as a caller that skips the Python checks would send them: each field's
value as given (any type, bytes too), ``False`` for a field not given, in the order of the
script's schema (`deviceq.core.script_args`). For tests of the scripts' own checks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deviceq.core.script_args import SUBMIT, Items, packb


def raw_items(schema: Items, *items: Mapping[str, Any]) -> bytes:
    """``items`` packed for ``schema``'s script, unchecked."""
    return packb([item.get(n, False) for item in items for n in schema.names])


def raw_submit(**task: Any) -> list[Any]:
    """submit.lua's arguments for one goal task ``t1`` (``hello``, priority 0, no constraints),
    its fields overridden by ``task``, unchecked."""
    base: dict[str, Any] = {"id": "t1", "kind": "goal", "goal": "hello", "workflow": "",
                            "driver_type": "", "tags": "", "priority": 0}  # fmt: skip
    return ["1", raw_items(SUBMIT, {**base, **task})]
