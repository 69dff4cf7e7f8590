"""The --where language: parsing, canonical text, evaluation, and why nothing matches."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from deviceq.core.attributes import (
    Version,
    check_attributes,
    decode,
    encode,
    infer,
    parse_assignments,
)
from deviceq.core.errors import InvalidInput
from deviceq.core.where import Clause, parse, parse_all, why_none

PHONE = check_attributes(
    {"sdk": 34, "model": "Pixel 8", "release": "14.1.2", "battery": 55, "charging": False}
)


def test_values_are_typed_by_their_text() -> None:
    assert infer("k", "34") == 34 and isinstance(infer("k", "34"), int)
    assert infer("k", "-1.5") == -1.5
    assert infer("k", "14.1.2") == Version((14, 1, 2))
    assert infer("k", "true") is True
    assert infer("k", "Pixel 8") == "Pixel 8"
    assert parse_assignments(['model="34"', "sdk=34"]) == {"model": "34", "sdk": 34}


@pytest.mark.parametrize(
    "bad",
    [{"Bad": 1}, {"k": 'a"b'}, {"x" * 33: 1}, {"k": "x" * 65}, {"k": "a\nb"}, {"k": float("nan")},
     {"k": 1e16}, {"k": [1]}, {f"k{i}": i for i in range(33)}],
)  # fmt: skip
def test_bad_attributes_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(InvalidInput):
        check_attributes(bad)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("sdk>=33", True),
        ("sdk>34", False),
        ("sdk = 34", True),
        ("sdk==34", True),
        ("sdk!=34", False),
        ("model in (Pixel 7, Pixel 8)", True),
        ("model in ('Pixel 7', \"Pixel 9\")", False),
        ("model=Pixel 8", True),
        ("has(battery)", True),
        ("has(gps)", False),
        ("gps!=1", False),  # absent: no comparison holds
        ("release>=14", True),
        ("release>=14.1.10", False),
        ("release<14.2", True),
        ("release=14.1.2.0", True),
        ("charging=false", True),
        ("charging!=true", True),
        ('sdk="34"', False),  # a quoted value is a string
        ("model<Q", True),
        ("charging in (0, false)", True),  # (0 and false are two values, not one)
    ],
)
def test_clauses_match_as_documented(expr: str, expected: bool) -> None:
    assert parse(expr).matches(PHONE) is expected


@pytest.mark.parametrize(
    "bad",
    ["", "sdk", "sdk >", "sdk>=", "Sdk>=3", "has()", "has(x y)", "sdk ~ 3", "x in (a, 'b)",
     "charging<true", "sdk>=3\nx=1", "model=a(b", "x" * 300],
)  # fmt: skip
def test_malformed_expressions_are_one_line_errors(bad: str) -> None:
    with pytest.raises(InvalidInput) as e:
        parse(bad)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("typo", ["sdk>>33", "sdk=>33", "sdk<<5", "model=!x", "sdk >= >3"])
def test_a_doubled_operator_is_refused_not_read_as_a_string(typo: str) -> None:
    with pytest.raises(InvalidInput, match="must be quoted"):
        parse(typo)
    assert parse('model=">x"').values == (">x",)  # quoted, such a string stays possible


def test_clauses_are_canonical_and_deduplicated() -> None:
    clauses = parse_all(["sdk >= 33", "sdk>=33", "has( gps )", "model in (Pixel 7,'34')"])
    assert [str(c) for c in clauses] == ["has(gps)", 'model in (Pixel 7, "34")', "sdk>=33"]
    for value in ("=x", "<y", "!z", ">=1"):  # (bare, these would read as an operator)
        clause = parse(f"k<'{value}'")
        assert clause.values == (value,) and parse(str(clause)) == clause
    with pytest.raises(InvalidInput):
        parse_all([f"sdk>={i}" for i in range(9)])


def test_why_none_names_the_closest_value() -> None:
    seen = [{"sdk": 33}, {"sdk": 34}, {"model": "x"}]
    assert why_none(parse("sdk>=35"), seen) == "none has sdk>=35 (highest: 34)"
    assert why_none(parse("sdk<30"), seen) == "none has sdk<30 (lowest: 33)"
    assert why_none(parse("has(gps)"), seen) == "none has attribute gps"
    assert why_none(parse("model=y"), seen) == "none has model=y (seen: x)"


TEXT = st.characters(min_codepoint=32, max_codepoint=0x24F, exclude_characters='\x7f"')
values = st.one_of(
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(-1e6, 1e6, allow_nan=False).map(lambda f: round(f, 3)),
    st.lists(st.integers(0, 40), min_size=2, max_size=4).map(lambda p: Version(tuple(p))),
    st.text(TEXT, max_size=12),
)


@given(values)
def test_a_value_survives_its_stored_form(v: object) -> None:
    try:
        (checked,) = check_attributes({"k": v}).values()
    except InvalidInput:  # (text reading as a number out of bounds, "1E100": refused)
        assume(False)
        return
    assert decode(encode(checked)) == checked


@given(values, st.sampled_from(["=", "!=", "<", "<=", ">", ">="]), values)
def test_a_clause_reads_back_from_its_text(a: object, op: str, b: object) -> None:
    try:
        (checked,) = check_attributes({"k": b}).values()
        attrs = check_attributes({"k": a})
    except InvalidInput:  # (text reading as a number out of bounds, "1E100": refused)
        assume(False)
        return
    if isinstance(checked, bool) and op not in ("=", "!="):
        return
    c = Clause("k", op, (checked,))
    again = parse(str(c))
    assert again.matches(attrs) == c.matches(attrs)
