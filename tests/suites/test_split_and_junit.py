"""The pure parts of suites: the balanced split (longest first) against round-robin and the
best split found by brute force, the fewest shards for a deadline, the ETA's placement, the
tests file, and JUnit files read safely (defusedxml refuses what could expand or reach out)."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceq import InvalidInput
from deviceq.suites import junit, sharding
from deviceq.suites.eta import eta
from deviceq.suites.model import MAX_TESTS, parse_tests


def best_makespan(durs: list[float], shards: int) -> float:
    """The optimum by brute force (small inputs only)."""
    best = float("inf")
    for owner in itertools.product(range(shards), repeat=len(durs)):
        loads = [0.0] * shards
        for d, o in zip(durs, owner, strict=True):
            loads[o] += d
        best = min(best, max(loads))
    return best


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(0.1, 100), min_size=1, max_size=8), st.integers(1, 3))
def test_the_balanced_split_is_within_four_thirds_of_the_best(durs: list[float], n: int) -> None:
    tests = [f"t{i}" for i in range(len(durs))]
    est = dict(zip(tests, durs, strict=True))
    split = sharding.balance(tests, est, n)
    assert sorted(t for s in split for t in s) == sorted(tests)  # every test once
    assert all(split) and len(split) == min(n, len(tests))
    assert all(s == [t for t in tests if t in s] for s in split)  # the file's order kept
    assert sharding.makespan(split, est) <= best_makespan(durs, n) * 4 / 3 + 1e-9


def test_the_balanced_split_beats_round_robin_on_a_skewed_suite() -> None:
    rnd = random.Random(3)
    tests = [f"t{i}" for i in range(400)]
    est = {t: rnd.lognormvariate(0, 1) for t in tests}
    lpt = sharding.makespan(sharding.balance(tests, est, 10), est)
    rr = sharding.makespan(sharding.round_robin(tests, 10), est)
    assert lpt <= sharding.ideal(est, 10) * 1.02 < rr
    assert sharding.balance(tests, est, 10) == sharding.balance(tests, est, 10)  # determined


def test_unseen_tests_get_the_median_of_the_known_ones() -> None:
    est = sharding.estimates(["a", "b", "c", "new"], {"a": 1.0, "b": 3.0, "c": 10.0})
    assert est["new"] == 3.0
    assert sharding.estimates(["x"], {}) == {"x": 30.0}


def test_a_deadline_takes_the_fewest_shards_that_meet_it() -> None:
    tests = [f"t{i}" for i in range(12)]
    est = dict.fromkeys(tests, 10.0)
    assert sharding.shards_for_deadline(tests, est, 40, 10, 10) == 3
    assert sharding.shards_for_deadline(tests, est, 41, 10, 10, overhead_s=1) == 3
    with pytest.raises(sharding.Unsatisfiable, match="^unsatisfiable: needs 12 devices, 5 match$"):
        sharding.shards_for_deadline(tests, est, 10, 20, 5)
    with pytest.raises(sharding.Unsatisfiable, match="needs 4 devices, --max-devices is 3"):
        sharding.shards_for_deadline(tests, est, 30, 3, 10)
    with pytest.raises(sharding.Unsatisfiable, match="longest test takes 10s"):
        sharding.shards_for_deadline(tests, est, 9, 20, 20)


def test_the_eta_places_the_longest_shards_first_on_the_devices_free_first() -> None:
    assert eta([5, 3, 2], [0, 0]) == 5
    assert eta([4, 4], [0, 10]) == 8  # the busy device is never needed
    assert eta([], [0], running=[7]) == 7
    assert eta([3], [], running=[2]) == 5  # after the running shard, on its device
    assert eta([1], []) == float("inf")


def test_the_tests_file_is_checked_line_by_line() -> None:
    assert parse_tests("# smoke\na#b\n\n  c  \n") == ["a#b", "c"]
    for text, msg in [("a\na\n", "line 2: test 'a' is listed twice"), ("", "no test listed"),
                      ("a\x01b\n", "control characters"), ("x" * 301, "1-300 bytes")]:  # fmt: skip
        with pytest.raises(InvalidInput, match=msg):
            parse_tests(text)
    with pytest.raises(InvalidInput, match=f"more than {MAX_TESTS}"):
        parse_tests("\n".join(f"t{i}" for i in range(MAX_TESTS + 1)))


def test_junit_results_are_read_from_either_root_and_matched_by_any_form() -> None:
    xml = b"""<testsuites><testsuite name="s">
      <testcase classname="com.A" name="ok" time="1.5"/>
      <testcase classname="com.A" name="bad" time="2"><failure message="boom"/></testcase>
      <testcase classname="com.A" name="err"><error message="npe"/></testcase>
      <testcase classname="com.A" name="skip"><skipped/></testcase>
      <testcase name="bare" time="-3"/>
    </testsuite></testsuites>"""
    cases = junit.parse(xml)
    assert [(c.test, c.status, c.duration_s) for c in cases] == [
        ("com.A#ok", "passed", 1.5), ("com.A#bad", "failed", 2.0), ("com.A#err", "error", None),
        ("com.A#skip", "skipped", None), ("bare", "passed", None),
    ]  # fmt: skip
    found = junit.match(["com.A#ok", "com.A.bad", "com.A::err", "bare", "absent"], cases)
    assert {t: c.status for t, c in found.items()} == {
        "com.A#ok": "passed", "com.A.bad": "failed", "com.A::err": "error", "bare": "passed",
    }  # fmt: skip
    assert found["com.A.bad"].message == "boom"
    one = junit.parse(b'<testsuite><testcase classname="c" name="n"/></testsuite>')
    assert [c.test for c in one] == ["c#n"]


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b'<!DOCTYPE t [<!ENTITY a "aaaa">]><testsuite><testcase name="&a;"/></testsuite>',
         "refused"),
        (b'<!DOCTYPE t SYSTEM "http://example.invalid/x.dtd"><testsuite/>', "refused"),
        (b"<testsuite><testcase", "not XML"),
        (b"<html/>", "not JUnit XML"),
        (b" " * (junit.MAX_JUNIT_BYTES + 1), "more than"),
    ],
)  # fmt: skip
def test_hostile_or_broken_junit_is_refused(data: bytes, why: str) -> None:
    with pytest.raises(InvalidInput, match=why):
        junit.parse(data)


def test_junit_globs_match_at_any_depth() -> None:
    assert junit.matches("junit.xml", "**/junit*.xml")
    assert junit.matches("reports/junit-1.xml", "**/junit*.xml")
    assert not junit.matches("log.txt", "**/junit*.xml")
