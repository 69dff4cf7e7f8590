"""TLS (``rediss://``) for every process, against a real ``redis-server`` that speaks TLS only
(``--port 0 --tls-port P``) and requires client certificates (``--tls-auth-clients yes``) and a
password, with a throwaway CA made here by the ``openssl`` command line:

1. a whole task lifecycle through real daemons (``deviceq scheduler run`` and ``deviceq host
   run`` processes given ``--redis-url rediss://... --redis-ca --redis-cert --redis-key``), a
   ``deviceq`` command configured by the environment alone (``DEVICEQ_REDIS_CA`` ...), and the
   Python API (``Client``, ``PoolAdmin``, ``TaskScheduler``, ``HostClient``) by URL query,
   keyword arguments of ``connect`` and the environment;
2. every failure is one line on stderr, exit 1, no traceback, no password or key material: a
   plain ``redis://`` URL against the TLS port, no client certificate, a wrong CA (the
   server's certificate fails verification), a client certificate the server does not trust,
   a missing file, TLS options with a plain URL; the daemons fail at start the same way;
3. in Python the same problems are a ``ConfigError`` (a failed handshake: ``TLSError``, a
   ``ConfigError`` that is also a ``redis.ConnectionError``).

The ``redis-server`` on ``PATH`` is used when it was built with TLS (Debian's and most
distributions' are); when it was not, the ``tls_binary`` fixture installs Debian's package with
``apt-get`` (root) and uses ``/usr/bin/redis-server``, and fails (never skips) when it cannot."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from deviceq import Client, PoolAdmin, TaskStatus
from deviceq.core.connection import connect
from deviceq.core.errors import ConfigError
from deviceq.core.redis_server import RedisServer
from deviceq.core.tls import TLSError, tls_query, with_tls_files
from deviceq.host.redis_link import HostClient
from deviceq.scheduler import TaskScheduler
from harness import CLI, TESTS_PATH, Deployment, free_port, wait_for

PASSWORD = "tls-s3cret-pw"  # the server requires it too: it must never be shown
TLS_ENV = ("DEVICEQ_REDIS_CA", "DEVICEQ_REDIS_CERT", "DEVICEQ_REDIS_KEY")


# -- a throwaway PKI -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Pki:
    """Two CAs: ``ca`` signed the server's and the client's certificates; ``other_ca`` signed
    ``other_client`` (a client the server must refuse) and verifies nothing of ours."""

    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    other_client_cert: Path
    other_client_key: Path
    encrypted_key: Path


def _openssl() -> str:
    """The ``openssl`` binary; installed from Debian's packages if missing."""
    found = shutil.which("openssl")
    if found is None and shutil.which("apt-get") and os.geteuid() == 0:
        subprocess.run(["apt-get", "update", "-qq"], check=False, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "openssl"], check=False,
                       capture_output=True)  # fmt: skip
        found = shutil.which("openssl")
    if found is None:
        pytest.fail("the TLS tests need the openssl command line (apt-get install openssl)")
    return found


def _run(*args: str | Path, cwd: Path) -> None:
    res = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True)
    assert res.returncode == 0, f"{' '.join(map(str, args))}: {res.stderr}"


def _ca(openssl: str, d: Path, name: str) -> tuple[Path, Path]:
    key, crt = d / f"{name}.key", d / f"{name}.crt"
    _run(openssl, "req", "-x509", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
         "-out", crt, "-days", "2", "-subj", f"/CN=deviceq test {name}", cwd=d)  # fmt: skip
    return crt, key


