"""JSON from outside (request bodies, discovery lines) parsed with its nesting bounded: text
nested deeper than `MAX_DEPTH` (``[[[[...``) is one InvalidInput, never a RecursionError
from the parser or from the code that walks the value later."""

from __future__ import annotations

import json
from typing import Any

from .errors import InvalidInput

MAX_DEPTH = 32
"""Arrays and objects inside one another, at most (a task of a batch with roles is 5)."""


def depth(value: Any) -> int:
    """How deeply ``value``'s lists and dicts nest (0 for a scalar), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        level += 1
        deepest = max(deepest, level)
        stack.extend((child, level) for child in children if isinstance(child, dict | list))
    return deepest


def loads(data: str | bytes, what: str = "the JSON text", max_depth: int = MAX_DEPTH) -> Any:
    """``data`` parsed; InvalidInput (one line naming ``what``) when it is not JSON, not
    UTF-8, or nested deeper than ``max_depth``."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise InvalidInput(f"{what} is nested too deeply (at most {max_depth} levels)") from None
    except UnicodeDecodeError:
        raise InvalidInput(f"{what} is not UTF-8 text") from None
    except ValueError as exc:
        first = str(exc).splitlines()[0] if str(exc) else "malformed"
        raise InvalidInput(f"{what} is not JSON: {first}") from None
    if depth(value) > max_depth:
        raise InvalidInput(f"{what} is nested too deeply (at most {max_depth} levels)")
    return value
