"""Gives fakeredis's embedded Lua what real Redis has and deviceq's scripts use:
``redis.sha1hex`` (host tokens are hashed inside the scripts). Used by the demo's fakeredis
fallback and the test suites; the real-Redis path is never weakened for it."""

from __future__ import annotations

import hashlib
from typing import Any

_DONE = {"patched": False}


def _sha1hex(value: Any) -> bytes:
    data = value if isinstance(value, bytes) else str(value).encode()
    return hashlib.sha1(data).hexdigest().encode()


def enable() -> None:
    """Patch fakeredis (once per process) so every Lua runtime it creates has
    ``redis.sha1hex``. A no-op when fakeredis is not installed."""
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
            rt.globals().redis.sha1hex = _sha1hex
            server._deviceq_sha1hex = True
        return rt

    ScriptingCommandsMixin._get_server_runtime = runtime  # type: ignore[method-assign]
    _DONE["patched"] = True