def _leaf(openssl: str, d: Path, name: str, ca: tuple[Path, Path], ext: str) -> tuple[Path, Path]:
    key, csr, crt, extfile = (d / f"{name}.{x}" for x in ("key", "csr", "crt", "ext"))
    extfile.write_text(ext)
    _run(openssl, "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
         "-subj", f"/CN=deviceq {name}", cwd=d)  # fmt: skip
    _run(openssl, "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
         "-out", crt, "-days", "2", "-extfile", extfile, cwd=d)  # fmt: skip
    key.chmod(0o600)
    return crt, key


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    openssl = _openssl()
    d = tmp_path_factory.mktemp("pki")
    ca = _ca(openssl, d, "ca")
    other = _ca(openssl, d, "other-ca")
    san = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
    server = _leaf(openssl, d, "server", ca, san)
    client = _leaf(openssl, d, "client", ca, "extendedKeyUsage=clientAuth\n")
    stranger = _leaf(openssl, d, "stranger", other, "extendedKeyUsage=clientAuth\n")
    enc = d / "client-encrypted.key"
    _run(openssl, "pkey", "-in", client[1], "-aes256", "-passout", "pass:pw", "-out", enc, cwd=d)
    return Pki(d, ca[0], server[0], server[1], client[0], client[1], other[0], stranger[0],
               stranger[1], enc)  # fmt: skip


# -- a redis-server that speaks TLS --------------------------------------------------------------
def _tls_server(binary: str | None, pki: Pki, **kw: Any) -> RedisServer:
    return RedisServer(
        binary=binary,
        password=PASSWORD,
        tls_cert_file=pki.server_cert,
        tls_key_file=pki.server_key,
        tls_ca_cert_file=pki.ca,
        tls_client_cert_file=pki.client_cert,
        tls_client_key_file=pki.client_key,
        **kw,
    )


def _speaks_tls(binary: str, pki: Pki) -> str | None:
    """None if ``binary`` serves TLS, else why not (from its log)."""
    server = _tls_server(binary, pki, tls_auth_clients="yes")
    try:
        server.start(timeout=10)
        return None
    except RuntimeError as exc:
        return str(exc)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def tls_binary(pki: Pki) -> str:
    """A ``redis-server`` built with TLS: the one on PATH, else Debian's, installed here."""
    found = shutil.which("redis-server")
    why = _speaks_tls(found, pki) if found else "redis-server is not installed"
    if why is None and found:
        return found
    debian = "/usr/bin/redis-server"
    if shutil.which("apt-get") and os.geteuid() == 0:
        # Debian builds redis-server with TLS (BUILD_TLS=yes); the package comes from Debian's
        # archive, which is reachable where PyPI is (a source build would need the tarball)
        subprocess.run(["apt-get", "update", "-qq"], check=False, capture_output=True)
        res = subprocess.run(["apt-get", "install", "-y", "-qq", "redis-server"],
                             capture_output=True, text=True)  # fmt: skip
        if res.returncode == 0 and Path(debian).exists():
            why_debian = _speaks_tls(debian, pki)
            if why_debian is None:
                return debian
            why = f"{why}; Debian's redis-server too: {why_debian}"
        else:
            why = f"{why}; apt-get install redis-server failed: {res.stderr.strip()[-300:]}"
    pytest.fail(f"the TLS tests need a redis-server built with TLS: {why}")


@pytest.fixture(scope="module")
def server(tls_binary: str, pki: Pki) -> Iterator[RedisServer]:
    """TLS only, client certificates required, a password."""
    with _tls_server(tls_binary, pki, tls_auth_clients="yes") as s:
        yield s


@pytest.fixture(autouse=True)
def _no_tls_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TLS_ENV:
        monkeypatch.delenv(name, raising=False)


def bare_url(server: RedisServer) -> str:
    """``rediss://:PASSWORD@127.0.0.1:P/0``, no TLS files."""
    return server.url


def tls_args(pki: Pki, *, ca: Path | None = None, cert: bool = True) -> list[str]:
    args = ["--redis-ca", str(ca or pki.ca)]
    if cert:
        args += ["--redis-cert", str(pki.client_cert), "--redis-key", str(pki.client_key)]
    return args


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> Any:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DEVICEQ_")}
    full_env.update({"PYTHONPATH": TESTS_PATH, **(env or {})})
    return subprocess.run([*CLI, *args], capture_output=True, text=True, env=full_env,
                          timeout=timeout, stdin=subprocess.DEVNULL)  # fmt: skip


