"""Device attributes: typed values a device reports (``sdk=34``, ``model="Pixel 8"``,
``release=14.1.2``, ``charging=true``), checked before they reach Redis and encoded as they
are stored there.

A value is one of four kinds: a number (finite, ``int`` or ``float``), a version (two or more
dot-separated whole numbers: ``14.1.2``; compared part by part, missing parts are 0), a
boolean, or a string. Text from a command line, ``getprop`` or a ``KEY=VALUE`` pair is typed
by `infer`: ``true``/``false`` are booleans, ``34`` or ``-1.5`` a number, ``14.1.2`` a version,
anything else a string. A JSON value keeps its own kind (a JSON string is still inferred, so
``"34"`` from a discovery line is the number 34, as the same text typed on a command line).

Stored in the device's ``device:ID:attrs`` hash as ``KIND:TEXT`` (``n:34``, ``v:14.1.2``,
``b:1``, ``s:Pixel 8``; `encode` / `decode`), with when each was last reported in
``device:ID:attrs_at`` (ms). A string holds no control character and no double quote
(so any value can be written in a ``--where`` expression). ``lua/device_attrs.lua`` checks
the same rules (`KEY_RE`, `MAX_ATTRS`, `MAX_TEXT_BYTES`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import total_ordering
from typing import Any

from .errors import InvalidInput

KEY_RE = re.compile(r"\A[a-z][a-z0-9_]{0,31}\Z")
"""An attribute name: 1-32 of ``a-z 0-9 _``, starting with a letter."""
MAX_ATTRS = 32
"""Attributes one device may carry at once."""
MAX_TEXT_BYTES = 64
"""The longest string value (bytes of UTF-8)."""
MAX_NUMBER = 1e15
"""A number's magnitude bound (finite, exact as a Lua double)."""
NUMBER_RE = re.compile(r"\A-?(?:\d+(?:\.\d+)?|\.\d+)(?:[eE][-+]?\d+)?\Z")
VERSION_RE = re.compile(r"\A\d{1,9}(?:\.\d{1,9}){1,7}\Z")
"""A version: 2-8 dot-separated whole numbers of at most 9 digits."""


@total_ordering
@dataclass(frozen=True)
class Version:
    """A version such as ``14.1.2``, compared part by part (``14 == 14.0``)."""

    parts: tuple[int, ...]

    @classmethod
    def parse(cls, text: str) -> Version:
        return cls(tuple(int(p) for p in text.split(".")))

    def _key(self, width: int) -> tuple[int, ...]:
        return self.parts + (0,) * (width - len(self.parts))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Version):
            return NotImplemented
        n = max(len(self.parts), len(other.parts))
        return self._key(n) == other._key(n)

    def __lt__(self, other: Version) -> bool:
        n = max(len(self.parts), len(other.parts))
        return self._key(n) < other._key(n)

    def __hash__(self) -> int:
        parts = list(self.parts)
        while len(parts) > 1 and parts[-1] == 0:
            parts.pop()
        return hash(tuple(parts))

    def __str__(self) -> str:
        return ".".join(str(p) for p in self.parts)


Value = bool | int | float | Version | str


def check_key(key: object) -> str:
    """An attribute name (`KEY_RE`), or InvalidInput."""
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        raise InvalidInput(
            f"invalid attribute name {key!r}: use 1-32 characters from a-z 0-9 _ starting "
            "with a letter"
        )
    return key


def check_text(key: str, text: str) -> str:
    if len(text.encode("utf-8", "replace")) > MAX_TEXT_BYTES:
        raise InvalidInput(f"attribute {key}: a value is at most {MAX_TEXT_BYTES} bytes")
    if any(ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF for c in text):
        raise InvalidInput(f"attribute {key}: a value must not contain control characters")
    if '"' in text:
        raise InvalidInput(f"attribute {key}: a value must not contain a double quote")
    return text


def _check_number(key: str, n: int | float) -> int | float:
    if isinstance(n, float):
        if not math.isfinite(n):
            raise InvalidInput(f"attribute {key}: a number must be finite")
        if n.is_integer() and abs(n) < 2**53:
            n = int(n)
    if abs(n) > MAX_NUMBER:
        raise InvalidInput(f"attribute {key}: a number's magnitude is at most 1e15")
    return n


def infer(key: str, text: str) -> Value:
    """The typed value of ``text`` (see the module's doc), checked."""
    text = check_text(key, text.strip())
    if text in ("true", "false"):
        return text == "true"
    if NUMBER_RE.fullmatch(text):
        return _check_number(key, float(text) if any(c in text for c in ".eE") else int(text))
    if VERSION_RE.fullmatch(text):
        return Version.parse(text)
    return text


