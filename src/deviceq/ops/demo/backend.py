"""The Redis a demo runs on: a private ``redis-server`` on a free port, an in-process fakeredis
TCP server when no ``redis-server`` binary exists, or a given URL (`start_backend`)."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ...core.redis_server import RedisServer
from ...core.redis_urls import redact_url
from .scenario import EMBEDDED_CHOICES

# -- the embedded Redis ----------------------------------------------------------------------


@dataclass
class Backend:
    """Where the demo's Redis is, and how to stop it."""

    kind: str  # redis-server | fakeredis | external
    url: str
    description: str
    stop: Callable[[], None]


class FakeRedisTcp:
    """An in-process fakeredis server reachable over TCP on 127.0.0.1 (for subprocesses)."""

    def __init__(self) -> None:
        try:
            from fakeredis import TcpFakeServer
        except ImportError as exc:  # fakeredis too old
            raise RuntimeError(
                "the fakeredis fallback needs fakeredis with TcpFakeServer (>= 2.34); "
                "install redis-server or upgrade fakeredis"
            ) from exc
        from ...core import fakeredis_compat

        fakeredis_compat.enable()  # redis.sha1hex, which the scripts use, as real Redis has
        self.server = TcpFakeServer(("127.0.0.1", 0), server_type="redis")
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True,
            name="fakeredis-tcp",
        )  # fmt: skip
        self.thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


def start_backend(embedded: str, redis_url: str | None) -> Backend:
    """Start the demo's Redis: ``redis_url`` if given, else by ``embedded``: ``auto`` (a
    private redis-server when the binary exists, else fakeredis), ``redis-server`` or
    ``fakeredis``."""
    if redis_url:
        shown = redact_url(redis_url)
        return Backend("external", redis_url, f"Redis at {shown}", lambda: None)
    if embedded not in EMBEDDED_CHOICES:
        raise ValueError(f"embedded must be one of {', '.join(EMBEDDED_CHOICES)}")
    if embedded == "redis-server" or (embedded == "auto" and shutil.which("redis-server")):
        server = RedisServer().start()
        return Backend(
            "redis-server", server.url, f"private redis-server on port {server.port}", server.stop
        )
    fake = FakeRedisTcp()
    return Backend("fakeredis", fake.url, f"in-process fakeredis on port {fake.port}", fake.stop)
