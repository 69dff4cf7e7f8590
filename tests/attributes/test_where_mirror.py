"""The --where rule has two homes: `deviceq.core.where` (parsing, the scheduler's filter,
device list, explain) and ``lua/lib/where.lua`` (what a script re-checks atomically: gates,
a commit). Random attributes and clauses go through both on the real server; they must agree
on every one."""

from __future__ import annotations

import uuid

import redis
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from deviceq.core.attributes import Version, check_attributes, encode
from deviceq.core.errors import InvalidInput
from deviceq.core.scripts import assemble
from deviceq.core.where import Clause, compile_all, matches_all, parse

PROBE = """--- @include "lib/base"
--- @include "lib/where"
local failed = where_fails(ARGV[1], ARGV[2])
return failed and failed[1] .. ' ' .. failed[2] or ''
"""

TEXT = st.characters(min_codepoint=32, max_codepoint=0x24F, exclude_characters='\x7f"')
values = st.one_of(
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.integers(0, 40),
    st.floats(-1e4, 1e4, allow_nan=False).map(lambda f: round(f, 3)),
    st.sampled_from([0.5, 14.1, 14.0, 0.0001, 3.25, -2.5]),
    st.lists(st.integers(0, 12), min_size=2, max_size=4).map(lambda p: Version(tuple(p))),
    st.sampled_from(["Pixel 8", "Pixel 7", "a", "b", "Ä", "z", "", "14.1.2x"]),
    st.text(TEXT, max_size=6),
)
KEYS = ["a", "b", "c"]


def checked(value: object) -> object:
    """``value`` as an attribute holds it; a text reading as a number out of bounds ("1E16")
    is refused there, so it is no example."""
    try:
        return check_attributes({"k": value})["k"]
    except InvalidInput:
        reject()


@st.composite
def clauses(draw: st.DrawFn) -> Clause:
    key = draw(st.sampled_from(KEYS))
    op = draw(st.sampled_from(["=", "!=", "<", "<=", ">", ">=", "in", "has"]))
    if op == "has":
        return Clause(key, op)
    vals = tuple(checked(v) for v in draw(st.lists(values, min_size=1, max_size=3)))
    if op != "in":
        vals = vals[:1]
        if isinstance(vals[0], bool) and op not in ("=", "!="):
            op = "="
    return Clause(key, op, vals)


def test_lua_and_python_agree_on_every_clause(real_r: redis.Redis) -> None:
    pool = "where" + uuid.uuid4().hex[:10]
    prefix = f"dq:{{{pool}}}:"
    sha = real_r.script_load(assemble(PROBE))

    @settings(max_examples=1500, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(st.dictionaries(st.sampled_from(KEYS), values, max_size=3),
           st.lists(clauses(), min_size=1, max_size=3))  # fmt: skip
    def run(raw: dict[str, object], cs: list[Clause]) -> None:
        try:
            attrs = check_attributes(raw)
        except InvalidInput:  # (text reading as a number out of bounds: refused, no example)
            reject()
        key = f"{prefix}device:d1:attrs"
        real_r.delete(key)
        if attrs:
            real_r.hset(key, mapping={k: encode(v) for k, v in attrs.items()})
        failed = real_r.evalsha(sha, 1, prefix, "d1", compile_all(cs))
        assert (failed == "") == matches_all(cs, attrs), (attrs, [str(c) for c in cs], failed)
        if failed:
            first = next(c for c in cs if not c.matches(attrs))
            assert failed == f"{first.key} {first.op}"
        # and the clause's text parses back to the same rule
        for c in cs:
            assert parse(str(c)).matches(attrs) == c.matches(attrs)

    try:
        run()
    finally:
        real_r.delete(f"{prefix}device:d1:attrs")


def test_a_quoted_string_starting_with_an_operator_means_the_same_in_lua(
    real_r: redis.Redis,
) -> None:
    """`sdk>">33"` (quoted: the unquoted `sdk>>33` is refused) compiles to the string `>33`,
    which Lua compares as Python does."""
    pool = "where" + uuid.uuid4().hex[:10]
    prefix = f"dq:{{{pool}}}:"
    sha = real_r.script_load(assemble(PROBE))
    clause = parse('model>">33"')
    assert clause.values == (">33",) and parse(str(clause)) == clause
    key = f"{prefix}device:d1:attrs"
    try:
        for model in ("?", ">4", "=", "abc"):
            real_r.hset(key, "model", encode(model))
            failed = real_r.evalsha(sha, 1, prefix, "d1", compile_all([clause]))
            assert (failed == "") == clause.matches({"model": model}), model
    finally:
        real_r.delete(key)
