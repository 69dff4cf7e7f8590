"""Gives fakeredis's embedded Lua what real Redis has and deviceq's scripts use:
``redis.sha1hex`` (host tokens are hashed inside the scripts) and ``cmsgpack.unpack`` (a
script's items arrive packed, `deviceq.core.script_args`). Used by the demo's fakeredis
fallback and the test suites; the real-Redis path is never weakened for it."""

from __future__ import annotations

import hashlib
from typing import Any

_DONE = {"patched": False}


def _sha1hex(value: Any) -> bytes:
    data = value if isinstance(value, bytes) else str(value).encode()
    return hashlib.sha1(data).hexdigest().encode()


def _unpacker(rt: Any) -> Any:
    """``cmsgpack.unpack`` for Lua runtime ``rt``: the first value of a MessagePack string, as
    Redis' cmsgpack gives it (arrays and maps as tables, text as strings, nil as nil); a
    malformed string is a Lua error."""
    import msgpack

    def lua(value: Any) -> Any:
        if isinstance(value, list):
            return rt.table_from({i: lua(v) for i, v in enumerate(value, 1) if v is not None})
        if isinstance(value, dict):
            return rt.table_from({lua(k): lua(v) for k, v in value.items() if v is not None})
        return value

    def unpack(data: Any) -> Any:
        raw = data if isinstance(data, bytes) else str(data).encode()
        unpacker = msgpack.Unpacker(raw=True, strict_map_key=False)
        unpacker.feed(raw)
        try:
            return lua(next(unpacker))
        except StopIteration:
            raise ValueError("Missing bytes in input.") from None

    return unpack


def enable() -> None:
    """Patch fakeredis (once per process) so every Lua runtime it creates has
    ``redis.sha1hex`` and ``cmsgpack.unpack``. A no-op when fakeredis is not installed."""
    if _DONE["patched"]:
        return
    try:
        from fakeredis.commands_mixins.scripting_mixin import ScriptingCommandsMixin
    except ImportError:
        return
    original = ScriptingCommandsMixin._get_server_runtime

    def runtime(self: Any, server: Any) -> Any:
        fresh = not hasattr(server, "_lua_runtime")
        rt = original(self, server)
        if fresh or not getattr(server, "_deviceq_sha1hex", False):
            g = rt.globals()
            g.redis.sha1hex = _sha1hex
            if g.cmsgpack is None:
                g.cmsgpack = rt.table_from({b"unpack": _unpacker(rt)})
                server._lua_expected_globals.update(n for n in g if n in ("cmsgpack", b"cmsgpack"))
            server._deviceq_sha1hex = True
        return rt

    ScriptingCommandsMixin._get_server_runtime = runtime  # type: ignore[method-assign]
    _DONE["patched"] = True