def assert_one_line(res: Any, *expected: str, secrets: tuple[str, ...] = ()) -> str:
    """Exit 1, one ``error:`` line on stderr holding every ``expected`` text, no traceback, no
    secret."""
    err = res.stderr.strip()
    assert res.returncode == 1, (res.returncode, res.stdout, err)
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("error: "), err
    for text in expected:
        assert text in err, (text, err)
    for secret in (PASSWORD, *secrets):
        assert secret not in err, err
    return err


def key_material(path: Path) -> list[str]:
    """Lines of a PEM key's body: none may ever be printed."""
    return [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("-----")]


# -- the server itself ---------------------------------------------------------------------------
def test_the_server_speaks_tls_only_and_requires_client_certificates(
    server: RedisServer, pki: Pki
) -> None:
    assert server.url.startswith("rediss://") and f":{server.port}/0" in server.url
    ok = redis.Redis.from_url(server.tls_url, socket_timeout=5)  # redis-py itself, by query
    assert ok.ping()
    ok.close()
    once = {"password": PASSWORD, "socket_timeout": 2, "retry": Retry(NoBackoff(), 0)}
    for bad in (
        redis.Redis(port=server.port, **once),  # plain
        redis.Redis(port=server.port, ssl=True, ssl_ca_certs=str(pki.ca), **once),  # no cert
    ):
        with pytest.raises(redis.ConnectionError):
            bad.ping()
        bad.close()


# -- the whole lifecycle through real daemons ----------------------------------------------------
@pytest.mark.slow
def test_task_lifecycle_through_real_daemons_over_mutual_tls(
    server: RedisServer, pki: Pki, pool: str, tmp_path: Path
) -> None:
    """scheduler and host daemons given the TLS files as options, a producer ``Client`` by URL
    query, a ``deviceq`` command by the environment alone."""
    deploy = Deployment(server.tls_url, pool, tmp_path)  # its producer: Client over TLS
    try:
        deploy.configure(lease_ttl=5.0, claim_ttl=5.0, host_timeout=5.0)
        token_file = tmp_path / "h1.token"
        token_file.write_text(deploy.admin.add_host("h1"))
        url = ["--redis-url", bare_url(server), *tls_args(pki)]
        deploy.spawn("scheduler", *url, "scheduler", "run", "--tick", "0.2")
        deploy.spawn("h1", *url, "host", "run", "--host-id", "h1", "--token-file",
                     str(token_file), "--device", "d1:android:wifi", "--device", "d2:android",
                     "--goal-runner", "command", "--command", "sh -c {goal}")  # fmt: skip
        wait_for(lambda: deploy.alive("h1"), 30, "the host daemon's heartbeat over TLS")
        ok = deploy.client.submit("echo hello from $DEVICEQ_DEVICE_ID", driver_type="android",
                                  tags=["wifi"])  # fmt: skip
        bad = deploy.client.submit("echo broken >&2; exit 3")
        t_ok, t_bad = deploy.wait_all([ok, bad], timeout=60)
        assert t_ok.status is TaskStatus.done, t_ok
        assert t_ok.result is not None and "hello from d1" in t_ok.result
        assert t_bad.status is TaskStatus.failed and t_bad.failure_kind == "runner_failed"

        # a deviceq command configured by the environment alone (DEVICEQ_REDIS_CA ...)
        env = {"DEVICEQ_REDIS_URL": bare_url(server), "DEVICEQ_POOL": pool,
               "DEVICEQ_REDIS_CA": str(pki.ca), "DEVICEQ_REDIS_CERT": str(pki.client_cert),
               "DEVICEQ_REDIS_KEY": str(pki.client_key)}  # fmt: skip
        res = run_cli("submit", "echo via env", env=env)
        assert res.returncode == 0, res.stderr
        task_id = res.stdout.strip()
        res = run_cli("task", "wait", task_id, "--timeout", "60", env=env)
        assert res.returncode == 0 and "done" in res.stdout, (res.stdout, res.stderr)
        assert (deploy.client.get(task_id).result or "").strip() == "via env"
        res = run_cli("status", env=env)
        assert res.returncode == 0 and "h1" in res.stdout, res.stderr

        for name in ("scheduler", "h1"):
            assert deploy.procs[name].poll() is None, deploy.log(name)
            log = deploy.log(name)
            assert PASSWORD not in log and not deploy.tokens_in(log)
            assert not any(ln in log for ln in key_material(pki.client_key))
    finally:
        deploy.close()


