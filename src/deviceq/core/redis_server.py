"""A private ``redis-server`` on a free local port in a temporary directory, for the demo and
the test suites (restart and fault tests need a server of their own), optionally speaking
only TLS; `LocalCluster`: a Redis Cluster of such servers."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .tls import with_tls_files


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _PortTaken(Exception):
    """Another process holds the port the server was to listen on."""


class RedisServer:
    """Start with ``start()`` (or as a context manager); ``restart()`` keeps port and data
    directory (with ``appendonly=True`` the data survives, fsynced as ``appendfsync`` says);
    ``stop()`` kills it and removes the directory. With ``password`` the server requires it
    (``requirepass``, given in a config file, never on the command line) and ``url`` carries
    it.

    TLS: with ``tls_cert_file``, ``tls_key_file`` and ``tls_ca_cert_file`` (PEM files) the
    server listens on ``port`` with TLS only (``--port 0 --tls-port PORT``), ``url`` is
    ``rediss://`` (without files: see ``tls_url``), and ``tls_auth_clients`` says whether a
    client must show a certificate signed by that CA (``"yes"``, ``"optional"``, or ``"no"``,
    the default). Where a client certificate is required, ``tls_client_cert_file`` and
    ``tls_client_key_file`` are the one ``start()`` checks the server with. ``binary`` is
    the ``redis-server`` to run (default: the one on ``PATH``); a build without TLS fails
    to start with the reason from its log."""

    def __init__(
        self,
        *,
        appendonly: bool = False,
        appendfsync: Literal["always", "everysec", "no"] = "everysec",
        port: int | None = None,
        password: str | None = None,
        binary: str | None = None,
        tls_cert_file: str | Path | None = None,
        tls_key_file: str | Path | None = None,
        tls_ca_cert_file: str | Path | None = None,
        tls_auth_clients: Literal["yes", "no", "optional"] = "no",
        tls_client_cert_file: str | Path | None = None,
        tls_client_key_file: str | Path | None = None,
        cluster: bool = False,
    ) -> None:
        self.binary = binary or shutil.which("redis-server")
        if self.binary is None:
            raise FileNotFoundError("redis-server is not installed")
        self._auto_port = port is None
        self._started = False  # (a port of our choosing is kept once it served)
        self.port = port or free_port()
        self.appendonly = appendonly
        if appendfsync not in ("always", "everysec", "no"):
            raise ValueError("appendfsync: always, everysec or no")
        self.appendfsync = appendfsync
        if password is not None and (not password or any(c in password for c in '"\\\r\n')):
            raise ValueError("password: non-empty, without quotes, backslashes or newlines")
        self.password = password
        tls_files = (tls_cert_file, tls_key_file, tls_ca_cert_file)
        if any(tls_files) and not all(tls_files):
            raise ValueError("TLS needs tls_cert_file, tls_key_file and tls_ca_cert_file")
        if tls_auth_clients not in ("yes", "no", "optional"):
            raise ValueError("tls_auth_clients: yes, no or optional")
        if bool(tls_client_cert_file) != bool(tls_client_key_file):
            raise ValueError("tls_client_cert_file and tls_client_key_file go together")
        self.tls = all(tls_files)
        if self.tls and tls_auth_clients == "yes" and not tls_client_cert_file:
            raise ValueError("tls_auth_clients='yes' needs a client certificate to check with")
        self.tls_cert_file, self.tls_key_file, self.tls_ca_cert_file = (
            str(Path(f).resolve()) if f else None for f in tls_files
        )
        self.tls_auth_clients = tls_auth_clients
        self.tls_client_cert_file = str(tls_client_cert_file) if tls_client_cert_file else None
        self.tls_client_key_file = str(tls_client_key_file) if tls_client_key_file else None
        self.cluster = cluster  # a Redis Cluster node (no slots until given some)
        self.bus_port = free_port() if cluster else 0  # its cluster bus (not port + 10000)
        self.dir = Path(tempfile.mkdtemp(prefix="deviceq-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://`` (``rediss://`` with TLS) ``127.0.0.1:PORT/0``, with the password."""
        auth = f":{quote(self.password, safe='')}@" if self.password else ""
        return f"{'rediss' if self.tls else 'redis'}://{auth}127.0.0.1:{self.port}/0"

    @property
    def tls_url(self) -> str:
        """``url`` with the CA (and the client certificate and key, when given) in its query:
        what a deviceq client needs to connect (plain servers: ``url``)."""
        if not self.tls:
            return self.url
        return with_tls_files(
            self.url,
            ca=self.tls_ca_cert_file,
            cert=self.tls_client_cert_file,
            key=self.tls_client_key_file,
        )

    def _tls_args(self) -> list[str]:
        if not self.tls:
            return ["--port", str(self.port)]
        return [
            "--port", "0", "--tls-port", str(self.port),
            "--tls-cert-file", str(self.tls_cert_file), "--tls-key-file", str(self.tls_key_file),
            "--tls-ca-cert-file", str(self.tls_ca_cert_file),
            "--tls-auth-clients", self.tls_auth_clients,
        ]  # fmt: skip

    def _probe(self) -> redis.Redis:
        """A plain redis-py client for the readiness PING (TLS: verified against the CA)."""
        if not self.tls:
            return redis.Redis(port=self.port, password=self.password, socket_connect_timeout=0.2)
        return redis.Redis(
            host="127.0.0.1",
            port=self.port,
            password=self.password,
            socket_connect_timeout=0.5,
            socket_timeout=2.0,
            retry=Retry(NoBackoff(), 0),  # start() polls: no retries (and backoff) per ping
            ssl=True,
            ssl_ca_certs=self.tls_ca_cert_file,
            ssl_certfile=self.tls_client_cert_file,
            ssl_keyfile=self.tls_client_key_file,
        )

    def log_tail(self, lines: int = 5) -> str:
        """The last lines of the server's log (why it did not start)."""
        try:
            text = (self.dir / "redis.log").read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(ln.strip() for ln in text.splitlines()[-lines:] if ln.strip())

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start the server and wait until it answers; ready means the process answering on
        ``port`` is this server (its ``INFO`` ``process_id``), never another one that holds
        the port, and it has loaded its data (``loading:0``: a restarted server with an AOF
        answers most commands ``LOADING`` until then). When the port was chosen here (no
        ``port`` given) and another process took it before the server first started, it
        starts again on another free port."""
        for attempt in range(5):
            try:
                return self._start_once(timeout)
            except _PortTaken:
                if not self._auto_port or self._started or attempt == 4:
                    raise RuntimeError(
                        f"redis-server did not start on port {self.port}: another process "
                        f"holds it (log: {self.log_tail()})"
                    ) from None
                self.port = free_port()
                if self.cluster:
                    self.bus_port = free_port()
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> RedisServer:
        conf = self.dir / "redis.conf"
        conf.write_text(f'requirepass "{self.password}"\n' if self.password else "")
        conf.chmod(0o600)
        logfile = self.dir / "redis.log"
        log_from = logfile.stat().st_size if logfile.exists() else 0
        args = [
            str(self.binary), str(conf), *self._tls_args(), "--bind", "127.0.0.1",
            "--dir", str(self.dir), "--save", "", "--daemonize", "no",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync, "--logfile", str(logfile),
            "--maxmemory-policy", "noeviction",
        ]  # fmt: skip
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                     "--cluster-node-timeout", "2000",
                     "--cluster-port", str(self.bus_port)]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        client = self._probe()
        try:
            while True:
                try:
                    if (
                        int(client.info("server")["process_id"]) == self.proc.pid
                        and int(client.info("persistence").get("loading", 0)) == 0
                    ):
                        self._started = True
                        return self
                except redis.RedisError:  # not up yet (or another server's: ours exits)
                    pass
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    if "Address already in use" in self._log_since(log_from):
                        raise _PortTaken
                    tail = self.log_tail()
                    raise RuntimeError(
                        f"redis-server did not start on port {self.port}"
                        + (f" ({'TLS, ' if self.tls else ''}log: {tail})" if tail else "")
                    )
                time.sleep(0.02)
        finally:
            client.close()

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.dir / "redis.log", "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

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


class LocalCluster:
    """A Redis Cluster of ``n`` private primaries on loopback (tests and benchmarks), each with
    ``replicas`` replicas: the 16,384 slots split evenly over the primaries (nodes
    ``0..n-1``; the replicas of primary ``i`` are nodes ``n + i*replicas ...``), the nodes
    introduced with ``CLUSTER MEET``, ready once every node reports ``cluster_state:ok`` and
    every replica is in sync. A node fails over to its replica ``cluster-node-timeout`` (2 s)
    after it stops answering."""

    SLOTS = 16384

    def __init__(self, n: int = 3, replicas: int = 0) -> None:
        if n < 1 or replicas < 0:
            raise ValueError("a cluster needs at least one primary")
        self.n, self.replicas = n, replicas
        self.nodes = [RedisServer(cluster=True) for _ in range(n * (1 + replicas))]

    def url(self, i: int = 0) -> str:
        return self.nodes[i].url

    def client(self, i: int) -> redis.Redis:
        return redis.Redis(port=self.nodes[i].port, decode_responses=True)

    def node_of(self, key: str) -> int:
        """The index of the primary first given ``key``'s slot."""
        with self.client(0) as r:
            slot = int(r.execute_command("CLUSTER", "KEYSLOT", key))
        return min(slot // (self.SLOTS // self.n), self.n - 1)

    def replicas_of(self, i: int) -> list[int]:
        return [self.n + i * self.replicas + k for k in range(self.replicas)]

    def start(self, timeout: float = 30.0) -> LocalCluster:
        try:
            for node in self.nodes:
                node.start()
            per = self.SLOTS // self.n
            for i in range(self.n):
                hi = self.SLOTS - 1 if i == self.n - 1 else (i + 1) * per - 1
                with self.client(i) as r:
                    r.execute_command("CLUSTER", "ADDSLOTSRANGE", i * per, hi)
            with self.client(0) as r:
                for node in self.nodes[1:]:
                    r.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, node.bus_port)
            deadline = time.monotonic() + timeout
            self._wait(lambda: all(self._known(i) for i in range(len(self.nodes))), deadline)
            for i in range(self.n):
                with self.client(i) as r:
                    primary_id = r.execute_command("CLUSTER", "MYID")
                for j in self.replicas_of(i):
                    with self.client(j) as r:
                        r.execute_command("CLUSTER", "REPLICATE", primary_id)
            self._wait(lambda: all(self._ok(i) for i in range(len(self.nodes))), deadline)
            return self
        except BaseException:
            self.stop()
            raise

    @staticmethod
    def _wait(cond: Callable[[], bool], deadline: float) -> None:
        while not cond():
            if time.monotonic() > deadline:
                raise RuntimeError("the local cluster did not come up")
            time.sleep(0.05)

    def _known(self, i: int) -> bool:
        with self.client(i) as r:
            info = str(r.execute_command("CLUSTER", "INFO"))
        m = re.search(r"cluster_known_nodes:(\d+)", info)
        return m is not None and int(m.group(1)) == len(self.nodes)

    def _ok(self, i: int) -> bool:
        with self.client(i) as r:
            if "cluster_state:ok" not in str(r.execute_command("CLUSTER", "INFO")):
                return False
            if i >= self.n:
                return r.info("replication").get("master_link_status") == "up"
        return True

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
