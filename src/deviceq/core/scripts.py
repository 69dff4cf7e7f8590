"""Loads the Lua transitions from ``lua/`` and runs them, mapping error replies to types.

The scripts live at the repository root in ``lua/``; a built wheel carries them as the package
data folder ``deviceq/lua``. Each script is sent as the settings' defaults and bounds
(``PoolConfig.lua_defaults``) + the helper files it includes + the script, without the helper
functions it never calls (`deviceq.core.lua_prune`). A Lua file (script
or helper) names the helper files it uses in its first lines, one ``--- @include "lib/NAME"``
line each (``lua/lib/NAME.lua``); they are resolved transitively, each file after the files it
includes and once only, so a script carries the helpers it uses and nothing else. An include
``gen/NAME`` is generated from ``deviceq.core.vocabulary`` (`vocabulary.lua_include`: the task
statuses, failure kinds and other sets the scripts test names against) or, for ``gen/limits``,
from the declared limits (`deviceq.core.limits`), not read from a file.

A call is ``EVALSHA`` (the fast path: only the digest travels). When the server does not know
the script (``NOSCRIPT``: a restarted or failed-over server, a ``SCRIPT FLUSH``), the call is
sent again as ``EVAL`` with the whole body, which runs it and caches it server-side, so the
next call is an ``EVALSHA`` again. No ``SCRIPT`` command is ever sent (``SCRIPT LOAD`` and
``SCRIPT EXISTS`` are script management, which deviceq's Redis users are not given: see
``deviceq acl``). Queued on a pipeline (``client=pipe``) a call is an ``EVAL``: its reply is
only known when the pipeline runs, too late to fall back, and an ``EVAL`` never answers
``NOSCRIPT`` (it costs the body's bytes, 6-40 KB, per call)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import redis
from redis.client import Pipeline
from redis.exceptions import NoScriptError

from .errors import DeviceqError, error_codes, from_reply
from .lane import lane_of
from .lua_prune import prune
from .vocabulary import lua_include


class IncludeError(DeviceqError):
    """A Lua file's ``--- @include`` lines are malformed, name a missing file or form a cycle."""


_INCLUDE = re.compile(r'--- @include "([a-z0-9_]+(?:/[a-z0-9_]+)*)"[ \t]*')


def lua_dir() -> Path:
    """The folder holding the ``.lua`` files: inside the installed package (wheel) or, for an
    editable install / source checkout, ``lua/`` at the repository root."""
    packaged = resources.files("deviceq") / "lua"
    if packaged.is_dir():
        return Path(str(packaged))
    source = Path(__file__).resolve().parents[3] / "lua"
    if source.is_dir():
        return source
    raise DeviceqError("deviceq's Lua scripts are missing from this installation")


def includes(text: str, where: str) -> list[str]:
    """The files Lua text ``where`` includes directly, in order: its leading
    ``--- @include "NAME"`` lines (NAME relative to ``lua/``, without ``.lua``). An include
    line anywhere else, or a malformed one, is an error (it would be silently ignored)."""
    out: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = _INCLUDE.fullmatch(line)
        if m:
            out.append(m.group(1))
            continue
        stray = next((x for x in lines[i:] if x.startswith("--- @include")), None)
        if stray is not None:
            raise IncludeError(
                f'{where}: {stray!r}: an include is a line --- @include "lib/NAME" among the '
                "first lines of the file"
            )
        break
    return out


def resolve(roots: Sequence[str], read: Callable[[str], str | None], where: str) -> list[str]:
    """Every file ``where`` needs for its direct includes ``roots``: transitively, each file
    after the files it includes (depth first, in include order), each once. ``read(name)``
    gives a file's text, or None when there is no such file."""
    order: list[str] = []
    done: set[str] = set()
    chain: list[str] = [where]

    def visit(name: str) -> None:
        if name in done:
            return
        if name in chain:
            cycle = chain[chain.index(name) :] + [name]
            raise IncludeError("include cycle: " + " -> ".join(cycle))
        text = read(name)
        if text is None:
            what = "generated include" if name.startswith("gen/") else f"lua/{name}.lua"
            raise IncludeError(f"{chain[-1]} includes {name!r}: there is no {what}")
        chain.append(name)
        for dep in includes(text, name):
            visit(dep)
        chain.pop()
        done.add(name)
        order.append(name)

    for root in roots:
        visit(root)
    return order


