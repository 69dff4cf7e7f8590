"""Loads the Lua transitions from ``lua/`` and runs them, mapping error replies to types.

The scripts live at the repository root in ``lua/``; a built wheel carries them as the package
data folder ``deviceq/lua``. Each script is sent as ``DEFAULTS`` (generated from
``PoolConfig``) + ``_lib.lua`` + the script, and invoked by EVALSHA (redis-py reloads it after a
server restart or SCRIPT FLUSH)."""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import redis
from redis.commands.core import Script

from .config import PoolConfig
from .errors import DeviceqError, error_codes, from_reply


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


@cache
def names() -> tuple[str, ...]:
    """Every transition script: each ``lua/NAME.lua`` but the ``_lib.lua`` helpers."""
    return tuple(sorted(p.stem for p in lua_dir().glob("*.lua") if not p.stem.startswith("_")))


@cache
def source(name: str) -> str:
    """The full text sent to Redis for script ``name``."""
    if name not in names():
        raise KeyError(name)
    folder = lua_dir()
    lib = (folder / "_lib.lua").read_text()
    body = (folder / f"{name}.lua").read_text()
    return PoolConfig.lua_defaults() + lib + "\n" + body


class Scripts:
    """The registered transitions of one Redis connection, callable by name."""

    def __init__(self, r: redis.Redis) -> None:
        self._r = r
        self._scripts: dict[str, Script] = {n: r.register_script(source(n)) for n in names()}

    def run(self, name: str, prefix: str, args: list[Any], client: Any = None) -> Any:
        """Run script ``name`` on the pool ``prefix``; raise a typed DeviceqError for its error
        replies. ``client`` may be a pipeline."""
        try:
            return self._scripts[name](keys=[prefix], args=args, client=client or self._r)
        except redis.ResponseError as exc:
            typed = from_reply(_strip(str(exc)))
            if typed is not None:
                raise typed from None
            raise


_CODES = error_codes()


def _strip(message: str) -> str:
    # Redis 7 returns the error_reply text verbatim; older servers/fakeredis may wrap it.
    for code in _CODES:
        pos = message.find(code + " ")
        if pos != -1:
            return message[pos:]
    return message