# -- the Python API ------------------------------------------------------------------------------
def test_python_api_by_url_query_keyword_arguments_and_environment(
    server: RedisServer, pki: Pki, pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the URL query (redis-py's names)
    with Client(server.tls_url, pool) as client:
        task_id = client.submit("over tls", driver_type="android")
        assert client.get(task_id).status is TaskStatus.queued
    # keyword arguments of connect
    r = connect(bare_url(server), ssl_ca_certs=str(pki.ca), ssl_certfile=str(pki.client_cert),
                ssl_keyfile=str(pki.client_key))  # fmt: skip
    assert issubclass(r.connection_pool.connection_class, redis.connection.SSLConnection)
    admin = PoolAdmin(r, pool)
    token = admin.add_host("h1")
    assert Client(r, pool).get(task_id).goal == "over tls"
    # the environment, for every client that is given only the URL
    monkeypatch.setenv("DEVICEQ_REDIS_CA", str(pki.ca))
    monkeypatch.setenv("DEVICEQ_REDIS_CERT", str(pki.client_cert))
    monkeypatch.setenv("DEVICEQ_REDIS_KEY", str(pki.client_key))
    host = HostClient(bare_url(server), pool, "h1", token)
    host.heartbeat([])
    sched = TaskScheduler(bare_url(server), pool)
    sched.assign()
    with PoolAdmin(bare_url(server), pool) as admin2:
        assert admin2.host("h1").alive
    monkeypatch.setenv("DEVICEQ_REDIS_URL", bare_url(server))
    monkeypatch.setenv("DEVICEQ_POOL", pool)
    with Client() as default_client:  # Settings: URL, pool and TLS files from the environment
        assert default_client.get(task_id).status is TaskStatus.queued
    # the URL beats the environment (here: a CA that would fail)
    monkeypatch.setenv("DEVICEQ_REDIS_CA", str(pki.other_ca))
    with Client(server.tls_url, pool) as client:
        assert client.get(task_id).goal == "over tls"
    r.close()


def test_python_api_errors_are_config_errors(
    server: RedisServer, redis_server: RedisServer, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, ca = bare_url(server), str(pki.ca)
    cert, key = str(pki.client_cert), str(pki.client_key)

    def fails(match: str, **kw: Any) -> ConfigError:
        target = kw.pop("url", url)
        with pytest.raises(ConfigError, match=match) as info:
            connect(target, **kw).ping()
        text = str(info.value)
        assert PASSWORD not in text
        assert not any(ln in text for ln in key_material(pki.client_key))
        return info.value

    # files: checked by connect() itself, nothing contacted
    fails("CA bundle .*missing.pem .*does not exist", ssl_ca_certs=str(pki.dir / "missing.pem"))
    fails("CA bundle .* is not a file", ssl_ca_certs=str(pki.dir))
    fails("CA bundle .* holds no PEM certificate", ssl_ca_certs=key)
    fails("client key .* holds no PEM private key", ssl_certfile=cert, ssl_keyfile=cert)
    fails("the key does not belong to the certificate", ssl_certfile=cert,
          ssl_keyfile=str(pki.server_key))  # fmt: skip
    fails("is encrypted", ssl_ca_certs=ca, ssl_certfile=cert, ssl_keyfile=str(pki.encrypted_key))
    fails("needs its client certificate", ssl_ca_certs=ca, ssl_keyfile=key)
    fails("holds no private key", ssl_ca_certs=ca, ssl_certfile=cert)
    fails("ssl_cert_reqs must be one of", ssl_cert_reqs="sometimes")
    fails("need a TLS URL", url=redis_server.url, ssl_ca_certs=ca)
    fails("need a TLS URL", url=redis_server.url + "?ssl_ca_certs=" + ca)
    fails("given twice", url=server.tls_url, ssl_ca_certs=str(pki.other_ca))
    with pytest.raises(ConfigError, match="does not exist"):
        Client(url + "?ssl_ca_certs=/nonexistent/ca.pem", "p")
    monkeypatch.setenv("DEVICEQ_REDIS_CA", "/nonexistent/ca.pem")
    with pytest.raises(ConfigError, match=r"DEVICEQ_REDIS_CA\) does not exist"):
        Client(url, "p")
    # ... but a plain redis:// URL ignores the environment's TLS files
    with Client(redis_server.url, "p") as plain:
        assert plain.redis.ping()
    monkeypatch.delenv("DEVICEQ_REDIS_CA")

    # handshakes: TLSError, a ConfigError and a redis.ConnectionError, not retried for long
    for kw, match in (
        ({"ssl_ca_certs": str(pki.other_ca), "ssl_certfile": cert, "ssl_keyfile": key},
         "certificate of Redis at 127.0.0.1:.* was not accepted"),
        ({"ssl_ca_certs": ca}, "requires a client certificate"),
        ({"ssl_ca_certs": ca, "ssl_certfile": str(pki.other_client_cert),
          "ssl_keyfile": str(pki.other_client_key)}, "refused the client certificate"),
    ):  # fmt: skip
        t0 = time.monotonic()
        err = fails(match, **kw)
        assert isinstance(err, TLSError) and isinstance(err, redis.ConnectionError)
        assert time.monotonic() - t0 < 5, "a certificate problem must not be retried for long"
    # with verification off (ssl_cert_reqs=none) the wrong CA does not matter
    r = connect(url, ssl_ca_certs=str(pki.other_ca), ssl_certfile=cert, ssl_keyfile=key,
                ssl_cert_reqs="none")  # fmt: skip
    assert r.ping()
    r.close()


def test_rediss_against_a_plain_port_fails_fast(redis_server: RedisServer, pki: Pki) -> None:
    """A plain server never answers the TLS handshake: the connect timeout bounds it, not the
    read timeout, and the message says what to check."""
    url = redis_server.url.replace("redis://", "rediss://")
    t0 = time.monotonic()
    with pytest.raises(TLSError, match="did not answer the TLS handshake.*tls-port"):
        connect(url, ssl_ca_certs=str(pki.ca), connect_timeout=1.0, socket_timeout=30).ping()
    assert time.monotonic() - t0 < 10


def test_tls_files_in_the_url_query_round_trip(tmp_path: Path) -> None:
    odd = tmp_path / "my certs+100%" / "ca 1.pem"
    url = with_tls_files("rediss://:p%40ss@h:6380/0?socket_timeout=9", ca=str(odd),
                         cert="c.pem", key="k.pem")  # fmt: skip
    assert url.startswith("rediss://:p%40ss@h:6380/0?socket_timeout=9&ssl_ca_certs=")
    bare, found = tls_query(url)
    assert bare == "rediss://:p%40ss@h:6380/0?socket_timeout=9"
    assert found == {"ssl_ca_certs": str(odd), "ssl_certfile": os.path.abspath("c.pem"),
                     "ssl_keyfile": os.path.abspath("k.pem")}  # fmt: skip
    assert with_tls_files("rediss://h/0") == "rediss://h/0"
    assert with_tls_files(url, ca=str(odd)) == url  # the same file twice is fine
    with pytest.raises(ConfigError, match="given twice"):
        with_tls_files(url, ca="/other/ca.pem")
    with pytest.raises(ConfigError, match="need a TLS URL"):
        with_tls_files("redis://:secret@h/0", ca="ca.pem")


# -- the command line: one line each -------------------------------------------------------------
def test_cli_failures_are_one_line(
    server: RedisServer, redis_server: RedisServer, pki: Pki, pool: str
) -> None:
    url = bare_url(server)
    keys = tuple(key_material(pki.client_key))
    # the good case, for contrast
    res = run_cli("--redis-url", url, *tls_args(pki), "--pool", pool, "task", "list")
    assert res.returncode == 0, res.stderr
    # a plain redis:// URL against the TLS port
    plain = url.replace("rediss://", "redis://")
    res = run_cli("--redis-url", plain, "--pool", pool, "status")
    assert_one_line(res, "cannot reach Redis at redis://:***@127.0.0.1", "use a rediss:// URL")
    # no client certificate where the server requires one
    assert_one_line(run_cli("--redis-url", url, *tls_args(pki, cert=False), "status"),
                    "TLSError", "requires a client certificate", "--redis-cert")  # fmt: skip
    # a wrong CA: the server's certificate fails verification
    err = assert_one_line(
        run_cli("--redis-url", url, *tls_args(pki, ca=pki.other_ca), "task", "list"),
        "TLSError",
        "was not accepted",
        "--redis-ca",
        secrets=keys,
    )
    assert "certificate" in err and "127.0.0.1:" in err
    # a client certificate the server does not trust
    stranger = [
        "--redis-cert",
        str(pki.other_client_cert),
        "--redis-key",
        str(pki.other_client_key),
    ]
    res = run_cli("--redis-url", url, "--redis-ca", str(pki.ca), *stranger, "status")
    assert_one_line(res, "TLSError", "refused the client certificate")
    # files
    assert_one_line(
        run_cli("--redis-url", url, "--redis-ca", str(pki.dir / "nope.pem"), "status"),
        "ConfigError",
        "nope.pem",
        "does not exist",
    )
    assert_one_line(
        run_cli("--redis-url", url, *tls_args(pki)[:4], "--redis-key",
                str(pki.encrypted_key), "status"),
        "ConfigError", "is encrypted", secrets=keys,
    )  # fmt: skip
    assert_one_line(run_cli("--redis-url", redis_server.url, *tls_args(pki), "status"),
                    "--redis-ca/--redis-cert/--redis-key need a TLS URL")  # fmt: skip
    # the environment's files are checked as well (the URL names none)
    env = {"DEVICEQ_REDIS_URL": url, "DEVICEQ_REDIS_CA": str(pki.other_ca)}
    assert_one_line(run_cli("status", env=env), "TLSError", "DEVICEQ_REDIS_CA")


@pytest.mark.slow
def test_daemons_fail_at_start_in_one_line(
    server: RedisServer, pki: Pki, pool: str, tmp_path: Path
) -> None:
    """A TLS failure is never transient: the daemons fail at start (they wait for an
    unreachable Redis)."""
    url = bare_url(server)
    admin = PoolAdmin(server.tls_url, pool)
    token_file = tmp_path / "h.token"
    token_file.write_text(admin.add_host("h"))
    admin.close()
    host = ["host", "run", "--host-id", "h", "--token-file", str(token_file), "--device",
            "d1:android", "--goal-runner", "sim"]  # fmt: skip
    for args, expected in (
        ([*tls_args(pki, ca=pki.other_ca), "scheduler", "run"], "was not accepted"),
        ([*tls_args(pki, cert=False), "scheduler", "run"], "requires a client certificate"),
        ([*tls_args(pki, ca=pki.other_ca), *host], "was not accepted"),
        ([*tls_args(pki, cert=False), *host], "requires a client certificate"),
    ):
        res = run_cli("--redis-url", url, "--pool", pool, *args, timeout=60)
        assert_one_line(res, "TLSError", expected, secrets=(token_file.read_text(),))


def test_redis_server_tls_arguments_are_checked(pki: Pki) -> None:
    with pytest.raises(ValueError, match="TLS needs"):
        RedisServer(tls_cert_file=pki.server_cert)
    with pytest.raises(ValueError, match="needs a client certificate"):
        RedisServer(tls_cert_file=pki.server_cert, tls_key_file=pki.server_key,
                    tls_ca_cert_file=pki.ca, tls_auth_clients="yes")  # fmt: skip
    plain = RedisServer()
    try:
        assert plain.url.startswith("redis://") and plain.tls_url == plain.url
    finally:
        plain.stop()


def test_a_redis_server_without_tls_fails_to_start_with_its_reason(
    pki: Pki, tmp_path: Path
) -> None:
    """What ``tls_binary`` relies on to notice a build without TLS: ``start()`` fails and says
    why (here a stand-in that refuses the TLS options as such a build does)."""
    fake = tmp_path / "redis-server"
    fake.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do case "$a" in --logfile) log=1;; *) [ -n "$log" ] && f="$a" && log=;;'
        " esac; done\n"
        'echo "Bad directive or wrong number of arguments: tls-port" > "$f"\nexit 1\n'
    )
    fake.chmod(0o755)
    server = _tls_server(str(fake), pki, port=free_port())
    with pytest.raises(RuntimeError, match="did not start.*tls-port"):
        server.start(timeout=5)
    server.stop()


