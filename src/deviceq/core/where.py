"""``--where`` expressions over device attributes, declared once: parsed, checked, shown in
one canonical text, evaluated against a device's attributes, and explained when nothing
matches.

Grammar (one clause an expression; several clauses are and-ed)::

    KEY OP VALUE        OP one of = != < <= > >=   (== is read as =)
    KEY in (V1, V2...)  at most 16 values
    has(KEY)

A value is typed as an attribute's is (`deviceq.core.attributes.infer`): ``33`` a number,
``14.1.2`` a version, ``true`` a boolean, else a string; quote it (``"33"``) to keep it a
string. A device without the attribute never matches a comparison (``!=`` included); only
``has(KEY)`` asks whether it is there. Numbers compare as numbers; a version with a version or
a whole number as versions (``release>=14`` holds for ``14.1.2``); strings compare as text
(``<`` too); a boolean only with ``=``/``!=``; values of other pairs of kinds are never
equal (so only ``!=`` holds).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .attributes import (
    KEY_RE,
    VERSION_RE,
    Value,
    Version,
    check_key,
    check_text,
    decode,
    encode,
    infer,
    shown,
)
from .errors import InvalidInput

OPERATORS = ("=", "!=", "<", "<=", ">", ">=", "in", "has")
MAX_EXPRESSION_BYTES = 256
MAX_IN_VALUES = 16
MAX_CLAUSES = 8
"""A task (or a gate, a device list) has at most this many ``--where`` clauses."""

_HAS = re.compile(r"\Ahas\(\s*([^)\s]*)\s*\)\Z")
_IN = re.compile(r"\A([A-Za-z0-9_]+)\s+in\s*\((.*)\)\Z", re.S)
_CMP = re.compile(r"\A([A-Za-z0-9_]+)\s*(==|!=|<=|>=|=|<|>)\s*(.*)\Z", re.S)


@dataclass(frozen=True)
class Clause:
    """One parsed expression: ``key op values`` (``values`` empty for ``has``)."""

    key: str
    op: str
    values: tuple[Value, ...] = ()

    def __str__(self) -> str:
        if self.op == "has":
            return f"has({self.key})"
        if self.op == "in":
            return f"{self.key} in ({', '.join(_literal(v) for v in self.values)})"
        return f"{self.key}{self.op}{_literal(self.values[0])}"

    def compiled(self) -> str:
        """The form Lua evaluates (``lua/lib/where.lua``): ``KEY<TAB>OP<TAB>ENCODED...``, each
        value as stored (`deviceq.core.attributes.encode`: no tab or newline in it)."""
        return "\t".join((self.key, self.op, *(encode(v) for v in self.values)))

    def matches(self, attrs: Mapping[str, Value]) -> bool:
        """Whether a device with ``attrs`` satisfies this clause."""
        if self.key not in attrs:
            return False
        if self.op == "has":
            return True
        have = attrs[self.key]
        if self.op == "in":
            return any(_compare(have, v) == 0 for v in self.values)
        c = _compare(have, self.values[0])
        if self.op == "!=":
            return c != 0
        if not isinstance(c, int):
            return False
        return {"=": c == 0, "<": c < 0, "<=": c <= 0, ">": c > 0, ">=": c >= 0}[self.op]


def _literal(v: Value) -> str:
    """A value as an expression writes it, read back to the same value."""
    if isinstance(v, str):
        bare = v.strip() == v and re.fullmatch(r"[^\"',()=<>!][^\"',()]*", v) is not None
        if bare and isinstance(infer("x", v), str):
            return v
        return f'"{v}"'
    if isinstance(v, Version) and len(v.parts) < 3:  # (14.1 would read back as a number)
        return str(Version(v.parts + (0,) * (3 - len(v.parts))))
    return shown(v)


def _as_version(v: Value) -> Version | None:
    if isinstance(v, Version):
        return v
    if isinstance(v, bool):
        return None
    if isinstance(v, int) and v >= 0:
        return Version((v,))
    if isinstance(v, float) and v >= 0 and VERSION_RE.fullmatch(repr(v)):
        return Version.parse(repr(v))
    return None


def _compare(a: Value, b: Value) -> int | str | None:
    """-1, 0, 1 for comparable values; ``"ne"`` for values only (un)equal (booleans); None
    for kinds that do not compare (never equal)."""
    if isinstance(a, bool) or isinstance(b, bool):
        if isinstance(a, bool) and isinstance(b, bool):
            return 0 if a == b else "ne"
        return None
    if isinstance(a, Version) or isinstance(b, Version):
        va, vb = _as_version(a), _as_version(b)
        if va is None or vb is None:
            return None
        return (va > vb) - (va < vb)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return (a > b) - (a < b)
    if isinstance(a, str) and isinstance(b, str):
        return (a > b) - (a < b)
    return None


def _value(text: str, what: str) -> Value:
    text = text.strip()
    if not text:
        raise InvalidInput(f"{what}: a value is missing")
    if text[0] in "\"'":
        if len(text) < 2 or text[-1] != text[0] or text[0] in text[1:-1] or '"' in text[1:-1]:
            raise InvalidInput(f"{what}: unbalanced quote in {text!r}")
        return check_text("value", text[1:-1])
    if text[0] in "<>=!":  # `sdk>>33`, `sdk=>33`: a doubled or misordered operator
        raise InvalidInput(f"{what}: a value starting with {text[0]!r} must be quoted ({text!r})")
    if any(c in text for c in "\"'()"):
        raise InvalidInput(f"{what}: quote a value holding quotes or parentheses ({text!r})")
    try:
        return infer("value", text)
    except InvalidInput as e:
        raise InvalidInput(f"{what}: {e}") from None


def _split_values(body: str, what: str) -> list[str]:
    out, cur, quote = [], "", ""
    for ch in body:
        if quote:
            cur += ch
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            cur += ch
            quote = ch
        elif ch == ",":
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if quote:
        raise InvalidInput(f"{what}: unbalanced quote")
    out.append(cur)
    return out


def _key(key: str, what: str) -> str:
    try:
        return check_key(key)
    except InvalidInput as e:
        raise InvalidInput(f"{what}: {e}") from None


def parse(text: object) -> Clause:
    """One expression to a `Clause`, or InvalidInput naming what is wrong (one line)."""
    if not isinstance(text, str):
        raise InvalidInput(f"a --where expression is text, not {type(text).__name__}")
    what = f"invalid --where {text!r}"
    if len(text.encode("utf-8", "replace")) > MAX_EXPRESSION_BYTES:
        raise InvalidInput(f"a --where expression is at most {MAX_EXPRESSION_BYTES} bytes")
    if "\n" in text or "\r" in text:
        raise InvalidInput(f"{what}: one line")
    s = text.strip()
    if m := _HAS.fullmatch(s):
        return Clause(_key(m.group(1), what), "has")
    if m := _IN.fullmatch(s):
        parts = _split_values(m.group(2), what)
        if len(parts) > MAX_IN_VALUES:
            raise InvalidInput(f"{what}: at most {MAX_IN_VALUES} values in a list")
        # (distinct by stored form: 0 and false, 1 and 1.0 are equal in Python, not here)
        values = tuple({encode(v): v for v in (_value(p, what) for p in parts)}.values())
        return Clause(_key(m.group(1), what), "in", values)
    if m := _CMP.fullmatch(s):
        op = "=" if m.group(2) == "==" else m.group(2)
        value = _value(m.group(3), what)
        if isinstance(value, bool) and op not in ("=", "!="):
            raise InvalidInput(f"{what}: true/false compare only with = or !=")
        return Clause(_key(m.group(1), what), op, (value,))
    raise InvalidInput(
        f"{what}: expected KEY OP VALUE (OP one of = != < <= > >=), KEY in (A, B) or has(KEY)"
    )


def parse_all(texts: Iterable[object] | None) -> tuple[Clause, ...]:
    """Several expressions (and-ed), deduplicated, in canonical order; at most `MAX_CLAUSES`."""
    if texts is None:
        return ()
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list | tuple | set | frozenset):
        raise InvalidInput(f"--where is a list of expressions, not {type(texts).__name__}")
    clauses = {str(c): c for c in (parse(t) for t in texts)}
    if len(clauses) > MAX_CLAUSES:
        raise InvalidInput(f"at most {MAX_CLAUSES} --where expressions, got {len(clauses)}")
    return tuple(clauses[k] for k in sorted(clauses))


def compile_all(clauses: Iterable[Clause]) -> str:
    """Clauses in the form Lua evaluates: their `Clause.compiled` forms, one a line."""
    return "\n".join(c.compiled() for c in clauses)


def decompile(text: str) -> tuple[Clause, ...]:
    """Compiled clauses (`compile_all`, as a task hash keeps them) back to clauses (a line
    that is not one is left out)."""
    out = []
    for line in text.splitlines():
        key, op, *encoded = line.split("\t")
        values = tuple(v for v in (decode(e) for e in encoded) if v is not None)
        if op in OPERATORS and KEY_RE.fullmatch(key):
            out.append(Clause(key, op, values))
    return tuple(out)


def where_texts(values: object) -> tuple[str, ...]:
    """``--where`` expressions (a str is one) as their canonical texts, sorted: what a task
    spec keeps (InvalidInput for a malformed one)."""
    return tuple(str(c) for c in parse_all(values))  # type: ignore[arg-type]


def compiled_of(texts: Iterable[str]) -> str:
    """The compiled form of canonical ``--where`` texts (what submit.lua gets)."""
    return compile_all(parse_all(list(texts)))


def matches_all(clauses: Iterable[Clause], attrs: Mapping[str, Value]) -> bool:
    """Whether ``attrs`` satisfy every clause."""
    return all(c.matches(attrs) for c in clauses)


def keys_of(clauses: Iterable[Clause]) -> set[str]:
    return {c.key for c in clauses}


def why_none(clause: Clause, seen: Iterable[Mapping[str, Value]]) -> str:
    """Why none of the devices whose attributes are ``seen`` satisfies ``clause``:
    ``none has sdk>=35 (highest: 34)``, ``none has attribute gps``..."""
    values = [a[clause.key] for a in seen if clause.key in a]
    if not values:
        return f"none has attribute {clause.key}"
    base = f"none has {clause}"
    ordered = [v for v in values if _compare(v, values[0]) in (-1, 0, 1)]
    if clause.op in (">", ">=") and ordered:
        return f"{base} (highest: {shown(_extreme(ordered, 1))})"
    if clause.op in ("<", "<=") and ordered:
        return f"{base} (lowest: {shown(_extreme(ordered, -1))})"
    distinct = sorted({_literal(v) for v in values})
    more = f", {len(distinct) - 5} more" if len(distinct) > 5 else ""
    return f"{base} (seen: {', '.join(distinct[:5])}{more})"


def _extreme(values: list[Value], sign: int) -> Value:
    best = values[0]
    for v in values[1:]:
        c = _compare(v, best)
        if isinstance(c, int) and c * sign > 0:
            best = v
    return best


def valid_key(text: str) -> bool:
    return bool(KEY_RE.fullmatch(text))