def check_value(key: str, value: object) -> Value:
    """A value from JSON or Python, typed and checked (a str goes through `infer`)."""
    if isinstance(value, bool | Version):
        return value
    if isinstance(value, int | float):
        return _check_number(key, value)
    if isinstance(value, str):
        return infer(key, value)
    raise InvalidInput(
        f"attribute {key}: a value is a number, a string, a version or a boolean, "
        f"not {type(value).__name__}"
    )


def check_attributes(values: object, what: str = "attributes") -> dict[str, Value]:
    """A mapping of attribute names to values, checked (at most `MAX_ATTRS`)."""
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise InvalidInput(f"{what} must be a mapping of names to values")
    if len(values) > MAX_ATTRS:
        raise InvalidInput(f"at most {MAX_ATTRS} attributes, got {len(values)}")
    return {check_key(k): check_value(k, v) for k, v in values.items()}


def parse_assignments(pairs: list[str] | tuple[str, ...]) -> dict[str, Value]:
    """``KEY=VALUE`` pairs (the command line's ``set-attr``), typed by `infer`."""
    out: dict[str, Value] = {}
    for pair in pairs:
        key, eq, text = pair.partition("=")
        if not eq:
            raise InvalidInput(f"expected KEY=VALUE, got {pair!r}")
        key = check_key(key.strip())
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
            out[key] = check_text(key, text[1:-1])  # quoted: always a string
        else:
            out[key] = infer(key, text)
    if len(out) > MAX_ATTRS:
        raise InvalidInput(f"at most {MAX_ATTRS} attributes, got {len(out)}")
    return out


def encode(value: Value) -> str:
    """The stored form ``KIND:TEXT`` of a checked value."""
    if isinstance(value, bool):
        return "b:1" if value else "b:0"
    if isinstance(value, int | float):
        return "n:" + (str(value) if isinstance(value, int) else repr(value))
    if isinstance(value, Version):
        return f"v:{value}"
    return f"s:{value}"


def decode(stored: str) -> Value | None:
    """A stored ``KIND:TEXT`` back to its value (None when it is not one)."""
    kind, _, text = stored.partition(":")
    try:
        if kind == "b":
            return text == "1"
        if kind == "n":
            return float(text) if any(c in text for c in ".eE") else int(text)
        if kind == "v":
            return Version.parse(text)
    except ValueError:
        return None
    return text if kind == "s" else None


def shown(value: Value) -> str:
    """A value as people read it (``true``, ``34``, ``14.1.2``, ``Pixel 8``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def as_json(value: Value) -> Any:
    """A value as JSON carries it (a version as its text)."""
    return str(value) if isinstance(value, Version) else value


def decode_hash(raw: Mapping[Any, Any]) -> dict[str, Value]:
    """A ``device:ID:attrs`` hash as read (str or bytes) to values, names sorted."""
    out: dict[str, Value] = {}
    for k, v in sorted(raw.items()):
        key = k.decode() if isinstance(k, bytes) else str(k)
        value = decode(v.decode() if isinstance(v, bytes) else str(v))
        if value is not None:
            out[key] = value
    return out


def entry_args(device_id: str, values: Mapping[str, Value], unset: tuple[str, ...]) -> list[str]:
    """One device's entry of a ``device_attrs.lua`` call: ``ID NSET NUNSET KEY ENCODED...
    KEY...`` (values and names already checked)."""
    if len(values) > MAX_ATTRS or len(unset) > MAX_ATTRS:
        raise InvalidInput(f"at most {MAX_ATTRS} attributes a device")
    args = [device_id, str(len(values)), str(len(unset))]
    for k, v in values.items():
        args += [k, encode(v)]
    return [*args, *unset]


def parse_prefer(text: str | None) -> tuple[str, str]:
    """The pool setting ``prefer`` as (``none`` | ``max`` | ``min`` | ``least_used``,
    attribute name or ''); anything malformed reads as none (the setting is checked when it
    is set: `check_prefer`)."""
    text = (text or "none").strip()
    kind, _, key = text.partition(":")
    if kind in ("max", "min") and KEY_RE.fullmatch(key):
        return kind, key
    if text == "least_used":
        return "least_used", ""
    return "none", ""


def check_prefer(text: str) -> str:
    """A ``prefer`` setting (none, max:ATTRIBUTE, min:ATTRIBUTE, least_used), or ConfigError."""
    from .errors import ConfigError

    if parse_prefer(text) == ("none", "") and text.strip() != "none":
        raise ConfigError(
            f"prefer must be none, max:ATTRIBUTE, min:ATTRIBUTE or least_used, not {text!r}"
        )
    return text.strip()
