"""A private ``redis-server`` on a free local port in a temporary directory, for the demo and
the test suites (restart and fault tests need a server of their own)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """Start with ``start()`` (or as a context manager); ``restart()`` keeps port and data
    directory (with ``appendonly=True`` the data survives); ``stop()`` kills it and removes
    the directory. With ``password`` the server requires it (``requirepass``, given in a
    config file, never on the command line) and ``url`` carries it."""

    def __init__(
        self, *, appendonly: bool = False, port: int | None = None, password: str | None = None
    ) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise FileNotFoundError("redis-server is not installed")
        self.port = port or free_port()
        self.appendonly = appendonly
        if password is not None and (not password or any(c in password for c in '"\\\r\n')):
            raise ValueError("password: non-empty, without quotes, backslashes or newlines")
        self.password = password
        self.dir = Path(tempfile.mkdtemp(prefix="deviceq-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        conf = self.dir / "redis.conf"
        conf.write_text(f'requirepass "{self.password}"\n' if self.password else "")
        conf.chmod(0o600)
        args = [
            str(self.binary), str(conf), "--port", str(self.port), "--bind", "127.0.0.1",
            "--dir", str(self.dir), "--save", "", "--daemonize", "no",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec", "--logfile", str(self.dir / "redis.log"),
            "--maxmemory-policy", "noeviction",
        ]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        client = redis.Redis(port=self.port, password=self.password, socket_connect_timeout=0.2)
        try:
            while True:
                try:
                    if client.ping():
                        return self
                except redis.ConnectionError:
                    pass
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not start on port {self.port}")
                time.sleep(0.02)
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL the server (data not yet written to the AOF may be lost)."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self, down_for: float = 0.0) -> None:
        self.kill()
        time.sleep(down_for)
        self.start()

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