def read(name: str) -> str | None:
    """The text of include ``name``: generated for ``gen/NAME`` (`vocabulary.lua_include`),
    else ``lua/NAME.lua``; None when there is no such include."""
    if name.startswith("gen/"):
        return lua_include(name)
    path = lua_dir() / f"{name}.lua"
    return path.read_text() if path.is_file() else None


def library(name: str, text: str) -> list[str]:
    """The helper files Lua text ``text`` (named ``name`` in errors) is sent with, in order."""
    return resolve(includes(text, name), read, name)


def assemble(text: str, name: str = "snippet", *, pruned: bool = True) -> str:
    """The full text sent to Redis for Lua text ``text``: the generated settings functions, the
    helper files it includes (transitively, in order), then ``text`` itself; ``pruned``:
    without the helper functions nothing in it calls (`deviceq.core.lua_prune`: Redis makes
    every function of the text again at every call)."""
    from .config import PoolConfig  # (pydantic_settings: not for a client that only reads)

    parts = [read(lib) or "" for lib in library(name, text)]
    whole = PoolConfig.lua_defaults() + "\n".join([*parts, text])
    return prune(whole) if pruned else whole


@cache
def names() -> tuple[str, ...]:
    """Every transition script: each ``lua/NAME.lua`` (the helpers are in ``lua/lib/``)."""
    return tuple(sorted(p.stem for p in lua_dir().glob("*.lua")))


@cache
def source(name: str) -> str:
    """The full text sent to Redis for script ``name``."""
    if name not in names():
        raise KeyError(name)
    return assemble((lua_dir() / f"{name}.lua").read_text(), name)


@cache
def sha(name: str) -> str:
    """The SHA-1 digest Redis knows script ``name`` by (of its UTF-8 text, as sent)."""
    return hashlib.sha1(source(name).encode()).hexdigest()


def _is_pipeline(client: Any) -> bool:
    """True for a redis-py pipeline (commands are queued, replies come with ``execute``).
    Known per type (redis-py's client classes are typing Protocols: an ``isinstance``
    against one costs a few µs, and every script call asks)."""
    kind = type(client)
    known = _PIPELINE_TYPES.get(kind)
    if known is None:
        known = _PIPELINE_TYPES[kind] = _pipeline_type(kind)
    return known


_PIPELINE_TYPES: dict[type, bool] = {}


def _pipeline_type(kind: type) -> bool:
    if issubclass(kind, Pipeline):
        return True
    try:
        from redis.cluster import ClusterPipeline
    except ImportError:  # pragma: no cover - every supported redis-py has it
        return False
    return issubclass(kind, ClusterPipeline)


class Scripts:
    """The transitions of one Redis connection, callable by name (each script's text is
    assembled on its first call: a client that only reads builds none)."""

    def __init__(self, r: redis.Redis) -> None:
        self._r = r

    def run(self, name: str, prefix: str, args: list[Any], client: Any = None) -> Any:
        """Run script ``name`` on the pool ``prefix`` (EVALSHA, falling back to EVAL of the
        body on NOSCRIPT); raise a typed DeviceqError for its error replies. On a plain
        standalone client the call takes the short path of `deviceq.core.lane` (same answers
        and errors). ``client`` may be a pipeline: the call is then queued as an EVAL and its
        reply (or error reply) comes with the pipeline's ``execute``."""
        text = source(name)  # (KeyError for an unknown name)
        target = self._r if client is None else client
        if _is_pipeline(target):
            return target.eval(text, 1, prefix, *args)
        lane = lane_of(target)
        try:
            if lane is not None:
                return lane.evalsha(sha(name), text, 1, prefix, *args)
            try:
                return target.evalsha(sha(name), 1, prefix, *args)
            except NoScriptError:
                return target.eval(text, 1, prefix, *args)
        except redis.ResponseError as exc:
            raise typed_error(exc) from None


def typed_error(exc: redis.ResponseError) -> Exception:
    """A script's error reply as its typed `DeviceqError` (``exc`` itself for any other)."""
    return from_reply(_strip(str(exc))) or exc


_CODES = error_codes()


def _strip(message: str) -> str:
    # Redis 7 returns the error_reply text verbatim; older servers/fakeredis may wrap it.
    for code in _CODES:
        pos = message.find(code + " ")
        if pos != -1:
            return message[pos:]
    return message
