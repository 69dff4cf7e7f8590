"""Lua by include: each script names the helper files of ``lua/lib/`` it uses
(``--- @include "lib/NAME"``), and ``deviceq.core.scripts`` sends it with those files,
resolved transitively, dependencies first, each once.

The resolver on its own (order, deduplication, transitive includes, a missing file, a cycle),
then a guard over the real files: with a small Lua lexer (strings and comments skipped), every
function a script (or helper file) calls is its own, a builtin or defined by what it includes;
every helper name it refers to comes from a file it includes directly; and it includes no file
it does not use, so a script carries only what it uses."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from deviceq.core.config import PoolConfig
from deviceq.core.lua_prune import prune
from deviceq.core.scripts import (
    IncludeError,
    assemble,
    includes,
    library,
    lua_dir,
    names,
    read,
    resolve,
    source,
)
from deviceq.core.vocabulary import GENERATED_INCLUDES

# -- the resolver ----------------------------------------------------------------------------


def inc(*names: str) -> str:
    return "".join(f'--- @include "{n}"\n' for n in names)


def reader(files: dict[str, str]) -> Callable[[str], str | None]:
    return files.get


def test_includes_are_the_leading_lines() -> None:
    text = inc("lib/a", "lib/b") + "-- x.lua: a script\nreturn 1\n"
    assert includes(text, "x") == ["lib/a", "lib/b"]
    assert includes("-- no includes\nreturn 1\n", "x") == []
    assert includes("", "x") == []


@pytest.mark.parametrize(
    "text",
    [
        '-- x.lua\n--- @include "lib/a"\nreturn 1\n',  # not among the first lines
        '--- @include "lib/a"\n\n--- @include "lib/b"\n',  # after a blank line
        "--- @include lib/a\n",  # not quoted
        '--- @include "lib/../a"\n',  # not a plain name
        '--- @include "lib/a.lua"\n',  # with the suffix
    ],
)
def test_a_misplaced_or_malformed_include_is_an_error(text: str) -> None:
    with pytest.raises(IncludeError, match="x: .*among the first lines"):
        includes(text, "x")


def test_dependencies_come_first_in_include_order() -> None:
    files = {
        "lib/base": "local P = KEYS[1]\n",
        "lib/a": inc("lib/base") + "local function a() end\n",
        "lib/b": inc("lib/base") + "local function b() end\n",
        "lib/c": inc("lib/b", "lib/a") + "local function c() end\n",
    }
    assert resolve(["lib/a", "lib/b"], reader(files), "x") == ["lib/base", "lib/a", "lib/b"]
    assert resolve(["lib/b", "lib/a"], reader(files), "x") == ["lib/base", "lib/b", "lib/a"]
    # transitive: c brings b and a (in c's order), each after base
    assert resolve(["lib/c"], reader(files), "x") == ["lib/base", "lib/b", "lib/a", "lib/c"]


def test_a_file_included_twice_is_sent_once() -> None:
    files = {
        "lib/base": "",
        "lib/a": inc("lib/base"),
        "lib/b": inc("lib/base", "lib/a"),
    }
    got = resolve(["lib/a", "lib/b", "lib/base", "lib/a"], reader(files), "x")
    assert got == ["lib/base", "lib/a", "lib/b"]


def test_a_missing_include_names_the_file_and_who_includes_it() -> None:
    files = {"lib/a": inc("lib/gone")}
    with pytest.raises(IncludeError, match=r"lib/a includes 'lib/gone': there is no lua/lib/gone"):
        resolve(["lib/a"], reader(files), "x")
    with pytest.raises(IncludeError, match=r"^x includes 'lib/nope'"):
        resolve(["lib/nope"], reader(files), "x")


def test_a_cycle_is_an_error_naming_it() -> None:
    files = {
        "lib/a": inc("lib/b"),
        "lib/b": inc("lib/c"),
        "lib/c": inc("lib/a"),
    }
    with pytest.raises(IncludeError, match=r"include cycle: lib/a -> lib/b -> lib/c -> lib/a"):
        resolve(["lib/a"], reader(files), "x")
    with pytest.raises(IncludeError, match=r"include cycle: lib/s -> lib/s"):
        resolve(["lib/s"], reader({"lib/s": inc("lib/s")}), "x")


def test_a_diamond_is_no_cycle() -> None:
    files = {
        "lib/d": "",
        "lib/b": inc("lib/d"),
        "lib/c": inc("lib/d"),
        "lib/a": inc("lib/b", "lib/c"),
    }
    assert resolve(["lib/a"], reader(files), "x") == ["lib/d", "lib/b", "lib/c", "lib/a"]


def test_the_sent_text_is_defaults_then_the_library_then_the_script() -> None:
    for name in names():
        body = (lua_dir() / f"{name}.lua").read_text()
        libs = library(name, body)
        assert libs, name
        expected = PoolConfig.lua_defaults() + "\n".join([*(text_of(lib) for lib in libs), body])
        assert assemble(body, name, pruned=False) == expected
        assert source(name) == prune(expected)
        assert libs[0] == "lib/base", name  # every other file builds on it


def test_assembled_snippets_run(real_r: redis.Redis) -> None:
    text = inc("lib/base") + "return k('x', 'y')"
    assert real_r.eval(assemble(text), 1, "dq:{p}:") == "dq:{p}:x:y"
    with pytest.raises(redis.ResponseError, match="nonexistent global variable 'cfg'"):
        real_r.eval(assemble(inc("lib/base") + "return cfg('lease_ttl')"), 1, "dq:{p}:")
    assert real_r.eval(assemble(inc("lib/config") + "return cfg('lease_ttl')"), 1, "dq:{p}:") == 60


# -- a small Lua lexer -----------------------------------------------------------------------

KEYWORDS = frozenset(
    re.findall(
        r"\w+",
        "and break do else elseif end false for function if in local nil not or repeat return "
        "then true until while",
    )
)
BUILTINS = frozenset(
    re.findall(  # the Lua 5.1 base library and the globals Redis scripts get
        r"\w+",
        "assert error ipairs next pairs pcall select tonumber tostring type unpack xpcall "
        "setmetatable getmetatable rawget rawset rawequal print loadstring "
        "redis string table math cjson cmsgpack bit struct KEYS ARGV",
    )
)
HEADER = frozenset({"setting", "text_default"})  # PoolConfig.lua_defaults()
assert all(f"local function {h}(" in PoolConfig.lua_defaults() for h in HEADER)

_TOKEN = re.compile(
    r"""(?P<space>\s+)
    |(?P<comment>--(?:\[(?P<ceq>=*)\[.*?\](?P=ceq)\]|[^\n]*))
    |(?P<long>\[(?P<leq>=*)\[.*?\](?P=leq)\])
    |(?P<str>'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*")
    |(?P<name>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<num>0[xX][0-9a-fA-F]+|\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)
    |(?P<op>\.\.\.|\.\.|==|~=|<=|>=|[-+*/%^\#<>=(){}\[\];:,.])""",
    re.S | re.X,
)


@dataclass
class Tok:
    kind: str  # name, str, num, op
    text: str


def tokens(text: str) -> list[Tok]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        assert m, f"cannot lex at {text[pos : pos + 40]!r}"
        pos = m.end()
        kind = m.lastgroup
        if kind in ("space", "comment"):
            continue
        out.append(Tok("str" if kind == "long" else str(kind), m.group()))
    return out


@dataclass
class Lua:
    """What a Lua file defines and refers to."""

    top: list[str] = field(default_factory=list)  # names defined at the top level, in order
    defined: set[str] = field(default_factory=set)  # every name it defines (any depth)
    refs: list[tuple[int, str]] = field(default_factory=list)  # (token index, free name)
    calls: set[str] = field(default_factory=set)  # names it calls: NAME( / NAME'..' / NAME{..}
    decl_at: dict[str, int] = field(default_factory=dict)  # top-level name -> token index


def analyse(text: str) -> Lua:
    toks = tokens(text)
    out = Lua()
    depth = 0  # block depth: function / if / do / repeat open a block, end / until close it
    brackets: list[str] = []
    declaring = False  # after `local` (names up to `=`, `in` or the statement's end)
    params = False  # inside a function's parameter list
    for i, t in enumerate(toks):
        prev = toks[i - 1] if i else Tok("op", ";")
        nxt = toks[i + 1] if i + 1 < len(toks) else Tok("op", ";")
        if t.kind == "op":
            if t.text in "([{":
                brackets.append(t.text)
            elif t.text in ")]}":
                brackets.pop()
                if t.text == ")":
                    params = False
            elif t.text == "=" or t.text == ";":
                declaring = False
            continue
        if t.kind != "name":
            continue
        if t.text in KEYWORDS:
            if t.text in ("function", "if", "do", "repeat"):
                depth += 1
            elif t.text in ("end", "until"):
                depth -= 1
            if t.text == "function":
                params = True
            elif t.text == "local":
                declaring = True
            elif t.text != "function" and declaring:
                declaring = False  # `local x in`, or a statement after a bare `local x`
            if t.text == "for":
                declaring = True  # for NAME[, NAME] = / in
            continue
        if prev.kind == "op" and prev.text in (".", ":"):
            continue  # a field or method name
        if declaring and prev.text not in ("local", ",", "for", "function"):
            declaring = False  # a new statement after a bare `local x`
        if brackets and brackets[-1] == "{" and nxt.text == "=" and prev.text in ("{", ",", ";"):
            continue  # a table constructor's key
        if prev.text == "function" or declaring or (params and brackets and brackets[-1] == "("):
            out.defined.add(t.text)
            if depth == (1 if prev.text == "function" else 0) and not brackets:
                out.top.append(t.text)
                out.decl_at.setdefault(t.text, i)
            if prev.text == "function" and not (i >= 2 and toks[i - 2].text == "local"):
                raise AssertionError(f"global function {t.text}: every function is local")
            continue
        out.refs.append((i, t.text))
        if nxt.text == "(" or nxt.kind == "str" or nxt.text == "{":
            out.calls.add(t.text)
    assert depth == 0 and not brackets, "unbalanced blocks or brackets"
    return out


def test_the_lexer_skips_strings_and_comments() -> None:
    lua = analyse(
        "local function f(a, b) return g(a) .. 'h(x)' .. \"i(y)\" end -- j(z)\n"
        "--[[ k(w) ]] local t = {l = 1, m(2)} [==[ n(3) ]==] o{p = 1} q'r'\n"
        "local s, u = t.v(1), t:w(2)"
    )
    assert lua.top == ["f", "t", "s", "u"]
    assert lua.defined == {"f", "a", "b", "t", "s", "u"}
    assert lua.calls == {"g", "m", "o", "q"}
    assert {n for _, n in lua.refs} == {"g", "a", "m", "o", "q", "t"}


# -- the guard over the real files -------------------------------------------------------------


def lib_files() -> list[str]:
    return sorted(f"lib/{p.stem}" for p in (lua_dir() / "lib").glob("*.lua"))


def gen_files() -> list[str]:
    """The generated includes (``gen/NAME``, from ``deviceq.core.vocabulary``)."""
    return sorted(GENERATED_INCLUDES)


def text_of(name: str) -> str:
    if name.startswith("gen/"):
        text = read(name)
        assert text is not None, name
        return text
    return (lua_dir() / f"{name}.lua").read_text()


def providers() -> dict[str, str]:
    """Each top-level name of a helper file (or generated include) -> that file (names are
    unique across them)."""
    out: dict[str, str] = {}
    for lib in lib_files() + gen_files():
        for n in analyse(text_of(lib)).top:
            assert n not in out or out[n] == lib, f"{n} is defined by {out[n]} and {lib}"
            assert n not in HEADER | BUILTINS | KEYWORDS, (lib, n)
            out[n] = lib
    return out


def all_files() -> Iterator[str]:
    yield from names()
    yield from lib_files()


def test_lua_lib_replaces_the_single_library_file() -> None:
    assert not (lua_dir() / "_lib.lua").exists()
    assert "_lib" not in names() and len(names()) >= 20
    assert len(lib_files()) >= 14


@pytest.mark.parametrize("name", list(all_files()))
def test_a_file_calls_only_what_it_defines_or_includes(name: str) -> None:
    """Every function a file calls is a builtin, its own, or defined at the top level of a file
    it resolves to; every helper name it refers to is defined by a file it includes directly;
    and it includes exactly the files whose names it refers to (no unused include)."""
    text = text_of(name)
    lua = analyse(text)
    own = set(lua.defined)
    by = providers()
    resolved = library(name, text)
    available = {n for lib in resolved for n in analyse(text_of(lib)).top}
    undefined = lua.calls - own - available - BUILTINS - HEADER
    assert not undefined, f"{name} calls {sorted(undefined)}: defined by none of {resolved}"
    free = {n for _, n in lua.refs if n not in own}
    unknown = free - set(by) - BUILTINS - HEADER
    assert not unknown, f"{name} refers to undefined names {sorted(unknown)}"
    used = {by[n] for n in free if n in by}
    direct = includes(text, name)
    assert len(direct) == len(set(direct)), f"{name} includes a file twice"
    assert not used - set(direct), f"{name} uses {sorted(used - set(direct))} without including it"
    assert not set(direct) - used, (
        f"{name} includes {sorted(set(direct) - used)} but uses nothing of it"
    )


@pytest.mark.parametrize("name", lib_files())
def test_a_helper_file_uses_its_own_names_after_declaring_them(name: str) -> None:
    """A local referred to above its declaration would be a (missing) global in Lua: only a
    forward declaration (``local f`` ... ``f = function``) lets functions call each other."""
    lua = analyse(text_of(name))
    for i, n in lua.refs:
        if n in lua.decl_at:
            assert lua.decl_at[n] < i, f"{name}: {n} used before its declaration"


def test_only_the_mutually_recursive_helpers_are_declared_ahead() -> None:
    ahead = {}
    for lib in lib_files():
        for m in re.finditer(r"^(\w+) = function", text_of(lib), re.M):
            ahead[m.group(1)] = lib
    assert ahead == {"gang_end": "lib/outcomes"}


def test_a_script_carries_less_than_the_whole_library() -> None:
    whole = sum(len(text_of(lib)) for lib in lib_files() + gen_files())
    sizes = {n: sum(len(text_of(lib)) for lib in library(n, text_of(n))) for n in names()}
    assert max(sizes.values()) < whole
    assert sizes["heads"] < whole / 5, sizes


def test_the_readme_lists_every_helper_file_with_its_includes() -> None:
    readme = (Path(__file__).resolve().parents[2] / "lua" / "README.md").read_text()
    rows = re.findall(r"^\| `(lib/\w+)\.lua` \| .* \| ([^|]*) \|$", readme, re.M)
    listed = {name: [] if deps.strip() == "—" else deps.strip().split(", ") for name, deps in rows}
    assert sorted(listed) == lib_files()
    for name, deps in listed.items():
        want = [d if d.startswith("gen/") else "lib/" + d for d in deps]
        assert want == includes(text_of(name), name), name
