"""The helper functions a script never calls are left out of what is sent
(`deviceq.core.lua_prune`): only the unreachable ones, every script still compiles and runs,
and a text that breaks the layout the pruning relies on is refused, not half pruned."""

from __future__ import annotations

import re

import pytest
import redis

from deviceq.core.lua_prune import PruneError, prune
from deviceq.core.scripts import assemble, lua_dir, names, source

TEXT = """local P = KEYS[1]
local function a(x)
  return b(x) .. 'a'
end
local function b(x)
  return x
end
local function unused(x)
  return c(x)
end
local function c(x)
  return x
end
local function self_only(n)
  if n > 0 then return self_only(n - 1) end
  return 0
end
local function one() return 1 end
return a(P)"""


def defined(text: str) -> set[str]:
    return set(re.findall(r"^local function (\w+)", text, re.M))


def test_only_what_nothing_reaches_is_dropped() -> None:
    out = prune(TEXT)
    # a is called by the body, b by a; unused and self_only by nothing (a function calling
    # itself is no use), c only by unused; a one-line function is always kept
    assert defined(out) == {"a", "b", "one"}
    assert out.endswith("return a(P)") and out.startswith("local P = KEYS[1]\n")
    assert prune(out) == out


def test_a_name_defined_twice_keeps_both_definitions() -> None:
    text = "local function f()\n  return 1\nend\nlocal function f()\n  return 2\nend\nreturn 0"
    assert prune(text) == text


@pytest.mark.parametrize(
    "text",
    [
        "local function f()\n  return 1\nreturn f()",  # no closing end in the first column
        "local function f()\n  return 1\nlocal function g()\n  return 2\nend\nreturn f()",
    ],
)
def test_a_function_without_its_closing_end_is_refused(text: str) -> None:
    with pytest.raises(PruneError, match="has no closing 'end'"):
        prune(text)


@pytest.mark.parametrize("name", names())
def test_every_script_is_sent_pruned_and_keeps_what_it_calls(name: str) -> None:
    """What is sent is the pruned assembly; what was dropped is named nowhere else in it."""
    text = source(name)
    whole = assemble((lua_dir() / f"{name}.lua").read_text(), name, pruned=False)
    assert text == prune(whole) and len(text) < len(whole)
    for gone in defined(whole) - defined(text):
        assert not re.search(rf"\b{gone}\b", text), (name, gone)


@pytest.mark.parametrize("name", names())
def test_every_pruned_script_compiles_on_redis(real_r: redis.Redis, name: str) -> None:
    """Loaded into a real Redis (compiled, not run): nothing it needs was dropped at compile
    time; the transition tests run each of them."""
    sha = real_r.script_load(source(name))
    assert real_r.script_exists(sha) == [True]
