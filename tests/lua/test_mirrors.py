"""Rules kept in both languages, each held to its mirror: the retry policy's parsing
(``retry_kinds`` / ``parse_backoff`` in lua/lib/retry.lua against
`deviceq.core.validation.check_retry_on` / ``check_retry_backoff``) and the id and tag checks
(``valid_id`` / ``valid_tag`` in lua/lib/args.lua against ``ID_RE`` / ``TAG_RE``). Real
Redis: the same strings through both, the same verdict."""

from __future__ import annotations

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deviceq.core.script_args import packb
from deviceq.core.scripts import assemble
from deviceq.core.validation import ID_RE, TAG_RE, check_retry_backoff, check_retry_on
from deviceq.core.vocabulary import RETRY_KINDS

VERDICTS = """--- @include "lib/args"
--- @include "lib/retry"
local words = cmsgpack.unpack(ARGV[1])
local out = {}
for i, w in ipairs(words) do
  out[i] = (retry_kinds(w) and 'o' or '-') .. (parse_backoff(w) and 'b' or '-') ..
    (valid_id(w) and 'i' or '-') .. (valid_tag(w) and 't' or '-')
end
return out
"""


def accepts(check: object, word: str) -> bool:
    try:
        check(word)  # type: ignore[operator]
    except ValueError:
        return False
    return True


def python_verdict(w: str) -> str:
    return (
        ("o" if accepts(check_retry_on, w) else "-")
        + ("b" if accepts(check_retry_backoff, w) else "-")
        + ("i" if ID_RE.fullmatch(w) else "-")
        + ("t" if TAG_RE.fullmatch(w) else "-")
    )


def lua_verdicts(r: redis.Redis, words: list[str]) -> list[str]:
    return [str(v) for v in r.eval(assemble(VERDICTS, "mirrors"), 1, "dq:{mirror}:", packb(words))]


SAMPLES = [
    "", "none", "None", ",", "infrastructure", "infrastructure,", ",timeout", "timeout,,timeout",
    ",".join(RETRY_KINDS), "timeout,rejected", "cancelled", "fixed:0", "fixed:1", "fixed:01",
    "fixed:999999", "fixed:999999.999", "fixed:1000000", "fixed:1.5", "fixed:1.", "fixed:.5",
    "fixed:1.2345", "fixed:-1", "fixed:", "fixed", "exponential:1:300", "exponential:0.5:60.25",
    "exponential:1", "exponential:1:2:3", "linear:1", "fixed:1e3", "fixed: 1", "fixed:1\n",
    "a", "a" * 64, "a" * 65, "a" * 128, "a" * 129, "-a", ".a", "a-b.c_d", "a=b/c+d", "a b",
    "é", "a\n", "1", "x:y",
]  # fmt: skip


def test_the_mirrored_rules_agree_on_chosen_strings(real_r: redis.Redis) -> None:
    assert lua_verdicts(real_r, SAMPLES) == [python_verdict(w) for w in SAMPLES]
    # (the samples reach both verdicts of every rule)
    for i in range(4):
        assert {python_verdict(w)[i] for w in SAMPLES} == {"-", "obit"[i]}


words = st.one_of(
    st.text(alphabet="abcdefghinoprstuxz_,:.=/+-0123456789 ", max_size=40),
    st.lists(st.sampled_from([*RETRY_KINDS, "none", "rejected"]), max_size=4).map(",".join),
    st.tuples(
        st.sampled_from(["fixed", "exponential"]),
        st.lists(st.from_regex(r"\A[0-9]{0,8}(\.[0-9]{0,5})?\Z", fullmatch=True), max_size=3),
    ).map(lambda t: ":".join([t[0], *t[1]])),
)


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(st.lists(words, min_size=1, max_size=50))
def test_the_mirrored_rules_agree_on_generated_strings(
    real_r: redis.Redis, batch: list[str]
) -> None:
    assert lua_verdicts(real_r, batch) == [python_verdict(w) for w in batch]
