"""Drops the helper functions an assembled Lua script never calls.

Redis runs a script's whole body at every call, so every top-level ``local function`` of the
helper files it includes is made again (a closure, its upvalues) at every call, used or not: a
script that includes ``lib/outcomes`` for one helper pays for all of them. `prune` keeps only
the top-level ``local function`` definitions reachable from the rest of the text (the script
itself and the top-level statements of its helpers), following calls from function to
function. It works on the layout the Lua files keep: a multi-line top-level function starts
with ``local function NAME(`` in the first column and ends at the next line that is ``end`` in
the first column. It is conservative: any occurrence of a name (in code, a string or a
comment) keeps its function, a name defined twice is always kept, and everything that is not
such a function (one-line functions, top-level locals and statements) is left as it is."""

from __future__ import annotations

import re
from dataclasses import dataclass

_DEF = re.compile(r"local function ([A-Za-z_][A-Za-z0-9_]*)\s*\(")
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class PruneError(ValueError):
    """A top-level function of the text does not follow the layout `prune` relies on."""


@dataclass(frozen=True)
class _Function:
    name: str
    start: int  # index of its ``local function`` line
    end: int  # index of its closing ``end`` line


def _functions(lines: list[str]) -> list[_Function]:
    out: list[_Function] = []
    i = 0
    while i < len(lines):
        m = _DEF.match(lines[i])
        if m is None or re.search(r"\bend\s*$", lines[i]):  # (a one-line function: kept)
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not re.match(r"end\b", lines[j]):
            if _DEF.match(lines[j]):
                raise PruneError(f"line {i + 1}: function {m.group(1)!r} has no closing 'end'")
            j += 1
        if j == len(lines):
            raise PruneError(f"line {i + 1}: function {m.group(1)!r} has no closing 'end'")
        out.append(_Function(m.group(1), i, j))
        i = j + 1
    return out


def _uses(lines: list[str], f: _Function) -> set[str]:
    """The names function ``f`` mentions (its own name on its definition line excepted)."""
    words = set(_WORD.findall("\n".join(lines[f.start + 1 : f.end + 1])))
    head = lines[f.start][_DEF.match(lines[f.start]).end() :]  # type: ignore[union-attr]
    return words | set(_WORD.findall(head))


def prune(text: str) -> str:
    """``text`` without the multi-line top-level ``local function`` definitions nothing else in
    it reaches (see the module's doc); the line numbers of what is kept change."""
    lines = text.split("\n")
    functions = _functions(lines)
    inside = [False] * len(lines)
    by_name: dict[str, list[_Function]] = {}
    for f in functions:
        by_name.setdefault(f.name, []).append(f)
        for i in range(f.start, f.end + 1):
            inside[i] = True
    outside = "\n".join(x for x, ins in zip(lines, inside, strict=True) if not ins)
    used = {name for name, fs in by_name.items() if len(fs) > 1}  # (defined twice: kept)
    todo = [w for w in set(_WORD.findall(outside)) | used if w in by_name]
    used.update(todo)
    while todo:
        for f in by_name[todo.pop()]:
            for w in _uses(lines, f):
                if w in by_name and w not in used:
                    used.add(w)
                    todo.append(w)
    keep = [True] * len(lines)
    for f in functions:
        if f.name not in used:
            keep[f.start : f.end + 1] = [False] * (f.end + 1 - f.start)
    kept = [x for x, k in zip(lines, keep, strict=True) if k]
    return "\n".join(kept)