def test_connect_takes_paths_and_verify_modes(server: RedisServer, pki: Pki) -> None:
    r = connect(bare_url(server), ssl_ca_certs=pki.ca, ssl_certfile=pki.client_cert,
                ssl_keyfile=pki.client_key, ssl_cert_reqs=ssl.CERT_REQUIRED)  # fmt: skip
    assert r.ping()
    r.close()
    with pytest.raises(ConfigError, match="must be a non-empty string"):
        connect(bare_url(server), ssl_ca_certs=b"/ca.pem")  # type: ignore[arg-type]


def test_a_host_says_why_tls_failed_while_it_retries() -> None:
    """A certificate problem met while running (e.g. a rotated server certificate) is retried
    like any Redis outage, but the host's log line says what to check, not just the type."""
    from deviceq import TLSError
    from deviceq.host.state import unreachable

    exc = TLSError("the server's certificate was not accepted: check the CA bundle (ca=...)")
    assert unreachable(exc) == {"error": "TLSError", "reason": str(exc)}
    assert unreachable(redis.ConnectionError("Connection refused")) == {"error": "ConnectionError"}


@pytest.mark.slow
def test_a_python_host_worker_with_a_wrong_ca_stops_at_start(
    server: RedisServer, pki: Pki, pool: str
) -> None:
    """``HostWorker.run()`` (the Python API, no CLI pre-check) returns the start-refused code
    with one line naming the reason, instead of retrying a TLS failure forever."""
    from deviceq import HostWorker, RunnerSpec, WorkerSettings
    from deviceq.host.state import EXIT_START_REFUSED

    admin = PoolAdmin(server.tls_url, pool)
    token = admin.add_host("h")
    admin.close()
    url = with_tls_files(
        bare_url(server), ca=str(pki.other_ca), cert=str(pki.client_cert), key=str(pki.client_key)
    )
    settings = WorkerSettings("h", ["d1:android"], RunnerSpec("sim"), poll_interval=0.5)
    done: list[int] = []
    worker = HostWorker(url, pool, settings, token)
    t = threading.Thread(target=lambda: done.append(worker.run()), daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():
        worker.stop()
        raise AssertionError("HostWorker.run() still retrying a TLS failure after 30 s")
    assert done == [EXIT_START_REFUSED]
